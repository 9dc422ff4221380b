"""Cutting a map's input into chunks and stacking chunk results back (pure; docs/ARCHITECTURE.md, "Batches").

The one place that knows the input's data type:

=========================  =============================  ==========================================
input                      a row is                       results come back as
=========================  =============================  ==========================================
a sequence / iterable      one item                       a list
``numpy.ndarray``          ``array[i]`` (axis 0)          ``numpy`` array stacked on axis 0
``pyarrow.Table``          one table row (dict of cols)   ``pyarrow.Table`` with one ``result`` column
=========================  =============================  ==========================================

Chunks hold the items (not yet rows): the caller turns each item into a row of the function's
signature, so whatever transport the data plane uses for rows applies to chunks too.  numpy and
pyarrow are only touched when the input already is one of theirs (they are imported by then).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BATCHED_CHUNK_ROWS", "Split", "auto_chunk_size", "cut", "input_kind", "split", "stack"]

# "auto" cuts the input into this many chunks per parallel slot, so a slow chunk does not leave
# the other GPUs idle at the end (and a failure re-runs a small share).
CHUNKS_PER_SLOT = 4


@dataclass(frozen=True)
class Split:
    kind: str  # "list" | "numpy" | "arrow"
    chunks: tuple[list, ...]  # items per chunk, in input order
    bounds: tuple[tuple[int, int], ...]  # [row_start, row_end) per chunk

    @property
    def rows_total(self) -> int:
        return self.bounds[-1][1] if self.bounds else 0


def input_kind(items: Any) -> str:
    np = sys.modules.get("numpy")
    pa = sys.modules.get("pyarrow")
    if np is not None and isinstance(items, np.ndarray):
        return "numpy"
    if pa is not None and isinstance(items, (pa.Table, pa.RecordBatch)):
        return "arrow"
    return "list"


# A batched function's default chunk: this many rows per call (docs/ARCHITECTURE.md, "Batched functions").
BATCHED_CHUNK_ROWS = 1024


def auto_chunk_size(rows: int, slots: int, *, batched: bool = False) -> int:
    """About CHUNKS_PER_SLOT chunks per slot; a batched function's chunks at most BATCHED_CHUNK_ROWS."""
    size = max(1, math.ceil(rows / max(1, slots * CHUNKS_PER_SLOT)))
    return min(size, BATCHED_CHUNK_ROWS) if batched else size


def split(items: Any, chunk_size: int | None, *, slots: int = 1, batched: bool = False) -> Split:
    """Cut ``items`` into chunks of ``chunk_size`` rows (``None``: about CHUNKS_PER_SLOT per slot, at
    most BATCHED_CHUNK_ROWS for a ``batched`` function)."""
    kind = input_kind(items)
    if kind == "numpy":
        if items.ndim == 0:
            raise ValueError("map() over a 0-d numpy array: pass an array with rows on axis 0")
        rows: Sequence[Any] = list(items)
    elif kind == "arrow":
        rows = items.to_pylist()
    elif isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"map() takes a sequence, a numpy array or a pyarrow Table of inputs, not {type(items).__name__}"
        )
    else:
        rows = items if isinstance(items, Sequence) else list(items)
    bounds = cut(len(rows), chunk_size, slots=slots, batched=batched)
    return Split(kind, tuple(list(rows[a:b]) for a, b in bounds), bounds)


def cut(n: int, chunk_size: int | None, *, slots: int = 1, batched: bool = False) -> tuple[tuple[int, int], ...]:
    """The ``[row_start, row_end)`` of each chunk of ``n`` rows (the rule of :func:`split`)."""
    if n == 0:
        raise ValueError("map() needs at least one item; the input is empty")
    if chunk_size is None:
        chunk_size = auto_chunk_size(n, slots, batched=batched)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a whole number of rows ≥ 1, or None to choose one; got {chunk_size!r}")
    if chunk_size > n:
        raise ValueError(f"chunk_size={chunk_size} is larger than the input ({n} rows); pass chunk_size ≤ {n} or None")
    return tuple((start, min(start + chunk_size, n)) for start in range(0, n, chunk_size))


def stack(kind: str, chunk_results: Sequence[Any]) -> Any:
    """Chunk results (in input order) back as one value of the input's kind."""
    if kind == "numpy":
        import numpy as np

        parts = [np.asarray(part) for part in chunk_results]
        return np.concatenate(parts) if parts else np.asarray([])
    if kind == "arrow":
        import pyarrow as pa

        tables = [part if isinstance(part, pa.Table) else pa.table({"result": list(part)}) for part in chunk_results]
        return pa.concat_tables(tables)
    out: list = []
    for part in chunk_results:
        if hasattr(part, "to_pylist"):
            out.extend(part.to_pylist())
        else:  # an ndarray part (a batched function's) gives its rows, as a per-row function's list would
            out.extend(list(part))
    return out
