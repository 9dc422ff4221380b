"""The Arrow data plane: signature types for numpy / pyarrow annotations, and the codec that moves
rows and results as Arrow IPC, exactly (dtype, shape, NaN, ±Inf, -0.0, nulls).

Pure: no I/O except :func:`write_ipc_file` (atomic) and the readers. numpy and pyarrow are
imported inside functions only, so importing this module costs nothing (``%load_ext`` stays fast);
the annotation mapping looks numpy/pyarrow up in ``sys.modules`` (an annotation that names them
means they are already imported).

Signature types (``FunctionParameter.arrow_type`` / ``FunctionOutput.arrow_type``), besides
today's ``bool``, ``int64``, ``float64``, ``utf8``, ``binary`` and ``list<T>`` (docs/ARCHITECTURE.md,
"Arrow data plane"):

=====================================  =======================  ===============================================
annotation                             signature type           Arrow column (one row per call)
=====================================  =======================  ===============================================
``numpy.typing.NDArray[np.float32]``   ``tensor<float32>``      ``struct<data: large_list<float>,
``np.ndarray[Any, np.dtype[T]]``                                shape: list<int64>>`` (variable-shape tensor:
                                                                 C-order values + shape; a 1-D array's data is
                                                                 the ``list<float32>`` itself)
``np.ndarray`` / ``NDArray[Any]``      ``tensor<any>``          same, value type taken from the first row
``pyarrow.Array``                      ``arrow.array``          ``large_list<T>`` (T from the value; rows of
                                                                 one job share T)
``pyarrow.Table``                      ``arrow.table``          ``large_list<struct<columns…>>`` (rows of one
                                                                 job share the schema)
batched ``pyarrow.Array``              ``arrow.value``          the values' own Arrow type (one value per row)
batched ``pyarrow.RecordBatch``        ``arrow.record_batch``   the rows table holds the columns themselves,
                                                                 each ``arrow.value``
=====================================  =======================  ===============================================

A batched function's chunk moves as one value per parameter (docs/ARCHITECTURE.md, "Batched
functions"): :func:`batch_column` encodes a batch (a list, an ``(n, …)`` ndarray, a ``pyarrow.Array``)
as its per-row column and :func:`batch_value` decodes a column back into its form; an ndarray batch
goes to and from a tensor column without per-row Python.

Each IPC stream is one record batch whose fields carry their signature type in the field
metadata (``lancefn.type``), so a reader needs nothing else to decode it.

Over 600 lines: one concern, the Arrow data plane (signature types, rows and results to and from IPC), whose
conversions share the type table; each direction is a few small functions."""

from __future__ import annotations

import os
import sys
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lancefn_jupyter.wire.homefs import fsync_path, replace_atomically

__all__ = [
    "MEDIA_TYPE",
    "SUPPORTED_ANNOTATIONS",
    "DataPlaneError",
    "UnsupportedAnnotation",
    "annotation_type",
    "arrow_type",
    "batch_column",
    "batch_rows",
    "batch_value",
    "column_rows",
    "decode_results",
    "decode_rows",
    "encode_results",
    "encode_rows",
    "is_data_type",
    "read_ipc",
    "rows_from_json",
    "struct_column",
    "struct_fields",
    "summarize",
    "summarize_results",
    "task_fields",
    "to_ipc_bytes",
    "uses_data_plane",
    "write_bytes_file",
    "write_ipc_file",
    "write_stream_file",
]

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
TYPE_KEY = b"lancefn.type"
RESULT_COLUMN = "result"
ERROR_COLUMN = "error"  # skipped rows' {"message", "traceback"} JSON (on_error="skip", "Batched functions")
VALUE_TYPE = "arrow.value"  # a batched pyarrow.Array parameter's per-row type: the values' own Arrow type
RECORD_BATCH_TYPE = "arrow.record_batch"  # a batched pyarrow.RecordBatch parameter: the rows' columns
_SUPPORTED: frozenset = frozenset()  # numpy dtypes of DTYPES, filled on first use (numpy is lazy)
DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)  # fmt: skip
SUPPORTED_ANNOTATIONS = (
    "numpy.ndarray / numpy.typing.NDArray[dtype] (dtype: " + ", ".join(DTYPES) + "), pyarrow.Array, pyarrow.Table"
)


class DataPlaneError(ValueError):
    """A value does not fit its declared type; the message names expected vs actual."""


class UnsupportedAnnotation(ValueError):
    """A numpy / pyarrow annotation that has no signature type; the message says what is supported."""


# ---------------------------------------------------------------------------- annotations


def _dtype_name(scalar: Any, np: Any) -> str:
    if isinstance(scalar, typing.TypeVar) or scalar is typing.Any:
        return "any"
    try:
        name = np.dtype(scalar).name
    except TypeError:
        name = getattr(scalar, "__name__", repr(scalar))
        raise UnsupportedAnnotation(
            f"NDArray[{name}] does not name one dtype; write a concrete one, e.g. NDArray[np.float32]"
        ) from None
    if name.startswith("complex"):
        raise UnsupportedAnnotation(
            f"NDArray[{name}]: Arrow has no complex type; pass or return the real and imaginary parts "
            "(e.g. np.stack([z.real, z.imag])) as a float array"
        )
    if name not in DTYPES:
        raise UnsupportedAnnotation(f"NDArray[{name}]: supported dtypes are {', '.join(DTYPES)}")
    return name


