"""Which rows a backfill runs, and how they are cut (docs/ARCHITECTURE.md, "Backfills", "Which rows").

One scan of the table at its current version with the filter (``recompute`` + ``where=``) and
``with_row_address``: row addresses (fragment << 32 | physical offset) grouped by fragment, cut into
chunks of ``chunk_size`` rows that never cross a fragment, each stored as offset ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Plan", "PlanSource", "TableError", "open_table", "plan_rows", "sidecar_column", "slice_rows"]


class TableError(ValueError):
    """The table, a column or the filter is not what a backfill needs; the message says what to change."""


def sidecar_column(into: str) -> str:
    """The column holding each row's producing function version ("Version sidecar")."""
    return f"{into}__lancefn_version"


def open_table(uri: str, version: int | None = None) -> Any:
    """The Lance dataset at ``uri`` (at ``version``), or TableError saying what ``uri`` must be."""
    import lance

    try:
        return lance.dataset(uri, version=version)
    except Exception as error:  # Lance raises several kinds (ValueError, OSError, its own) for a bad URI
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TableError(
            f"table_uri {uri!r} is not a Lance dataset ({first[:300]}); pass the table's directory, "
            "e.g. LanceTable.uri (…/<name>.lance)"
        ) from None


@dataclass(frozen=True)
class Plan:
    table_version: int
    fragments: dict[int, int]  # fragment id → the chunks' row count in it
    chunks: list[dict] = field(default_factory=list)  # {fragment, ranges: [[start, end), …]}

    @property
    def rows_total(self) -> int:
        return sum(self.fragments.values())


class PlanSource:
    """A table opened for a backfill's plan: its schema and version, and its rows planned at that same version
    (in the control plane, or in the table agent that opens it with a team's rights)."""

    def __init__(self, uri: str, version: int | None = None) -> None:
        self.ds = open_table(uri, version)
        self.schema, self.version = self.ds.schema, int(self.ds.version)

    def plan(self, *, into: str, version: str, recompute: str, where: str | None, chunk_size: int) -> Plan:
        return plan_rows(self.ds, into=into, version=version, recompute=recompute, where=where, chunk_size=chunk_size)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _column(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def row_filter(ds: Any, into: str, version: str, recompute: str, where: str | None) -> str | None:
    """The scan filter: which rows ``recompute`` redoes (none of it when ``into`` is new), and ``where``."""
    names = set(ds.schema.names)
    sidecar = sidecar_column(into)
    base = None
    if recompute != "all" and into in names:
        base = f"{_column(into)} IS NULL"
        if recompute == "stale" and sidecar in names:
            # Rows another version wrote; rows written outside lancefn (no sidecar value) are kept.
            base = f"({base} OR ({_column(sidecar)} IS NOT NULL AND {_column(sidecar)} != {_quote(version)}))"
    if where:
        return f"({base}) AND ({where})" if base else f"({where})"
    return base


def plan_rows(ds: Any, *, into: str, version: str, recompute: str, where: str | None, chunk_size: int) -> Plan:
    """The rows to run, cut into chunks inside fragments; TableError for a filter Lance refuses."""
    import numpy as np

    flt = row_filter(ds, into, version, recompute, where)
    try:
        scan = ds.scanner(columns=[], filter=flt, with_row_address=True, scan_in_order=True).to_table()
    except Exception as error:  # Lance raises several kinds for a bad filter (ValueError, OSError, …)
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TableError(f"where={where!r} is not a filter the table accepts ({message[:300]}); fix the SQL") from None
    addresses = np.sort(scan.column("_rowaddr").to_numpy().astype(np.uint64))
    fragments_of = (addresses >> np.uint64(32)).astype(np.int64)
    offsets = (addresses & np.uint64(0xFFFFFFFF)).astype(np.int64)
    chunks: list[dict] = []
    counts: dict[int, int] = {}
    for fragment in np.unique(fragments_of):
        mine = offsets[fragments_of == fragment]
        counts[int(fragment)] = len(mine)
        for start in range(0, len(mine), chunk_size):
            chunks.append({"fragment": int(fragment), "ranges": _ranges(mine[start : start + chunk_size])})
    return Plan(table_version=ds.version, fragments=counts, chunks=chunks)


def _ranges(offsets: Any) -> list[list[int]]:
    """Sorted offsets → ``[[start, end), …]`` runs of consecutive offsets."""
    import numpy as np

    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [len(offsets)]))
    return [[int(offsets[s]), int(offsets[e - 1]) + 1] for s, e in zip(starts, ends, strict=True)]


def slice_rows(ranges: Sequence[Sequence[int]]) -> int:
    """How many rows a slice's ranges hold."""
    return sum(end - start for start, end in ranges)
