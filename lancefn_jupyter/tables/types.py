"""Signature types ↔ a Lance table's column types (docs/ARCHITECTURE.md, "Backfills", "Columns").

Three questions, all about types only (pyarrow imported inside functions): can a table column feed a
parameter (:func:`input_problem`) and how (:func:`param_column`); which Arrow type a new ``into``
column gets (:func:`into_type`) and whether an existing one fits (:func:`into_problem`); and the
result column as the ``into`` column (:func:`into_column`: a tensor struct column →
``fixed_size_list<dt>[d]``, zero-copy from the flat values when every row is 1-D of length d).
"""

from __future__ import annotations

from typing import Any

from lancefn_jupyter.wire import dataplane

__all__ = ["input_problem", "into_column", "into_problem", "into_type", "param_column"]

# Signature types whose rows are the column as it is (batched functions: docs/ARCHITECTURE.md, "Batched functions").
_AS_IS = ("arrow.value", "arrow.record_batch")


def _is_list(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _dtype(sig_type: str) -> str:
    return sig_type[len("tensor<") : -1]


def _casts(source: Any, target: Any) -> bool:
    """Whether values of ``source`` stand for values of ``target``: an Arrow cast exists, and text is
    never parsed into numbers (a utf8 column does not feed an int parameter)."""
    import pyarrow as pa

    def text(t: Any) -> bool:
        return (
            pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        )

    if text(source) != text(target):
        return False
    try:
        pa.array([], source).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return False
    return True


def _is_number(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)


def input_problem(param: str, sig_type: str, column: str, field_type: Any, batched: bool = False) -> str | None:
    """Why the table column cannot feed ``param`` (a sentence with the fix), or None. ``batched``: the function takes a
    chunk per call, so an ndarray parameter may take a column of numbers as one 1-D array (as Ray's ``map_batches``
    and LanceDB's batch UDFs hand it over)."""
    import pyarrow as pa

    where = f"column {column!r} ({field_type}) for parameter {param!r} ({sig_type})"
    if sig_type in _AS_IS:
        return None
    if sig_type.startswith("tensor<") and batched and _is_number(field_type):
        dtype = _dtype(sig_type)
        if dtype != "any" and not _casts(field_type, pa.from_numpy_dtype(_np_dtype(dtype))):
            return f"{where}: its values do not cast to {dtype}; declare NDArray[{field_type}]"
        return None
    if sig_type.startswith("tensor<"):
        dtype = _dtype(sig_type)
        if not _is_list(field_type) or not pa.types.is_primitive(field_type.value_type):
            return (
                f"{where}: an ndarray parameter needs a list or fixed_size_list column of numbers; pick another column"
            )
        if dtype != "any" and not _casts(field_type.value_type, pa.from_numpy_dtype(_np_dtype(dtype))):
            return f"{where}: its values do not cast to {dtype}; declare NDArray[{field_type.value_type}]"
        return None
    if sig_type == "arrow.array":
        return None if _is_list(field_type) else f"{where}: a pyarrow.Array parameter needs a list column"
    if sig_type == "arrow.table":
        return f"{where}: a pyarrow.Table parameter cannot be fed from one column; declare the values' type instead"
    if not _casts(field_type, dataplane.arrow_type(sig_type)):
        return f"{where}: it does not cast to {sig_type}; pick a column of that type or change the annotation"
    return None


def _np_dtype(dtype: str) -> Any:
    import numpy as np

    return np.dtype(dtype)


def param_column(array: Any, sig_type: str) -> Any:
    """A table column's values as the data plane's column for ``sig_type`` (the rows file's column)."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if sig_type in _AS_IS:
        return array
    if sig_type.startswith("tensor<") and _is_number(array.type):  # a batched function's 1-D array of the chunk
        dtype = _dtype(sig_type)
        return array if dtype == "any" else array.cast(pa.from_numpy_dtype(_np_dtype(dtype)))
    if sig_type.startswith("tensor<"):
        return _tensor_from_list(array, _dtype(sig_type))
    if sig_type == "arrow.array":
        return array.cast(pa.large_list(array.type.value_type))
    return array.cast(dataplane.arrow_type(sig_type))


def _tensor_from_list(array: Any, dtype: str) -> Any:
    """list / fixed_size_list rows → the tensor struct column (1-D rows: shape = [length])."""
    import numpy as np
    import pyarrow as pa

    values_type = array.type.value_type if dtype == "any" else pa.from_numpy_dtype(_np_dtype(dtype))
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        lengths = np.where(array.is_valid().to_numpy(zero_copy_only=False), size, 0)
        flat = array.flatten()  # the valid rows' values (null rows' slots are dropped)
    else:
        array = array.cast(pa.large_list(array.type.value_type))
        lengths = np.diff(array.offsets.to_numpy())
        lengths = np.where(array.is_valid().to_numpy(zero_copy_only=False), lengths, 0)
        flat = array.flatten()
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.LargeListArray.from_arrays(pa.array(offsets), flat.cast(values_type))
    shapes = pa.ListArray.from_arrays(
        pa.array(np.arange(len(array) + 1, dtype=np.int32)), pa.array(lengths.astype(np.int64))
    )
    mask = array.is_null() if array.null_count else None
    return pa.StructArray.from_arrays([data, shapes], names=["data", "shape"], mask=mask)


def into_type(output_type: str, results: Any) -> Any:
    """The Arrow type of a new ``into`` column for results of ``output_type`` (``results``: a result
    column, for the types only results tell: a tensor's length d, an ``arrow.*`` value's type)."""
    import pyarrow as pa

    if output_type.startswith("tensor<"):
        data = results.field("data")
        value_type = data.type.value_type
        shapes = [s for s in results.field("shape").to_pylist() if s]
        if not shapes or any(len(s) != 1 for s in shapes) or len({s[0] for s in shapes}) != 1:
            return pa.large_list(value_type)  # not one 1-D length: a variable-length list column
        return pa.list_(value_type, shapes[0][0])
    if dataplane.is_data_type(output_type):
        return results.type
    return dataplane.arrow_type(output_type)


def into_problem(into: str, field_type: Any, output_type: str) -> str | None:
    """Why an existing ``into`` column cannot hold results of ``output_type`` (with the fix), or None."""
    import pyarrow as pa

    fix = f"pick another into= or drop the column {into!r} first"
    if output_type.startswith("tensor<"):
        dtype = _dtype(output_type)
        if not _is_list(field_type):
            return f"into column {into!r} is {field_type}; {output_type} results need a (fixed_size_)list column; {fix}"
        if dtype != "any" and field_type.value_type != pa.from_numpy_dtype(_np_dtype(dtype)):
            return f"into column {into!r} holds {field_type.value_type}, the results are {dtype}; {fix}"
        return None
    if dataplane.is_data_type(output_type):
        return None  # the results' own Arrow type: checked when the first fragment commits
    wanted = dataplane.arrow_type(output_type)
    if field_type == wanted or _same_kind(field_type, wanted):
        return None
    return f"into column {into!r} is {field_type}, the function returns {output_type} ({wanted}); {fix}"


def _same_kind(have: Any, wanted: Any) -> bool:
    """Results that a column of another width of the same kind holds exactly (large_string, float32 …)."""
    import pyarrow as pa

    pairs = (
        (pa.types.is_string, pa.types.is_large_string),
        (pa.types.is_binary, pa.types.is_large_binary),
    )
    if any((a(have) or b(have)) and (a(wanted) or b(wanted)) for a, b in pairs):
        return True
    if pa.types.is_floating(have) and pa.types.is_floating(wanted):
        return True  # a float32 column takes float64 results (cast at commit)
    if _is_list(have) and _is_list(wanted) and not pa.types.is_fixed_size_list(have):
        return have.value_type == wanted.value_type or _same_kind(have.value_type, wanted.value_type)
    return False


def into_column(results: Any, output_type: str, target: Any) -> Any:
    """The result column as values of the ``into`` column's type ``target``."""
    import pyarrow as pa

    if isinstance(results, pa.ChunkedArray):
        results = results.combine_chunks() if results.num_chunks else pa.array([], results.type)
    if output_type.startswith("tensor<"):
        return _tensor_to_list(results, target)
    return results if results.type == target else results.cast(target)


def _tensor_to_list(results: Any, target: Any) -> Any:
    """Tensor struct column → ``target`` (fixed_size_list<dt>[d] or a list type); ValueError when a
    row is not 1-D (or, for a fixed size, not of length d)."""
    import numpy as np
    import pyarrow as pa

    data = results.field("data")
    valid = results.is_valid().to_numpy(zero_copy_only=False)
    lengths = np.diff(data.offsets.to_numpy())
    shapes = results.field("shape")
    dims = np.diff(shapes.offsets.to_numpy())
    if np.any(dims[valid] != 1):
        raise ValueError("a result is not a 1-D array; only 1-D results fit a list column")
    flat = data.values
    offsets = data.offsets.to_numpy()
    if pa.types.is_fixed_size_list(target):
        size = target.list_size
        if np.any(lengths[valid] != size):
            bad = int(lengths[valid][lengths[valid] != size][0])
            raise ValueError(f"a result has {bad} values, the into column holds {size} per row")
        contiguous = valid.all() and offsets[0] == 0 and len(flat) == len(results) * size
        if not contiguous:  # null rows hold no values: each row takes d values from where its own start
            take = np.where(valid[:, None], offsets[:-1, None] + np.arange(size), 0).ravel()
            flat = flat.take(pa.array(take)) if len(flat) else pa.nulls(len(take), flat.type)
        mask = pa.array(~valid) if not valid.all() else None
        return pa.FixedSizeListArray.from_arrays(flat.cast(target.value_type), type=target, mask=mask)
    mask = pa.array(~valid) if not valid.all() else None
    return pa.LargeListArray.from_arrays(pa.array(offsets), flat, mask=mask).cast(target)