def annotation_type(annotation: Any) -> str | None:
    """The signature type of a numpy / pyarrow annotation; ``None`` when it is neither.

    Raises :class:`UnsupportedAnnotation` for a numpy / pyarrow annotation without a mapping."""
    np = sys.modules.get("numpy")
    if np is not None:
        origin = typing.get_origin(annotation)
        if annotation is np.ndarray:
            return "tensor<any>"
        if origin is np.ndarray:
            args = typing.get_args(annotation)
            dtype = args[1] if len(args) == 2 else typing.Any
            scalar = typing.get_args(dtype)[0] if typing.get_origin(dtype) is np.dtype else typing.Any
            return f"tensor<{_dtype_name(scalar, np)}>"
        if isinstance(annotation, type) and issubclass(annotation, np.generic):
            return None  # numpy scalars: not a data-plane type (today's mapping refuses them)
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(annotation, type):
        if issubclass(annotation, (pa.Table, pa.RecordBatch)):
            return "arrow.table"
        if issubclass(annotation, (pa.Array, pa.ChunkedArray)):
            return "arrow.array"
    return None


def is_data_type(sig_type: str | None) -> bool:
    return sig_type is not None and (sig_type.startswith("tensor<") or sig_type.startswith("arrow."))


def uses_data_plane(input_types: Iterable[str], output_type: str | None) -> bool:
    return any(is_data_type(t) for t in input_types) or is_data_type(output_type)


# ---------------------------------------------------------------------------- describing values


def _describe(value: Any) -> str:
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return f"ndarray of dtype {value.dtype.name} and shape {tuple(value.shape)}"
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(value, (pa.Array, pa.ChunkedArray)):
        return f"pyarrow.Array of type {value.type} and length {len(value)}"
    if pa is not None and isinstance(value, pa.Table):
        return f"pyarrow.Table with schema ({', '.join(f'{f.name}: {f.type}' for f in value.schema)})"
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__


def _expected(sig_type: str) -> str:
    if sig_type.startswith("tensor<"):
        dtype = sig_type[7:-1]
        return "an ndarray" if dtype == "any" else f"an ndarray of dtype {dtype}"
    return {"arrow.array": "a pyarrow.Array", "arrow.table": "a pyarrow.Table"}.get(sig_type, sig_type)


# ---------------------------------------------------------------------------- columns


def arrow_type(sig_type: str) -> Any:
    """The pyarrow type of a plain signature type (`float64`, `utf8`, `list<float64>`, …), or of LanceDB 0.40's
    canonical JSON for a nested type (``{"type": "struct", "fields": [...]}``: docs/ARCHITECTURE.md, "LanceDB 0.40
    dialect"). ValueError for a type it cannot spell."""
    import pyarrow as pa

    if sig_type.startswith("{"):
        import json

        try:
            return _json_type(json.loads(sig_type))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{sig_type!r} is not an Arrow type this server reads ({error})") from None
    if sig_type.startswith("list<") and sig_type.endswith(">"):
        return pa.list_(arrow_type(sig_type[5:-1]))
    if sig_type.startswith("large_list<") and sig_type.endswith(">"):  # LanceDB 0.40's grammar: items not null
        return pa.large_list(pa.field("item", arrow_type(sig_type[11:-1]), nullable=False))
    if sig_type.startswith("fixed_size_list<") and sig_type.endswith(">"):
        item, _, size = sig_type[16:-1].rpartition(", ")
        return pa.list_(pa.field("item", arrow_type(item), nullable=False), int(size))
    named = {"bool": pa.bool_(), "utf8": pa.utf8(), "large_utf8": pa.large_utf8(), "binary": pa.binary()}
    return named.get(sig_type) or pa.type_for_alias(sig_type)


def struct_fields(sig_type: str | None) -> list[str] | None:
    """The field names of a struct signature type (LanceDB 0.40's canonical JSON), or None for any other type."""
    if not sig_type or not sig_type.startswith("{"):
        return None
    import json

    try:
        spec = json.loads(sig_type)
    except ValueError:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "struct" or not isinstance(spec.get("fields"), list):
        return None
    return [str(field.get("name")) if isinstance(field, dict) else "" for field in spec["fields"]]


