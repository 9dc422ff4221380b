"""One fragment's ``into`` column (and its version sidecar) committed into a Lance table
(docs/ARCHITECTURE.md, "Backfills", "Commits").

Per fragment: one new data file holding ``into`` and the sidecar for every physical row (the new
values at their offsets, every other row keeps what the table has now), the fragment's older data
files get those fields tombstoned, and one ``LanceOperation.Merge`` commit. Row ids stay, no other
column is rewritten, and LanceDB 0.40 reads the result. A commit that loses a race with another
writer is redone against the latest version; committing the same values again changes nothing, so a
control plane killed around a commit simply redoes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.tables.plan import open_table, sidecar_column
from lancefn_jupyter.tables.types import into_column, into_type

__all__ = ["ChunkPart", "CommitFailed", "commit_fragment", "result_columns"]

_TOMBSTONE = -2  # a DataFile field id Lance skips (the field lives in a newer file of the fragment)
COMMIT_ATTEMPTS = 20
PAGE_BYTES = 8 << 20  # the writer's page buffer per column: bounds what it holds before writing
WINDOW_ROWS = 8192  # physical rows per written batch: the commit's memory is about this many rows' values


class CommitFailed(Exception):
    """A commit that cannot succeed by trying again (the fragment is gone, the values do not fit)."""


class _Lost(Exception):
    """A commit was refused (another writer committed first): redo it on the latest version."""


def _field_ids(field: Any) -> list[int]:
    return [field.id()] + [i for child in field.children() for i in _field_ids(child)]


def _ensure_columns(ds: Any, into: str, target: Any) -> Any:
    """Add ``into`` (of type ``target``) and its sidecar when missing: all-null, metadata only."""
    import pyarrow as pa

    sidecar = sidecar_column(into)
    missing = [pa.field(into, target)] if into not in ds.schema.names else []
    if sidecar not in ds.schema.names:
        missing.append(pa.field(sidecar, pa.utf8()))
    if missing:
        try:
            ds.add_columns(pa.schema(missing))
        except Exception as error:  # a commit of its own, which another writer's may beat (CommitConflictError)
            raise _Lost() from error
        ds = open_table(ds.uri)
    return ds


def result_columns(table: Any) -> tuple[Any, Any]:
    """A chunk's result table → (its result column, its ``error`` column or None), each one array: the
    memory-mapped chunk itself when there is one (no copy)."""

    def one(column: Any) -> Any:
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()

    errors = one(table.column("error")) if "error" in table.column_names else None
    return one(table.column(0)), errors


@dataclass(frozen=True)
class ChunkPart:
    """One chunk's share of a fragment commit: its rows' physical offsets (ascending) and how to load
    its results (the result column, the ``error`` column or None), loaded only when the commit
    reaches them and dropped once past, so a commit holds about one chunk's results at a time."""

    offsets: Any
    load: Callable[[], tuple[Any, Any]]


class _Results:
    """The parts' results and versions by position, in windows, loading each part once in order."""

    def __init__(self, parts: Sequence[ChunkPart], output_type: str, version: str) -> None:
        import numpy as np

        self.parts, self.output_type, self.version = list(parts), output_type, version
        self.bounds = np.cumsum([0] + [len(p.offsets) for p in self.parts])
        self._loaded: dict[int, tuple[Any, Any]] = {}
        self.target: Any = None

    def _part(self, index: int) -> tuple[Any, Any]:
        import pyarrow as pa

        if index not in self._loaded:
            for old in [i for i in self._loaded if i < index]:  # windows only move forward
                del self._loaded[old]
            results, errors = self.parts[index].load()
            if isinstance(results, pa.ChunkedArray):
                results = results.combine_chunks()
            if len(results) != len(self.parts[index].offsets):
                raise CommitFailed(f"a chunk has {len(results)} results for {len(self.parts[index].offsets)} rows")
            self._loaded[index] = (results, errors)
        return self._loaded[index]

    def first(self) -> Any:
        return self._part(0)[0]

    def window(self, start: int, end: int) -> list[tuple[Any, Any]]:
        """Values (of ``target``) and versions (utf8; null for a skipped row) of positions [start, end),
        one piece per chunk part (zero-copy slices of its results when they need no conversion)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        pieces = []
        index = int(np.searchsorted(self.bounds, start, side="right")) - 1
        while start < end:
            results, errors = self._part(index)
            lo, hi = start - self.bounds[index], min(end, self.bounds[index + 1]) - self.bounds[index]
            try:
                values = into_column(results.slice(lo, hi - lo), self.output_type, self.target)
            except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise CommitFailed(f"the results do not fit the into column ({self.target}): {error}") from None
            mine = pa.scalar(self.version, pa.utf8())
            if errors is None:
                versions = pa.repeat(mine, hi - lo)
            else:
                versions = pc.if_else(errors.slice(lo, hi - lo).is_valid(), pa.scalar(None, pa.utf8()), mine)
            pieces.append((values, versions))
            start += hi - lo
            index += 1
        return pieces


def commit_fragment(
    uri: str,
    fragment: int,
    *,
    into: str,
    output_type: str,
    parts: Sequence[ChunkPart],
    version: str,
    window: int = WINDOW_ROWS,
) -> int:
    """Write the parts' results (and ``version`` in the sidecar, null for a skipped row) at their
    offsets of ``fragment``; returns the table version committed.

    CommitFailed when it cannot succeed; a commit another writer's got in before is redone first."""
    last: BaseException | None = None
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return _commit_once(uri, fragment, into, _Results(parts, output_type, version), window)
        except _Lost as error:
            last = error.__cause__
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise CommitFailed(f"fragment {fragment}: {COMMIT_ATTEMPTS} commits failed, the last with: {last}")


