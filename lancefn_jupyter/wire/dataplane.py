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
=====================================  =======================  ===============================================

Each IPC stream is one record batch whose fields carry their signature type in the field
metadata (``lancefn.type``), so a reader needs nothing else to decode it.
"""

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
    "column_rows",
    "decode_results",
    "decode_rows",
    "encode_results",
    "encode_rows",
    "is_data_type",
    "read_ipc",
    "rows_from_json",
    "summarize",
    "summarize_results",
    "to_ipc_bytes",
    "uses_data_plane",
    "write_bytes_file",
    "write_ipc_file",
    "write_stream_file",
]

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
TYPE_KEY = b"lancefn.type"
RESULT_COLUMN = "result"
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
    """The pyarrow type of a plain signature type (`float64`, `utf8`, `list<float64>`, …)."""
    import pyarrow as pa

    if sig_type.startswith("list<") and sig_type.endswith(">"):
        return pa.list_(arrow_type(sig_type[5:-1]))
    return {"bool": pa.bool_(), "utf8": pa.utf8(), "binary": pa.binary()}.get(sig_type) or pa.type_for_alias(sig_type)


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


def encode_results(values: Sequence[Any], sig_type: str, *, many: bool) -> Any:
    """Results (one per row) → a one-column Arrow table; raises :class:`DataPlaneError` naming
    the row, expected and actual type when a value does not match ``sig_type``."""
    import pyarrow as pa

    def where(i: int | None) -> str:
        return "the result" + ("" if i is None or not many else f" of row {i}")

    array = encode_column(values, sig_type, coerce=False, where=where)
    return pa.Table.from_arrays([array], schema=pa.schema([_field(RESULT_COLUMN, array, sig_type)]))


def decode_results(table: Any) -> list:
    return decode_column(table.column(0), _sig_type(table.schema.field(0)))


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


def summarize(value: Any) -> dict:
    """``{type, dtype?, shape?, nbytes?}`` of one value, for widgets and listings (never the data)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        summary = {
            "type": "ndarray",
            "dtype": value.dtype.name,
            "shape": list(value.shape),
            "nbytes": int(value.nbytes),
        }
        if value.dtype.kind == "f" and not np.isfinite(value).all():  # silent NaNs stand out (one pass if all finite)
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
    """A job's result summary: the value's summary for one row, ``list`` of N otherwise."""
    if len(values) == 1:
        return {"nbytes": int(nbytes), **summarize(values[0])}
    first = summarize(values[0]) if values else {}
    return {"type": "list", "shape": [len(values)], "nbytes": int(nbytes), "item": first}