def struct_column(columns: Mapping[str, Any], sig_type: str, where: str) -> Any:
    """Columns named like a struct type's fields (a LanceDB RecordBatch UDF's columns) packed into one struct column
    of that type, each cast to its field's type; a missing, extra or uncastable column is a :class:`DataPlaneError`
    naming it."""
    import pyarrow as pa

    struct = arrow_type(sig_type)
    names = [field.name for field in struct]
    extra = [name for name in columns if name not in names]
    missing = [name for name in names if name not in columns]
    if missing or extra:
        wrong = f"has no column {missing[0]!r}" if missing else f"has column {extra[0]!r}, which is not a field"
        raise DataPlaneError(f"{where} {wrong}; its RecordBatch has the columns ({', '.join(names)})")
    arrays = []
    for field in struct:
        column = columns[field.name]
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        try:
            column = column if isinstance(column, pa.Array) else pa.array([_plain(v) for v in column])
            arrays.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as error:
            raise DataPlaneError(f"{where}: column {field.name!r} does not cast to {field.type} ({error})") from None
    return pa.StructArray.from_arrays(arrays, fields=list(struct))


def _json_type(spec: Mapping[str, Any]) -> Any:
    """A type of LanceDB 0.40's canonical JSON (``type``; ``fields`` of a struct or list; a fixed size list's
    ``length``)."""
    import pyarrow as pa

    kind = spec["type"]
    fields = [
        pa.field(f["name"], _json_type(f["type"]), nullable=bool(f["nullable"])) for f in spec.get("fields") or ()
    ]
    if kind == "struct":
        return pa.struct(fields)
    if kind in ("list", "large_list", "fixed_size_list"):
        (item,) = fields
        if kind == "fixed_size_list":
            return pa.list_(item, int(spec["length"]))
        return pa.list_(item) if kind == "list" else pa.large_list(item)
    return arrow_type(kind)


def _supported_dtypes(np: Any) -> frozenset:
    return frozenset(np.dtype(name) for name in DTYPES)


def _as_ndarray(value: Any, dtype: str, coerce: bool, where: Any, index: int) -> Any:
    """``value`` as an ndarray of ``dtype``; ``where(index)`` (built only on error) names it."""
    import numpy as np

    if not isinstance(value, np.ndarray):
        if not coerce:
            raise DataPlaneError(f"{where(index)}: expected {_expected(f'tensor<{dtype}>')}, got {_describe(value)}")
        value = np.asarray(value) if dtype == "any" else np.asarray(value, dtype=dtype)
    if dtype != "any" and value.dtype != np.dtype(dtype):  # dtype objects: .name is slow per row
        if not coerce or not np.can_cast(value.dtype, dtype, "same_kind"):
            raise DataPlaneError(f"{where(index)}: expected {_expected(f'tensor<{dtype}>')}, got {_describe(value)}")
        value = value.astype(dtype)
    if value.dtype not in _SUPPORTED:
        raise DataPlaneError(
            f"{where(index)}: {_describe(value)} has no Arrow type; supported dtypes are {', '.join(DTYPES)}"
        )
    return value


def _tensor_column(values: Sequence[Any], dtype: str, coerce: bool, where: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    global _SUPPORTED
    if not _SUPPORTED:
        _SUPPORTED = _supported_dtypes(np)
    arrays = [None if v is None else _as_ndarray(v, dtype, coerce, where, i) for i, v in enumerate(values)]
    present = [a for a in arrays if a is not None]
    if dtype == "any" and present:
        kinds = {a.dtype.name for a in {a.dtype: a for a in present}.values()}
        if len(kinds) > 1:
            raise DataPlaneError(
                f"{where(None)}: the rows' arrays have different dtypes ({', '.join(sorted(kinds))}); "
                "declare NDArray[dtype] or return one dtype"
            )
        dtype = kinds.pop()
    value_type = pa.from_numpy_dtype(np.dtype("float64" if dtype == "any" else dtype))
    flats = [np.ravel(a, order="C") for a in present]  # a view when already C-contiguous
    lengths = [0 if a is None else a.size for a in arrays]
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = (
        flats[0] if len(flats) == 1 else (np.concatenate(flats) if flats else np.empty(0, value_type.to_pandas_dtype()))
    )
    data = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, type=value_type))
    shapes = pa.array([[] if a is None else list(a.shape) for a in arrays], type=pa.list_(pa.int64()))
    mask = pa.array([a is None for a in arrays]) if any(a is None for a in arrays) else None
    return pa.StructArray.from_arrays([data, shapes], names=["data", "shape"], mask=mask)


