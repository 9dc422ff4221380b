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
from typing import Any

from lancefn_jupyter.tables.plan import open_table, sidecar_column
from lancefn_jupyter.tables.types import into_column, into_type

__all__ = ["CommitFailed", "commit_fragment"]

_TOMBSTONE = -2  # a DataFile field id Lance skips (the field lives in a newer file of the fragment)
COMMIT_ATTEMPTS = 20


class CommitFailed(Exception):
    """A commit that cannot succeed by trying again (the fragment is gone, the values do not fit)."""


class _Lost(Exception):
    """The Merge commit was refused (another writer committed first): redo it on the latest version."""


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
        ds.add_columns(pa.schema(missing))
        ds = open_table(ds.uri)
    return ds


def commit_fragment(
    uri: str,
    fragment: int,
    *,
    into: str,
    output_type: str,
    offsets: Any,
    results: Any,
    versions: Any,
) -> int:
    """Write ``results`` (a result column, one value per offset) and ``versions`` (utf8, null for a
    skipped row) at ``offsets`` of ``fragment``; returns the table version committed.

    CommitFailed when it cannot succeed; a commit another writer's got in before is redone first."""
    import pyarrow as pa

    if isinstance(results, pa.ChunkedArray):
        results = results.combine_chunks() if results.num_chunks else pa.array([], results.type)
    last: BaseException | None = None
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            return _commit_once(uri, fragment, into, output_type, offsets, results, versions)
        except _Lost as error:
            last = error.__cause__
            time.sleep(min(0.05 * 2**attempt, 1.0))
    raise CommitFailed(f"fragment {fragment}: {COMMIT_ATTEMPTS} commits failed, the last with: {last}")


def _commit_once(
    uri: str, fragment: int, into: str, output_type: str, offsets: Any, results: Any, versions: Any
) -> int:
    import lance
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from lance.fragment import DataFile, FragmentMetadata, write_fragments

    ds = open_table(uri)
    sidecar = sidecar_column(into)
    target = ds.schema.field(into).type if into in ds.schema.names else into_type(output_type, results)
    try:
        values = into_column(results, output_type, target)
    except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise CommitFailed(f"the results do not fit the into column {into!r} ({target}): {error}") from None
    ds = _ensure_columns(ds, into, target)
    frag = ds.get_fragment(fragment)
    if frag is None:
        raise CommitFailed(
            f"fragment {fragment} is no longer in the table (compacted or deleted since the backfill read it); "
            "run the backfill again to redo its rows"
        )
    meta = frag.metadata
    rows = meta.physical_rows
    current = ds.scanner(columns=[into, sidecar], with_row_address=True, fragments=[frag]).to_table()
    current_offsets = (current.column("_rowaddr").to_numpy() & np.uint64(0xFFFFFFFF)).astype(np.int64)
    # Where each physical row's value comes from: ours, else the table's current one, else null (deleted rows).
    source = np.full(rows, -1, dtype=np.int64)
    source[current_offsets] = np.arange(len(current_offsets))
    source[np.asarray(offsets, dtype=np.int64)] = len(current_offsets) + np.arange(len(offsets))
    take = pa.array(source, mask=source < 0)
    new_into = pc.take(pa.chunked_array([current.column(into).combine_chunks().cast(target), values]), take)
    new_versions = pc.take(pa.chunked_array([current.column(sidecar).combine_chunks(), versions]), take)
    table = pa.table({into: new_into.combine_chunks(), sidecar: new_versions.combine_chunks()})
    written = write_fragments(table, ds, mode="append", max_rows_per_file=max(rows, 1) + 1)
    if len(written) != 1 or len(written[0].files) != 1:
        raise CommitFailed(f"fragment {fragment}: writing the column gave {len(written)} fragments, not one file")
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
