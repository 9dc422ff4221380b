"""A batch's state in memory and its wire form: pure (no store, no lock, no events).
``manager.BatchManager`` drives it; ``store.BatchStore`` saves and loads it
(docs/ARCHITECTURE.md, "Batches")."""

from __future__ import annotations

import collections
import hashlib
from dataclasses import dataclass, field
from typing import Any

from lancefn_jupyter.server.control.rows import check_rows
from lancefn_jupyter.server.control.states import CANCELLED, DONE, FAILED, IN_PROGRESS, PENDING, TIMED_OUT
from lancefn_jupyter.server.encoding import checked_json
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.wire.batch_models import MAX_RETRIES
from lancefn_jupyter.wire.models import FunctionVersion

MAX_CHUNKS = 100_000
# Phases in which a chunk's worker failed before running a row: executing the module or setup()
# (docs/ARCHITECTURE.md, "Warm state"); "import" is that phase's name on workers before warm state.
SETUP_PHASES = ("setup", "import")
GIVEN_UP = (FAILED, CANCELLED, TIMED_OUT)  # a chunk in one of these does not finish in this run of the batch
# One letter per chunk in the wire's `strip` (compact enough for 100k chunks in one event).
STRIP_LETTER = {PENDING: "p", IN_PROGRESS: "r", DONE: "d", FAILED: "f", CANCELLED: "c", TIMED_OUT: "f"}


@dataclass
class Chunk:
    idx: int
    row_start: int
    row_end: int
    state: str = PENDING
    job_id: str | None = None
    attempts: int = 0
    rows_done: int = 0
    failure: dict | None = None

    @property
    def rows(self) -> int:
        return self.row_end - self.row_start


@dataclass
class BatchRun:
    """A batch as the control plane runs it, in memory (its wire form is ``wire.batch_models.Batch``; the
    notebook's handle, ``kernel.handles.batch.Batch``)."""

    batch_id: str
    name: str
    version: str
    digest: str
    state: str
    parallel: int | None
    retries: int
    timeout_s: float | None
    creation_ms: int
    chunks: list[Chunk]
    namespace: str | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    cancel_requested: bool = False
    reused_chunks: int = 0
    revision: int = 0  # bumps on every change (in memory): `batches/wait` waits for a newer one
    waiting: collections.deque = field(default_factory=collections.deque)  # chunk idx not yet submitted
    live: set = field(default_factory=set)  # chunk idx with a pending/running job
    counts: collections.Counter = field(default_factory=collections.Counter)  # chunk state → count
    rows_finished: int = 0  # rows of DONE chunks
    backfill: Any = None  # a backfill's BackfillRun (server/batches/backfill.py); None for a plain batch
    # Paused (docs/ARCHITECTURE.md, "Batches": pause): no chunk starts; running ones finish and are kept. Saved in spec.
    paused: bool = False
    init: dict | None = None  # a class entry's initialization values for every chunk ("Warm state"); saved in spec
    # What its ended chunk jobs held and cost, and the rows they did ("Cost"); saved with each chunk that ends
    spent: dict = field(default_factory=dict)

    def add_spent(self, usage: dict, rows: int) -> None:
        """An ended chunk job's usage (``Reports.job_usage``) and the rows it did, into ``spent``."""
        for key in ("held_s", "gpu_seconds", "cpu_seconds", "cost"):
            if key in usage:
                self.spent[key] = self.spent.get(key, 0.0) + usage[key]
        if "currency" in usage:
            self.spent["currency"] = usage["currency"]
        self.spent["rows"] = self.spent.get("rows", 0) + rows

    @property
    def rows_total(self) -> int:
        return self.chunks[-1].row_end if self.chunks else 0

    def add_chunk(self, chunk: Chunk) -> None:
        self.chunks.append(chunk)
        self.counts[chunk.state] += 1
        if chunk.state == DONE:
            chunk.rows_done = chunk.rows
            self.rows_finished += chunk.rows

    def move(self, chunk: Chunk, state: str) -> None:
        """``chunk`` is now in ``state``: the counts and finished rows follow."""
        self.counts[chunk.state] -= 1
        self.counts[state] += 1
        if state == DONE:
            self.rows_finished += chunk.rows
        elif chunk.state == DONE:
            self.rows_finished -= chunk.rows
        chunk.state = state

    def live_jobs(self) -> list[str]:
        """The job ids of the chunks with a pending or running job, in chunk order."""
        return [job_id for idx in sorted(self.live) if (job_id := self.chunks[idx].job_id) is not None]

    def setup_failed(self) -> bool:
        """Whether a chunk of this batch has failed its setup (the batch's chunk failures are durable,
        so this holds across restarts; a retry of the batch clears them)."""
        return any(c.failure is not None and c.failure.get("phase") in SETUP_PHASES for c in self.chunks)

    def outcome(self) -> str:
        """The state of a batch with no chunk left to run."""
        if self.cancel_requested:
            return CANCELLED
        if self.backfill is not None and self.backfill.failure is not None:
            return FAILED  # the skip limit or a commit that failed for good
        return FAILED if self.counts[FAILED] or self.counts[CANCELLED] else DONE

    def spec(self) -> dict:
        """What the ``batches.spec`` column keeps."""
        spec: dict[str, Any] = {
            "parallel": self.parallel,
            "retries": self.retries,
            "rows_total": self.rows_total,
            "chunks_total": len(self.chunks),
        }
        if self.timeout_s is not None:
            spec["timeout_s"] = self.timeout_s
        if self.paused:
            spec["paused"] = True
        if self.init is not None:
            spec["init"] = self.init
        return spec