def _nested_column(values: Sequence[Any], kind: str, coerce: bool, where: Any) -> Any:
    """``arrow.array`` → large_list<T>; ``arrow.table`` → large_list<struct<columns>>."""
    import numpy as np
    import pyarrow as pa

    parts: list[Any] = []
    lengths: list[int] = []
    for i, value in enumerate(values):
        if value is None:
            lengths.append(0)
            continue
        if kind == "arrow.table":
            if isinstance(value, pa.RecordBatch):
                value = pa.Table.from_batches([value])
            elif coerce and not isinstance(value, pa.Table):
                value = pa.table(value) if isinstance(value, Mapping) else pa.Table.from_pylist(list(value))
            if not isinstance(value, pa.Table):
                raise DataPlaneError(f"{where(i)}: expected {_expected(kind)}, got {_describe(value)}")
            part = value.to_struct_array().combine_chunks()
            if value.schema.metadata:
                raise DataPlaneError(
                    f"{where(i)}: a pyarrow.Table with schema metadata cannot be carried; "
                    "drop it with table.replace_schema_metadata(None)"
                )
        else:
            if isinstance(value, pa.ChunkedArray):
                value = value.combine_chunks()
            elif coerce and not isinstance(value, pa.Array):
                value = pa.array(value)
            if not isinstance(value, pa.Array):
                raise DataPlaneError(f"{where(i)}: expected {_expected(kind)}, got {_describe(value)}")
            part = value
        if parts and part.type != parts[0].type:
            raise DataPlaneError(
                f"{where(i)}: {_describe(value)} differs in type from the first row's "
                f"({parts[0].type}); the rows of one job must share it"
            )
        parts.append(part)
        lengths.append(len(part))
    child = pa.concat_arrays(parts) if parts else pa.array([], pa.null())
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    mask = pa.array([v is None for v in values]) if any(v is None for v in values) else None
    return pa.LargeListArray.from_arrays(pa.array(offsets), child, mask=mask)