def _windows(ds: Any, frag: Any, into: str, results: _Results, offsets: Any, keep_current: bool, window: int) -> Any:
    """The fragment's new ``into`` + sidecar columns as record batches of ``window`` physical rows:
    ours at our offsets, the table's current values elsewhere (none to read when the column is new)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    sidecar = sidecar_column(into)
    rows = frag.metadata.physical_rows
    present = None
    if keep_current and frag.metadata.deletion_file is not None:
        addresses = frag.scanner(columns=[], with_row_address=True).to_table().column("_rowaddr").to_numpy()
        present = (addresses & np.uint64(0xFFFFFFFF)).astype(np.int64)
    for start in range(0, rows, window):
        end = min(start + window, rows)
        i0, i1 = (int(i) for i in np.searchsorted(offsets, [start, end]))
        ours = offsets[i0:i1] - start
        source = np.full(end - start, -1, dtype=np.int64)
        current_into = pa.array([], results.target)
        current_side = pa.array([], pa.utf8())
        if keep_current:
            others = np.ones(end - start, dtype=bool)
            others[ours] = False
            wanted = np.flatnonzero(others) + start
            if present is not None:
                wanted = wanted[np.isin(wanted, present)]
                logical = np.searchsorted(present, wanted)
            else:
                logical = wanted
            if len(wanted):
                current = frag.take(logical, columns=[into, sidecar])
                current_into = current.column(into).combine_chunks().cast(results.target)
                current_side = current.column(sidecar).combine_chunks().cast(pa.utf8())
                source[wanted - start] = np.arange(len(wanted))
        pieces = results.window(i0, i1)
        if len(current_into) == 0 and len(ours) == end - start:
            for values, versions in pieces:  # all ours, in offset order: no copy (the common case)
                yield pa.record_batch([values, versions], names=[into, sidecar])
            continue
        values = pa.concat_arrays([p[0] for p in pieces]) if pieces else pa.array([], results.target)
        versions = pa.concat_arrays([p[1] for p in pieces]) if pieces else pa.array([], pa.utf8())
        source[ours] = len(current_into) + np.arange(len(ours))
        take = pa.array(source, mask=source < 0)
        if len(current_into):
            values, versions = pa.concat_arrays([current_into, values]), pa.concat_arrays([current_side, versions])
        yield pa.record_batch([pc.take(values, take), pc.take(versions, take)], names=[into, sidecar])


def _commit_once(uri: str, fragment: int, into: str, results: _Results, window: int) -> int:
    import lance
    import numpy as np
    import pyarrow as pa
    from lance.fragment import DataFile, FragmentMetadata, write_fragments

    ds = open_table(uri)
    sidecar = sidecar_column(into)
    keep_current = into in ds.schema.names
    results.target = ds.schema.field(into).type if keep_current else into_type(results.output_type, results.first())
    ds = _ensure_columns(ds, into, results.target)
    frag = ds.get_fragment(fragment)
    if frag is None:
        raise CommitFailed(
            f"fragment {fragment} is no longer in the table (compacted or deleted since the backfill read it); "
            "run the backfill again to redo its rows"
        )
    meta = frag.metadata
    rows = meta.physical_rows
    offsets = np.concatenate([np.asarray(p.offsets, dtype=np.int64) for p in results.parts])
    if np.any(np.diff(offsets) <= 0):
        raise CommitFailed(f"fragment {fragment}: the chunks' offsets are not ascending")
    schema = pa.schema([pa.field(into, results.target), pa.field(sidecar, pa.utf8())])
    reader = pa.RecordBatchReader.from_batches(schema, _windows(ds, frag, into, results, offsets, keep_current, window))
    written = write_fragments(
        reader, ds, schema=schema, mode="append", max_rows_per_file=max(rows, 1) + 1, max_page_bytes=PAGE_BYTES
    )
    if len(written) != 1 or len(written[0].files) != 1 or written[0].physical_rows != rows:
        raise CommitFailed(f"fragment {fragment}: writing the column gave {written} for its {rows} rows, not one file")
    new_file = written[0].files[0]
    fields = {f.name(): f for f in ds.lance_schema.fields()}
    ours = set(_field_ids(fields[into])) | set(_field_ids(fields[sidecar]))
    files = []
    for old in meta.files:
        kept = [_TOMBSTONE if i in ours else i for i in old.fields]
        if all(i == _TOMBSTONE for i in kept):
            continue  # every field of it lives in a newer file now
        files.append(
            DataFile(
                old.path,
                kept,
                list(old.column_indices),
                old.file_major_version,
                old.file_minor_version,
                old.file_size_bytes,
            )
        )
    files.append(new_file)
    replaced = FragmentMetadata(
        id=meta.id,
        files=files,
        physical_rows=rows,
        deletion_file=meta.deletion_file,
        row_id_meta=meta.row_id_meta,
        created_at_version_meta=meta.created_at_version_meta,
        last_updated_at_version_meta=meta.last_updated_at_version_meta,
    )
    fragments = [replaced if f.fragment_id == fragment else f.metadata for f in ds.get_fragments()]
    try:
        done = lance.LanceDataset.commit(
            uri, lance.LanceOperation.Merge(fragments, ds.lance_schema), read_version=ds.version
        )
    except Exception as error:  # Lance reports a conflict as OSError / RuntimeError / its own kinds
        raise _Lost() from error
    return int(done.version)
