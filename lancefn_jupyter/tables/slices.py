"""A backfill chunk's rows, read from the table (docs/ARCHITECTURE.md, "Backfills", "Running a chunk").

A slice (``wire.backfill_models.TableSlice``) is the rows at those physical offsets of one fragment, at the table version the plan read (so a later write never changes a chunk's rows).
The rows table has one column per parameter with the data plane's ``lancefn.type`` field metadata,
so the worker reads it as any Arrow job's rows file. Read in the control plane's launch thread
(local executor) or in the Ray worker.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.tables.plan import open_table
from lancefn_jupyter.tables.types import param_column
from lancefn_jupyter.wire import dataplane

if TYPE_CHECKING:  # pydantic only where a slice is parsed (the control plane, the agent, the Ray task)
    from lancefn_jupyter.wire.backfill_models import TableSlice

__all__ = ["read_slice", "slice_ipc", "slice_offsets"]


def slice_offsets(ranges: Sequence[Sequence[int]]) -> Any:
    import numpy as np

    if not ranges:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(start, end, dtype=np.int64) for start, end in ranges])


def _logical(fragment: Any, offsets: Any) -> Any:
    """Physical offsets → the positions ``LanceFragment.take`` wants (it skips deleted rows)."""
    import numpy as np

    if fragment.metadata.deletion_file is None:
        return offsets
    present = fragment.scanner(columns=[], with_row_address=True).to_table().column("_rowaddr").to_numpy()
    present = (present & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return np.searchsorted(present, offsets)


@functools.lru_cache(maxsize=8)
def _pinned(uri: str, version: int) -> Any:
    """A dataset at a version never changes, so one open (its manifest read: ~3 ms) serves every chunk of it."""
    return open_table(uri, version)


def read_slice(table_slice: TableSlice, input_types: Mapping[str, str]) -> Any:
    """The slice's rows table (a ``pyarrow.Table``): parameter columns typed for the data plane."""
    import pyarrow as pa

    ds = _pinned(table_slice.uri, table_slice.table_version)
    fragment = ds.get_fragment(table_slice.fragment)
    if fragment is None:
        raise ValueError(f"fragment {table_slice.fragment} is not in version {table_slice.table_version}")
    columns = table_slice.columns
    # A record_batch function takes the listed columns themselves (docs/ARCHITECTURE.md, "Batched functions").
    by_param = dict(columns) if isinstance(columns, Mapping) else {name: name for name in columns}
    wanted = list(dict.fromkeys(by_param.values()))
    read = fragment.take(_logical(fragment, slice_offsets(table_slice.ranges)), columns=wanted)
    if not isinstance(columns, Mapping):
        struct = [(p, t) for p, t in input_types.items() if dataplane.struct_fields(t) is not None]
        if struct:  # a LanceDB RecordBatch UDF: the listed columns as its struct parameter
            ((param, sig_type),) = struct
            array = dataplane.struct_column({c: read.column(c) for c in wanted}, sig_type, "the table slice")
            field = pa.field(param, array.type, metadata={dataplane.TYPE_KEY: sig_type.encode()})
            return pa.Table.from_arrays([array], schema=pa.schema([field]))
        fields = [pa.field(c, read.column(c).type, metadata={dataplane.TYPE_KEY: b"arrow.value"}) for c in wanted]
        return pa.Table.from_arrays([read.column(c) for c in wanted], schema=pa.schema(fields))
    arrays, fields = [], []
    for param, column in by_param.items():
        sig_type = input_types[param]
        array = param_column(read.column(column), sig_type)
        arrays.append(array)
        fields.append(pa.field(param, array.type, metadata={dataplane.TYPE_KEY: sig_type.encode()}))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def slice_ipc(table_slice: TableSlice, input_types: Mapping[str, str]) -> bytes:
    """The slice's rows as Arrow IPC stream bytes (a Ray task's ``rows_ipc``)."""
    return dataplane.to_ipc_bytes(read_slice(table_slice, input_types))