def encode_column(values: Sequence[Any], sig_type: str, *, coerce: bool, where: Any) -> Any:
    """One Arrow array holding ``values`` (one per row) as ``sig_type``.

    ``coerce``: inputs accept array-likes and same-kind casts (lists → ndarray, float64 →
    float32); results must already be what was declared. ``where(i)`` names row ``i`` in errors."""
    import pyarrow as pa

    if sig_type.startswith("tensor<"):
        return _tensor_column(values, sig_type[7:-1], coerce, where)
    if sig_type in ("arrow.array", "arrow.table"):
        return _nested_column(values, sig_type, coerce, where)
    if sig_type == VALUE_TYPE:
        return _value_column(values, where)
    column_type = arrow_type(sig_type)
    try:
        return pa.array(values, type=column_type)  # plain Python values: no per-item pass first
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    try:
        return pa.array([_plain(v) for v in values], type=column_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as error:
        for i, value in enumerate(values):  # name the offending row
            try:
                pa.array([_plain(value)], type=column_type)
            except Exception:
                raise DataPlaneError(f"{where(i)}: expected {sig_type}, got {_describe(value)} ({error})") from None
        raise DataPlaneError(f"{where(None)}: expected {sig_type} ({error})") from None


def _value_column(values: Any, where: Any) -> Any:
    """``arrow.value``: the values as one Arrow array of their own type (Arrow scalars unwrapped)."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    if isinstance(values, pa.Array):
        return values
    try:
        return pa.array([v.as_py() if isinstance(v, pa.Scalar) else _plain(v) for v in values])
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as error:
        raise DataPlaneError(f"{where(None)}: the values do not make one Arrow array ({error})") from None


def _plain(value: Any) -> Any:
    """numpy scalars / arrays inside today's types become Python values (as the JSON path does)."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def decode_column(column: Any, sig_type: str, *, writable: bool = False) -> list:
    """The Python values of one column (the inverse of :func:`encode_column`).

    Arrays are zero-copy, read-only views of the Arrow buffers unless ``writable`` (one copy of
    the column's values: function arguments, which numba kernels write back into)."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if sig_type.startswith("tensor<"):
        data, shapes = column.flatten()
        offsets = data.offsets.to_numpy()
        flat = data.values.to_numpy(zero_copy_only=False)
        if writable and not flat.flags.writeable:
            flat = flat.copy()
        valid = column.is_valid().to_pylist() if column.null_count else None
        out: list[Any] = []
        for i, shape in enumerate(shapes.to_pylist()):
            if valid is not None and not valid[i]:
                out.append(None)
            else:
                out.append(flat[offsets[i] : offsets[i + 1]].reshape(shape))
        return out
    if sig_type in ("arrow.array", "arrow.table"):
        offsets = column.offsets.to_numpy()
        child = column.values
        out = []
        for i in range(len(column)):
            if not column[i].is_valid:
                out.append(None)
                continue
            part = child.slice(offsets[i], offsets[i + 1] - offsets[i])
            out.append(pa.Table.from_struct_array(part) if sig_type == "arrow.table" else part)
        return out
    return column.to_pylist()


# ---------------------------------------------------------------------------- batches


def _stacked_tensor_column(array: Any) -> Any:
    """An ``(n, …)`` ndarray as the tensor column of its n rows, without per-row Python."""
    import numpy as np
    import pyarrow as pa

    array = np.ascontiguousarray(array)
    n, row_shape = array.shape[0], array.shape[1:]
    size = int(np.prod(row_shape, dtype=np.int64))
    data = pa.LargeListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int64) * size), pa.array(array.reshape(-1)))
    shapes = pa.ListArray.from_arrays(
        pa.array(np.arange(n + 1, dtype=np.int32) * len(row_shape)),
        pa.array(np.tile(np.asarray(row_shape, dtype=np.int64), n), type=pa.int64()),
    )
    return pa.StructArray.from_arrays([data, shapes], names=["data", "shape"])


def batch_column(value: Any, sig_type: str, form: str, *, coerce: bool, where: Any) -> Any:
    """A batch in its ``form`` (``list``: a sequence of the rows' values; ``ndarray``: the rows stacked
    on axis 0; ``arrow``: a ``pyarrow.Array``) as the Arrow column of its rows, one per value.

    ``coerce``: inputs accept array-likes and same-kind casts; results must be what was declared."""
    import numpy as np
    import pyarrow as pa

    if form == "ndarray":
        dtype = sig_type[7:-1]
        global _SUPPORTED
        if not _SUPPORTED:
            _SUPPORTED = _supported_dtypes(np)
        array = _as_ndarray(value, dtype, coerce, lambda _i: where(None), 0)
        if array.ndim == 0:
            raise DataPlaneError(f"{where(None)}: expected an ndarray with the rows on axis 0, got a 0-d array")
        return _stacked_tensor_column(array)
    if form == "arrow":
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        if isinstance(value, pa.Array):
            if not coerce and sig_type and not is_data_type(sig_type):  # a LanceDB batch UDF's output_schema
                _check_arrow_type(value, sig_type, where)
            return value
        if not coerce:
            raise DataPlaneError(f"{where(None)}: expected a pyarrow.Array, got {_describe(value)}")
        return _value_column(value, where)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (Sequence, np.ndarray)):
        raise DataPlaneError(f"{where(None)}: expected a list with one value per row, got {_describe(value)}")
    if not coerce and not isinstance(value, (list, tuple)):
        raise DataPlaneError(f"{where(None)}: expected a list with one value per row, got {_describe(value)}")
    values = list(value)
    return encode_column(values, sig_type, coerce=coerce, where=lambda i: where(i))


def _check_arrow_type(value: Any, sig_type: str, where: Any) -> None:
    """A result array is of its declared plain type (``float64``, ``list<int64>`` ...); a type this module cannot
    spell is left to the reader."""
    try:
        expected = arrow_type(sig_type)
    except (ValueError, KeyError, TypeError):
        return
    if value.type != expected:
        raise DataPlaneError(
            f"{where(None)}: expected a pyarrow.Array of {sig_type} (the declared output type), got one of "
            f"{value.type}; cast it, e.g. pyarrow.compute.cast(result, {sig_type!r})"
        )


def batch_length(value: Any, form: str, where: str) -> int:
    """How many rows a batch in ``form`` holds; a value that is no batch of that form is refused."""
    np = sys.modules.get("numpy")
    pa = sys.modules.get("pyarrow")
    if form == "ndarray":
        if np is None or not isinstance(value, np.ndarray) or value.ndim == 0:
            raise DataPlaneError(
                f"{where}: expected an ndarray with one row per input on axis 0, got {_describe(value)}"
            )
        return int(value.shape[0])
    if form == "arrow":
        if pa is None or not isinstance(value, (pa.Array, pa.ChunkedArray)):
            raise DataPlaneError(f"{where}: expected a pyarrow.Array with one value per row, got {_describe(value)}")
        return len(value)
    if not isinstance(value, (list, tuple)):
        raise DataPlaneError(f"{where}: expected a list with one value per row, got {_describe(value)}")
    return len(value)


def batch_value(column: Any, sig_type: str, form: str, *, writable: bool = False) -> Any:
    """A column of rows as one batch in ``form`` (the inverse of :func:`batch_column`); an ``ndarray``
    batch is the tensor column's buffer reshaped to ``(n, *row_shape)`` when every row has that shape."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if form == "arrow":
        return column
    if sig_type.startswith("tensor<") and pa.types.is_fixed_size_list(column.type):
        # A table's vector column (a backfill's rows): its buffer is already (n, d).
        array = _fixed_size_batch(column, sig_type[7:-1], writable)
        return array if form == "ndarray" else list(array)
    if sig_type.startswith("tensor<") and (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        # A table's column of numbers for a batched NDArray parameter: the chunk's values as one 1-D array.
        if column.null_count:
            raise DataPlaneError("a batched NDArray parameter cannot take missing (null) rows; fill or drop them first")
        values = column.to_numpy(zero_copy_only=False)
        values = values.copy() if writable and not values.flags.writeable else values
        return values if form == "ndarray" else list(values)
    if form != "ndarray":
        return decode_column(column, sig_type, writable=writable)
    import numpy as np

    n = len(column)
    if column.null_count:
        raise DataPlaneError("a batched NDArray parameter cannot take missing (null) rows; fill or drop them first")
    data, shapes = column.flatten()
    shape_offsets = shapes.offsets.to_numpy()
    ndims = np.diff(shape_offsets)
    if n == 0:
        return np.empty((0,), dtype=np.float64 if sig_type == "tensor<any>" else sig_type[7:-1])
    ndim = int(ndims[0])
    dims = shapes.values.to_numpy()[shape_offsets[0] : shape_offsets[-1]]
    if (ndims != ndim).any() or not (dims.reshape(n, ndim) == dims[:ndim]).all():
        raise DataPlaneError(
            "the rows' arrays have different shapes, so they cannot be stacked on axis 0; pass rows of one "
            "shape, or declare the parameter list[NDArray[...]] to get a list of arrays"
        )
    row_shape = tuple(int(d) for d in dims[:ndim])
    offsets = data.offsets.to_numpy()
    flat = data.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    array = flat.reshape((n, *row_shape))
    return array.copy() if writable and not array.flags.writeable else array


def _fixed_size_batch(column: Any, dtype: str, writable: bool) -> Any:
    """A ``fixed_size_list<T>[d]`` column as an ``(n, d)`` ndarray of ``dtype`` (same-kind casts)."""
    import numpy as np

    if column.null_count:
        raise DataPlaneError("a batched NDArray parameter cannot take missing (null) rows; fill or drop them first")
    size = column.type.list_size
    flat = column.flatten().to_numpy(zero_copy_only=False)  # flatten() honours the column's offset
    array = flat.reshape((len(column), size))
    if dtype != "any" and array.dtype != np.dtype(dtype):
        if not np.can_cast(array.dtype, dtype, "same_kind"):
            raise DataPlaneError(f"a column of {column.type} does not cast to NDArray[{dtype}]")
        return array.astype(dtype)
    return array.copy() if writable and not array.flags.writeable else array


def batch_rows(args: Mapping[str, Any], types: Mapping[str, str], forms: Mapping[str, str], *, name: str) -> Any:
    """A batched call's arguments (one batch per parameter) as the rows table of its n rows.

    A ``record_batch`` parameter's ``RecordBatch`` / ``Table`` gives the columns themselves (each
    ``arrow.value``), or for a struct type (a LanceDB RecordBatch UDF) its one struct column; the batches of one call
    must have one length."""
    import pyarrow as pa

    arrays, fields = [], []
    for param, value in args.items():
        sig_type, form = types[param], forms[param]

        def where(i: int | None, param: str = param) -> str:
            return f"parameter {param!r} of {name}" + ("" if i is None else f" (row {i})")

        if form == "record_batch":
            if not isinstance(value, (pa.RecordBatch, pa.Table)):
                raise DataPlaneError(f"{where(None)}: expected a pyarrow.RecordBatch or Table, got {_describe(value)}")
            if sig_type != RECORD_BATCH_TYPE:  # a LanceDB RecordBatch UDF: its columns packed as its struct parameter
                arrays.append(
                    struct_column(dict(zip(value.schema.names, value.columns, strict=True)), sig_type, where(None))
                )
                fields.append(_field(param, arrays[-1], sig_type))
                continue
            for field, column in zip(value.schema, value.columns, strict=True):
                arrays.append(_value_column(column, where))
                fields.append(pa.field(field.name, arrays[-1].type, metadata={TYPE_KEY: VALUE_TYPE.encode()}))
            continue
        array = batch_column(value, sig_type, form, coerce=True, where=where)
        arrays.append(array)
        fields.append(_field(param, array, sig_type))
    lengths = {len(array) for array in arrays}
    if len(lengths) > 1:
        raise DataPlaneError(
            f"the batches given to {name} differ in length ({', '.join(str(n) for n in sorted(lengths))}); "
            "pass one value per row in every batch"
        )
    if not arrays or not lengths.pop():
        raise DataPlaneError(f"{name}() needs a batch of at least one row")
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def task_fields(signature: Mapping[str, Any]) -> dict[str, Any]:
    """The worker protocol's signature fields of a task from a signature's wire form: ``input_types``,
    ``output_type``, for a batched function ``batched: {inputs: {param: form}, output: form}``, and for a
    ``named_struct`` output ``output_fields: {name: nullable}`` and ``output_field_types: {name: type}``."""
    inputs = signature.get("inputs") or ()
    output = signature.get("output") or {}
    fields: dict[str, Any] = {
        "input_types": {p["name"]: p["arrow_type"] for p in inputs},
        "output_type": output.get("arrow_type"),
    }
    if signature.get("batched"):
        fields["batched"] = {"inputs": {p["name"]: p.get("form") for p in inputs}, "output": output.get("form")}
    if output.get("fields"):
        fields["output_fields"] = {f["name"]: f["nullable"] for f in output["fields"]}
        fields["output_field_types"] = {f["name"]: f["arrow_type"] for f in output["fields"]}
    return fields


# ---------------------------------------------------------------------------- rows and results


def _field(name: str, array: Any, sig_type: str) -> Any:
    import pyarrow as pa

    return pa.field(name, array.type, metadata={TYPE_KEY: sig_type.encode()})


def column_rows(param: str, sig_type: str, column: Any) -> Any:
    """A one-parameter rows table made from an Arrow column of its values (no per-row Python), or
    None when the type needs the per-row path (arrays, tables) or the column does not cast to it."""
    import pyarrow as pa

    if is_data_type(sig_type):
        return None
    try:
        array = column.cast(arrow_type(sig_type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError, ValueError):
        return None
    return pa.Table.from_arrays([array], schema=pa.schema([_field(param, array, sig_type)]))


def encode_rows(
    rows: Sequence[Mapping[str, Any]],
    types: Mapping[str, str],
    *,
    name: str = "the function",
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """Rows (``{param: value}``, one per call) → an Arrow table, one column per parameter.

    A parameter no row gives has no column (the worker applies its default); one that only some
    rows give is filled from ``defaults`` in the others."""
    import pyarrow as pa

    arrays, fields = [], []
    for param, sig_type in types.items():

        def where(i: int | None, param: str = param) -> str:
            return f"parameter {param!r} of {name}" + ("" if i is None or len(rows) == 1 else f" (row {i})")

        given = [param in row for row in rows]
        if not any(given):
            continue
        if not all(given) and param not in (defaults or {}):
            raise DataPlaneError(f"{where(given.index(False))} is missing")
        values = [row[param] if param in row else defaults[param] for row in rows]  # type: ignore[index]
        array = encode_column(values, sig_type, coerce=True, where=where)
        arrays.append(array)
        fields.append(_field(param, array, sig_type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields)) if fields else pa.table({"_": [None] * len(rows)})


def _sig_type(field: Any) -> str:
    metadata = field.metadata or {}
    if TYPE_KEY not in metadata:
        raise DataPlaneError(
            f"column {field.name!r} has no {TYPE_KEY.decode()!r} field metadata; encode rows with "
            "lancefn_jupyter.wire.dataplane.encode_rows (or add the parameter's signature type to the field metadata)"
        )
    return metadata[TYPE_KEY].decode()


def decode_rows(table: Any, *, writable: bool = False) -> list[dict]:
    columns = {
        field.name: decode_column(table.column(i), _sig_type(field), writable=writable)
        for i, field in enumerate(table.schema)
        if field.name != "_"
    }
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def rows_from_json(rows: Sequence[Mapping[str, Any]], types: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """JSON rows (today's API) for parameters of data-plane types: lists become ndarrays / Arrow."""
    data = {param: t for param, t in types.items() if is_data_type(t)}
    if not data:
        return list(rows)
    out: list[Mapping[str, Any]] = []
    for row in rows:
        row = dict(row)
        for param, sig_type in data.items():
            value = row.get(param)
            if value is not None:
                (row[param],) = decode_column(
                    encode_column([value], sig_type, coerce=True, where=lambda i, p=param: f"parameter {p!r}"), sig_type
                )
        out.append(row)
    return out


def encode_results(
    values: Sequence[Any] | None,
    sig_type: str,
    *,
    many: bool,
    column: Any = None,
    errors: Sequence[str | None] | None = None,
) -> Any:
    """Results (one per row) → an Arrow table with the ``result`` column; raises :class:`DataPlaneError`
    naming the row, expected and actual type when a value does not match ``sig_type``.

    ``column``: the result column already built (a batched call's); ``errors``: skipped rows'
    ``{"message", "traceback"}`` JSON (None for good rows), a second column ``error``."""
    import pyarrow as pa

    def where(i: int | None) -> str:
        return "the result" + ("" if i is None or not many else f" of row {i}")

    array = column if column is not None else encode_column(values or [], sig_type, coerce=False, where=where)
    arrays, fields = [array], [_field(RESULT_COLUMN, array, sig_type)]
    if errors is not None:
        arrays.append(pa.array(errors, type=pa.utf8()))
        fields.append(_field(ERROR_COLUMN, arrays[-1], "utf8"))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def decode_results(table: Any, form: str | None = None) -> Any:
    """The results of a result table: one value per row, or (``form``: a batched version's output form)
    the batch in that form. A batch with null rows (skipped ones) cannot be one ndarray: a list then."""
    sig_type = _sig_type(table.schema.field(0))
    if form is None or (form == "ndarray" and table.column(0).null_count):
        return decode_column(table.column(0), sig_type)
    return batch_value(table.column(0), sig_type, form)


# ---------------------------------------------------------------------------- IPC


def to_ipc_bytes(table: Any) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_ipc(source: Any) -> Any:
    """An Arrow table from IPC stream bytes / a buffer / a file path (memory-mapped, not copied)."""
    import pyarrow as pa

    if isinstance(source, (str, os.PathLike)):
        source = pa.memory_map(os.fspath(source), "r")
    return pa.ipc.open_stream(source).read_all()


def write_ipc_file(path: str | os.PathLike[str], table: Any, *, durable: bool = True) -> int:
    """Write ``table`` as an IPC stream file atomically (temp file + fsync + rename + dir fsync):
    a reader, or a restart after SIGKILL, sees the whole file or none. Returns its size.
    ``durable=False`` skips the fsyncs (the rename alone is atomic against a killed process):
    for hand-off files consumed at once, where a power cut only costs the job its rows."""
    import pyarrow as pa

    def write(tmp: str) -> None:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)

    return _write_atomic(os.fspath(path), write, durable)


def write_ipc_into(slot: str | os.PathLike[str], path: str | os.PathLike[str], table: Any) -> int:
    """Write ``table`` as an IPC stream into the existing file ``slot`` in place, then rename it to ``path``;
    its size. The slot's memory pages are written over, not freed and allocated again: on a VM that hands
    freed memory back to its host, fresh pages cost ~3 ms per MB (docs/ARCHITECTURE.md, "Result staging").
    The rename makes it atomic like ``write_ipc_file``: a killed writer leaves the slot under its own name."""
    import pyarrow as pa

    def write() -> None:
        with open(slot, "r+b", buffering=0) as raw:  # not "wb": truncating to 0 would free every page
            with pa.ipc.new_stream(pa.PythonFile(raw, mode="w"), table.schema) as writer:
                writer.write_table(table)
            raw.truncate()  # at the end of the stream: a longer earlier result's tail goes

    replace_atomically(os.fspath(slot), os.fspath(path), write)
    return os.path.getsize(path)


def write_bytes_file(path: str | os.PathLike[str], data: bytes, *, durable: bool = True) -> int:
    """Write IPC bytes (e.g. a Ray task's result) atomically, like :func:`write_ipc_file`."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as sink:
            sink.write(data)

    return _write_atomic(os.fspath(path), write, durable)


def write_stream_file(path: str | os.PathLike[str], source: Any, size: int, *, durable: bool = True) -> int:
    """Copy exactly ``size`` bytes from the file object ``source`` (a worker's pipe) into ``path``
    atomically, in 1 MiB chunks (never the whole result in memory). EOFError if it ends early."""

    def write(tmp: str) -> None:
        left = size
        with open(tmp, "wb") as sink:
            while left:
                chunk = source.read(min(left, 1 << 20))
                if not chunk:
                    raise EOFError(f"the stream ended {left} bytes before the {size} announced")
                sink.write(chunk)
                left -= len(chunk)

    return _write_atomic(os.fspath(path), write, durable)


def _write_atomic(path: str, write: Any, durable: bool) -> int:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"

    def fill() -> None:
        write(tmp)
        if durable:
            fsync_path(tmp)

    replace_atomically(tmp, path, fill)
    if durable:
        fsync_path(directory)
    return os.path.getsize(path)


# ---------------------------------------------------------------------------- summaries


def summarize(value: Any, *, nonfinite: bool = True) -> dict:
    """``{type, dtype?, shape?, nbytes?}`` of one value, for widgets and listings (never the data); ``nonfinite``: count
    a float array's NaN/±Inf (a pass over its data, which a map's rows skip)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        summary = {
            "type": "ndarray",
            "dtype": value.dtype.name,
            "shape": list(value.shape),
            "nbytes": int(value.nbytes),
        }
        # Silent NaNs stand out (one pass if all finite).
        if nonfinite and value.dtype.kind == "f" and not np.isfinite(value).all():
            summary["nonfinite"] = {
                "nan": int(np.isnan(value).sum()),
                "inf": int(np.isposinf(value).sum()),
                "-inf": int(np.isneginf(value).sum()),
                "floats": int(value.size),
            }
        return summary
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(value, (pa.Array, pa.ChunkedArray)):
        return {"type": "pyarrow.Array", "dtype": str(value.type), "shape": [len(value)], "nbytes": int(value.nbytes)}
    if pa is not None and isinstance(value, pa.Table):
        return {
            "type": "pyarrow.Table",
            "dtype": ", ".join(f"{f.name}: {f.type}" for f in value.schema),
            "shape": [value.num_rows, value.num_columns],
            "nbytes": int(value.nbytes),
        }
    if isinstance(value, (list, tuple)):
        return {"type": "list", "shape": [len(value)]}
    return {"type": type(value).__qualname__}


def summarize_results(values: Sequence[Any], nbytes: int) -> dict:
    """A job's result summary: the value's summary for one row, ``list`` of N otherwise, whose ``item`` is true of
    every row: a field the rows do not share is left out (``shape_varies`` when their shapes differ), and
    ``items_nbytes`` totals the rows' bytes where each row has a size (docs/ARCHITECTURE.md, "Arrow data plane")."""
    if len(values) == 1:
        return {"nbytes": int(nbytes), **summarize(values[0])}
    items = [summarize(v, nonfinite=False) for v in values]
    summary: dict[str, Any] = {"type": "list", "shape": [len(values)], "nbytes": int(nbytes)}
    if not items:
        return {**summary, "item": {}}
    item = {
        key: items[0][key]
        for key in ("type", "dtype", "shape")
        if key in items[0] and all(i.get(key) == items[0][key] for i in items)
    }
    if "shape" not in item and all("shape" in i for i in items):
        item["shape_varies"] = True
    sizes = [i.get("nbytes") for i in items]
    if all(isinstance(n, int) for n in sizes):
        summary["items_nbytes"] = sum(sizes)
    return {**summary, "item": item}
