"""Wire models of a batch (`/v1/batches/*`, `event: batch`; docs/ARCHITECTURE.md, "Batches")."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from lancefn_jupyter.wire.models import JobState, WireModel, display_state

__all__ = ["STRIP_STATES", "Batch", "BatchChunk", "BatchFailure"]

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
    namespace: str | None = None
    failure: BatchFailure | None = None
    chunks: tuple[BatchChunk, ...] | None = None