# ------------------------------------------------------------------------- input


def check_request(chunks: Any, parallel: int | None, retries: int) -> None:
    if not isinstance(chunks, list) or not chunks:
        raise ApiError(400, "chunks must be a non-empty list of chunks, each a non-empty list of rows")
    if len(chunks) > MAX_CHUNKS:
        raise ApiError(400, f"{len(chunks)} chunks is more than the limit of {MAX_CHUNKS}; pass a larger chunk_size")
    check_options(parallel, retries)


def check_options(parallel: int | None, retries: int) -> None:
    if parallel is not None and parallel < 1:
        raise ApiError(400, "parallel must be ≥ 1, or null for as many as the class has GPUs ('auto')")
    if not 0 <= retries <= MAX_RETRIES:
        raise ApiError(400, f"retries must be between 0 and {MAX_RETRIES}")


def check_chunks(fv: FunctionVersion, chunks: list) -> list:
    """Every row fits the signature (the message names chunk and row); returns each chunk's JSON.
    Fast path: the parameter names per row and one JSON encoding per chunk; ``rows.check_rows``
    only to name a problem."""
    if all(isinstance(rows, bytes) for rows in chunks):
        return chunks  # Arrow chunks: checked as one stream against the signature already
    wanted = {p.name for p in fv.signature.inputs}
    encoded = []
    for i, rows in enumerate(chunks):
        try:
            if isinstance(rows, list) and rows and all(type(row) is dict and row.keys() == wanted for row in rows):
                text = checked_json(rows)
                text.encode("utf-8")  # lone surrogates
                encoded.append(text)
                continue
        except (TypeError, ValueError):
            pass
        try:
            check_rows(fv, rows)
        except ApiError as error:
            raise ApiError(400, f"chunks[{i}]: {error.message}") from None
        raise ApiError(400, f"chunks[{i}] cannot be stored as JSON; send rows of JSON values")  # pragma: no cover
    return encoded


def cut(chunks: list) -> list[Chunk]:
    """The chunks' row ranges, in order (a chunk is a list of rows or one Arrow IPC stream)."""
    cut, start = [], 0
    for i, rows in enumerate(chunks):
        count = arrow_rows_count(rows) if isinstance(rows, bytes) else len(rows)
        cut.append(Chunk(i, start, start + count))
        start += count
    return cut


def input_digest(encoded_chunks: list) -> str:
    """What makes two maps "the same input": the rows and how they are cut (chunk boundaries).
    Over each chunk's JSON (or Arrow IPC bytes) as sent (a client builds rows in signature order,
    so the same map encodes the same; a differently ordered row only misses a reuse)."""
    digest = hashlib.sha256()
    for text in encoded_chunks:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return "sha256:" + digest.hexdigest()


def split_arrow_chunks(path: Any) -> list[bytes]:
    """An Arrow IPC stream of one record batch per chunk → each chunk as its own IPC stream
    (the rows of one chunk job, stored as a BLOB in ``batch_chunks.rows``)."""
    import pyarrow as pa

    from lancefn_jupyter.wire.dataplane import to_ipc_bytes

    reader = pa.ipc.open_stream(pa.memory_map(str(path), "r"))
    return [to_ipc_bytes(pa.Table.from_batches([part])) for part in reader if part.num_rows]


