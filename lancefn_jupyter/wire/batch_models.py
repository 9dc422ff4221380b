"""Wire models of a batch (`/v1/batches/*`, `event: batch`; docs/ARCHITECTURE.md, "Batches")."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from lancefn_jupyter.wire.models import JobState, WireModel, display_state

__all__ = [
    "MAX_RETRIES",
    "STRIP_STATES",
    "BackfillError",
    "Batch",
    "BatchBackfill",
    "BatchChunk",
    "BatchFailure",
    "BatchUsage",
]

MAX_RETRIES = 10  # re-runs of a failed chunk, at most (a batch's and a backfill's `retries`)

# The `strip` letters (one per chunk, in input order) and the state each stands for.
STRIP_STATES = {
    letter: display_state(state)
    for letter, state in zip(
        "prdfc",
        (JobState.PENDING, JobState.IN_PROGRESS, JobState.DONE, JobState.FAILED, JobState.CANCELLED),
        strict=True,
    )
}


class BatchFailure(WireModel):
    """The first chunk that failed after its retries: where, and the chunk job's failure."""

    chunk: int
    row_start: int
    row_end: int
    phase: str = "run"
    message: str = ""
    traceback: str | None = None
    job_id: str | None = None


class BatchChunk(WireModel):
    index: int
    row_start: int
    row_end: int
    state: JobState
    attempts: int = 0
    rows_done: int = 0
    job_id: str | None = None
    failure: dict[str, Any] | None = None


class BatchBackfill(WireModel):
    """What a backfill batch writes and how far it got (docs/ARCHITECTURE.md, "Backfills")."""

    table_uri: str
    table_version: int  # the table version the rows were chosen from
    into: str
    version_column: str  # the sidecar column holding each row's producing function version
    columns: dict[str, str] = Field(default_factory=dict)  # parameter → table column
    where: str | None = None
    recompute: str = "missing"  # "missing" | "stale" | "all"
    on_error: str = "fail"  # "fail" | "skip"
    max_skip_fraction: float = 0.01
    rows_skipped: int = 0
    rows_written: int = 0  # rows committed to the table
    fragments_total: int = 0
    fragments_committed: int = 0
    commit_failure: str | None = None  # why a commit failed for good (the batch is then FAILED)


class BackfillError(WireModel):
    """One row a backfill skipped (``on_error="skip"``): its row id, why, and which version ran it."""

    row_id: int  # the row's address: fragment << 32 | offset
    fragment: int
    offset: int
    message: str
    traceback: str | None = None
    version: str
    chunk: int


class BatchUsage(WireModel):
    """What a batch's ended chunk jobs held and cost so far, and the rows they did (docs/ARCHITECTURE.md, "Cost"):
    the sums of their ``JobUsage``, counted by the server that runs the batch since it took the batch up."""

    held_s: float = 0.0
    gpu_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cost: float | None = None
    currency: str | None = None
    rows: int = 0


class Batch(WireModel):
    """A batch as the server reports it; `chunks` only in describe/wait replies."""

    batch_id: str
    batch_state: JobState
    name: str
    version: str
    input_digest: str
    creation_ms: int
    started_ms: int | None = None
    finished_ms: int | None = None
    parallel: int | None = None
    retries: int = 0
    timeout_s: float | None = None
    rows_total: int = 0
    rows_done: int = 0
    chunks_total: int = 0
    chunk_counts: dict[str, int] = Field(default_factory=dict)
    strip: str = ""
    revision: int = 0
    reused_chunks: int = 0
    cancel_requested: bool = False
    paused: bool = False  # no new chunk starts until it is resumed (docs/ARCHITECTURE.md, "Batches": pause)
    namespace: str | None = None
    failure: BatchFailure | None = None
    chunks: tuple[BatchChunk, ...] | None = None
    backfill: BatchBackfill | None = None  # set when the batch is a backfill of a table column
    usage: BatchUsage | None = None  # spent so far; absent until a chunk job ended