def arrow_rows_count(data: bytes) -> int:
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all().num_rows


# -------------------------------------------------------------------------- wire


def batch_wire(batch: BatchRun, *, include_chunks: bool) -> dict:
    """The Batch wire form (docs/ARCHITECTURE.md, "Batches")."""
    rows_running = sum(batch.chunks[i].rows_done for i in batch.live) if batch.live else 0
    counts = {
        state: batch.counts[state] for state in (PENDING, IN_PROGRESS, DONE, FAILED, CANCELLED) if batch.counts[state]
    }
    wire: dict[str, Any] = {
        "batch_id": batch.batch_id,
        "batch_state": batch.state,
        "name": batch.name,
        "version": batch.version,
        "input_digest": batch.digest,
        "creation_ms": batch.creation_ms,
        "parallel": batch.parallel,
        "retries": batch.retries,
        "rows_total": batch.rows_total,
        "rows_done": batch.rows_finished + rows_running,
        "chunks_total": len(batch.chunks),
        "chunk_counts": counts,
        "strip": "".join(STRIP_LETTER[c.state] for c in batch.chunks),
        "revision": batch.revision,
    }
    optional = {
        "namespace": batch.namespace,
        "timeout_s": batch.timeout_s,
        "started_ms": batch.started_ms,
        "finished_ms": batch.finished_ms,
    }
    wire.update((key, value) for key, value in optional.items() if value is not None)  # unset: left out, not null
    if batch.reused_chunks:
        wire["reused_chunks"] = batch.reused_chunks
    if batch.spent:
        wire["usage"] = {k: round(v, 6) if isinstance(v, float) else v for k, v in batch.spent.items()}
    if batch.cancel_requested:
        wire["cancel_requested"] = True
    if batch.paused and batch.state not in (DONE, FAILED, CANCELLED):
        wire["paused"] = True
    failed_chunks = [c for c in batch.chunks if c.state in (FAILED, TIMED_OUT)]
    # A failed setup is the batch's failure when there is one: it is why the batch stopped.
    failed = next(
        (c for c in failed_chunks if c.failure and c.failure.get("phase") in SETUP_PHASES),
        failed_chunks[0] if failed_chunks else None,
    )
    own = batch.backfill.failure if batch.backfill is not None else None
    if own is not None:  # the backfill's own reason comes first: it is why the batch stopped
        chunk = batch.chunks[own["chunk"]]
        wire["failure"] = {"row_start": chunk.row_start, "row_end": chunk.row_end, **own}
    elif failed is not None and failed.failure:
        wire["failure"] = {
            "chunk": failed.idx,
            "row_start": failed.row_start,
            "row_end": failed.row_end,
            **failed.failure,
        }
    if batch.backfill is not None:
        wire["backfill"] = batch.backfill.wire()
    if include_chunks:
        wire["chunks"] = [
            {
                "index": c.idx,
                "row_start": c.row_start,
                "row_end": c.row_end,
                "state": c.state,
                "attempts": c.attempts,
                "rows_done": c.rows_done,
                **({"job_id": c.job_id} if c.job_id else {}),
                **({"failure": c.failure} if c.failure and c.state != DONE else {}),
            }
            for c in batch.chunks
        ]
    return wire


def batch_as_job(wire: dict) -> dict:
    """A batch's wire form as a job envelope, so the jobs routes (LanceDB 0.40's ``open_job``, ``list_jobs``) address
    batches and backfills by id: ``job_type`` ``batch`` or ``backfill``, ``job_state`` ``PAUSED`` while paused, a
    backfill's ``table`` the table it writes."""
    return {
        "job_id": wire["batch_id"],
        "job_type": "backfill" if "backfill" in wire else "batch",
        "job_state": "PAUSED" if wire.get("paused") else wire["batch_state"],
        "creation_ms": wire["creation_ms"],
        "spec": {"name": wire["name"], "version": wire["version"], "rows_total": wire["rows_total"]},
        "progress": {"rows_done": wire["rows_done"], "rows_total": wire["rows_total"]},
        **({"failure": wire["failure"]} if "failure" in wire else {}),
        **({"namespace": wire["namespace"]} if "namespace" in wire else {}),
        **({"table": wire["backfill"]["table_uri"]} if "backfill" in wire else {}),
    }
