"""The batch handle: `f.map(items, parallel=…)` fanned out as chunk jobs (docs/ARCHITECTURE.md, "Batches").

batch = embed.map(texts, parallel="auto", retries=1)
batch.result()              # every row's result, in input order (the input's kind: list / numpy / table)
for i, value in batch.as_completed(): ...   # rows as their chunks finish
batch.retry_failed(); batch.cancel(); Batch.attach(batch_id)

Runs in the kernel; it takes the function as a `FunctionRef` (handles/base.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.kernel.client import Client, LancefnError
from lancefn_jupyter.kernel.display.batch import batch_card, batch_state_text
from lancefn_jupyter.kernel.display.live_logs import LiveLog
from lancefn_jupyter.kernel.handles import chunking
from lancefn_jupyter.kernel.handles.base import FunctionRef, RecordHandle, waiting
from lancefn_jupyter.kernel.handles.job import LIVE_AFTER_S, Job
from lancefn_jupyter.kernel.handles.rows import rows_payload
from lancefn_jupyter.kernel.handles.submit import create_batch, registered_version
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.batch_models import Batch as BatchRecord
from lancefn_jupyter.wire.batch_models import BatchChunk
from lancefn_jupyter.wire.models import TERMINAL_STATES, FunctionVersion, JobState, display_state

__all__ = ["Batch", "BatchChunkError", "BatchError", "check_parallel", "start_batch"]
_FETCHERS = 8  # concurrent result fetches of one batch (the control plane serves them in parallel)
CHUNK_LINES_SHOWN = 50  # lines of one chunk shown under the cell while the batch runs ("Live output")


class BatchError(LancefnError):
    """A batch did not produce every row's result (a chunk failed, or it was cancelled)."""

    def __init__(self, message: str, batch: BatchRecord, *, remote_traceback: str = ""):
        self.batch = batch
        self.batch_id = batch.batch_id
        self.failure = batch.failure
        self.remote_traceback = remote_traceback
        super().__init__(message)


class BatchChunkError(LancefnError):
    """Stands in for each row of a chunk that failed, with `result(return_exceptions=True)`."""

    def __init__(
        self, message: str, *, chunk: int, row_start: int, row_end: int, phase: str = "run", remote_traceback: str = ""
    ):
        self.chunk, self.row_start, self.row_end = chunk, row_start, row_end
        self.phase, self.remote_traceback = phase, remote_traceback
        super().__init__(message)


def check_parallel(parallel: Any) -> int | None:
    """`"auto"` → None (as many as the class has GPUs); a whole number ≥ 1 → itself."""
    if parallel == "auto":
        return None
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ValueError(f"parallel must be 'auto' or a whole number ≥ 1 (chunks running at once); got {parallel!r}")
    return parallel


def _slots(function: FunctionRef, client: Client, parallel: int | None) -> int:
    """How many chunks can run at once: `parallel`, else the class's GPUs per the function's num_gpus."""
    if parallel is not None:
        return parallel
    resources = function.registration_request.runtime.resources
    if resources is None or not resources.num_gpus:
        import os

        return os.cpu_count() or 1
    try:
        usage = {row.name: row for row in client.gpu.usage()}
    except LancefnError:
        return 1
    row = usage.get(resources.gpu_class or "default") or next(iter(usage.values()), None)
    return max(1, (row.gpus_total if row else 1) // resources.num_gpus)


def _create(
    function: FunctionRef,
    version: FunctionVersion,
    client: Client,
    parts: chunking.Split,
    row_of: Callable[[Any], dict[str, Any]] | None,
    table: Any = None,
    **options: Any,
) -> dict[str, Any]:
    """Build every chunk's rows as `map` builds rows and create the batch: JSON chunks when they
    can be, else one Arrow IPC stream with a record batch per chunk (numpy / pyarrow parameters or
    results, NaN/Inf values, a table column), handed over as a file to the embedded server."""
    if table is None:
        items = [item for chunk in parts.chunks for item in chunk]
        rows = [(row_of or function.item_row)(item) for item in items]
        json_rows, table = rows_payload(rows, function.signature, function.name, function.parameter_defaults())
        if json_rows is not None:
            return create_batch(client, version, [json_rows[a:b] for a, b in parts.bounds], None, **options)
    import pyarrow as pa

    whole = table.combine_chunks().to_batches()[0]  # one record batch; sliced per chunk (no copy)
    chunked = pa.Table.from_batches([whole.slice(a, b - a) for a, b in parts.bounds], schema=table.schema)
    return create_batch(client, version, None, chunked, **options)


def start_batch(
    function: FunctionRef,
    items: Any,
    *,
    parallel: Any = "auto",
    chunk_size: int | None = None,
    retries: int = 0,
    return_exceptions: bool = False,
    fresh: bool = False,
    row_of: Callable[[Any], dict[str, Any]] | None = None,
    column: Any = None,
    init: dict[str, Any] | None = None,
) -> Batch:
    """Check the options and the input, cut it into chunks, create the batch (nothing starts on bad input).
    ``column``: the values of the function's one parameter as an Arrow array (a table's column),
    sent as Arrow chunks as they are; ``items`` is then ignored."""
    from lancefn_jupyter.kernel.session import current_client

    window = check_parallel(parallel)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
        raise ValueError(f"retries must be a whole number from 0 to 10 (re-runs of a failed chunk); got {retries!r}")
    version = registered_version(function)
    client = current_client()
    slots = _slots(function, client, window) if chunk_size is None else 1
    batched = function.signature.batched  # one call per chunk: chunks of at most BATCHED_CHUNK_ROWS
    table = None
    if column is not None:
        (param,) = function.signature.inputs
        # Arrow chunks as they are (no per-row Python) when the column casts to the parameter's type.
        table = dataplane.column_rows(param.name, param.arrow_type, column)
        if table is None:
            items = column.to_pylist()
    if table is not None:
        parts = chunking.Split("list", (), chunking.cut(table.num_rows, chunk_size, slots=slots, batched=batched))
    else:
        parts = chunking.split(items, chunk_size, slots=slots, batched=batched)
    reply = _create(
        function,
        version,
        client,
        parts,
        row_of,
        table,
        parallel=window,
        retries=retries,
        fresh=fresh,
        timeout_s=function.timeout_s,
        **({"init": init} if init is not None else {}),
    )
    batch = Batch(
        reply["batch_id"], client=client, function=function, kind=parts.kind, return_exceptions=return_exceptions
    )
    batch.reused_chunks = int(reply.get("reused_chunks", 0))
    return batch


@dataclass(frozen=True)
class Estimate:
    """What a ``map`` would take before it runs (``dry_run=True``): its rows and chunks, and from the version's ended
    jobs (``GET /v1/jobs/usage``) its expected time and cost; ``based_on``: how many jobs that rests on (0: none yet,
    no figures). docs/ARCHITECTURE.md, "Cost"."""

    rows: int
    chunks: int
    at_once: int  # chunks that run at the same time
    based_on: int = 0
    expected_s: float | None = None
    cost: float | None = None
    currency: str | None = None

    def __repr__(self) -> str:
        from lancefn_jupyter.kernel.display.cards import format_elapsed
        from lancefn_jupyter.kernel.display.timings import format_money

        head = f"{self.rows:,} rows in {self.chunks} chunk{'s' if self.chunks != 1 else ''}, {self.at_once} at a time"
        if self.expected_s is None:
            return f"{head}: no estimate yet (no ended job of this version); run a few chunks first"
        cost = f" and {format_money(self.cost, self.currency or 'USD')}" if self.cost is not None else ""
        return f"{head}: about {format_elapsed(self.expected_s)}{cost}, from {self.based_on} earlier jobs"


def estimate_batch(
    function: FunctionRef, items: Any, *, parallel: Any = "auto", chunk_size: int | None = None
) -> Estimate:
    """A ``map``'s rows, chunks and expected time and cost, from the version's history, without running anything:
    its chunks cut as :func:`start_batch` would, each taking the version's seconds (and cost) per row so far, as many at
    a time as the batch would run."""
    from lancefn_jupyter.kernel.session import current_client

    window = check_parallel(parallel)
    version = registered_version(function)
    client = current_client()
    slots = _slots(function, client, window)
    cut_slots = slots if chunk_size is None else 1  # as start_batch cuts it
    bounds = chunking.cut(_count(items), chunk_size, slots=cut_slots, batched=function.signature.batched)
    rows = bounds[-1][1]
    at_once = max(1, min(slots, len(bounds)))
    suffix = f"/{function.name}@{version.version}"  # the usage key: namespace/name@version
    history = [row for row in client.jobs.usage("version")["rows"] if row["key"].endswith(suffix)]
    if not history or not history[0]["rows"]:
        return Estimate(rows, len(bounds), at_once)
    past = history[0]
    # Warm: the batch's chunks run on the workers its first ones start, so worker starts (in the history's held
    # seconds, several for a few chunks) are left out of the rate per row.
    warm = max(0.0, 1 - past.get("start_s", 0.0) / past["held_s"]) if past["held_s"] else 1.0
    per_row_s = past["held_s"] * warm / past["rows"]
    waves = -(-len(bounds) // at_once)
    largest = max(end - start for start, end in bounds)
    cost = past["cost"] * warm / past["rows"] * rows if "cost" in past else None
    gap_s = _wave_gap_s(client, function.name, version.version, per_row_s, at_once)
    expected_s = waves * (largest * per_row_s + gap_s)
    return Estimate(rows, len(bounds), at_once, past["jobs"], expected_s, cost, past.get("currency"))


def _wave_gap_s(client: Any, name: str, version: str, per_row_s: float, at_once: int) -> float:
    """What a batch of the version spent per wave of chunks beyond running them (handing each chunk to a worker,
    its results back, the next one out), from the newest finished batch of the version: its wall time less its
    workers' starts, per wave, less its chunks' run time; 0 before any. docs/ARCHITECTURE.md, "Cost"."""
    done = [
        b
        for b in client.batches.list(state="DONE", name=name, limit=20)
        if b.version == version and b.started_ms and b.finished_ms and b.chunks_total
    ]
    if not done:
        return 0.0
    newest = max(done, key=lambda b: b.finished_ms)
    slots = max(1, min(at_once, newest.chunks_total))
    waves = -(-newest.chunks_total // slots)
    usage = next((row for row in client.jobs.usage("batch")["rows"] if row["key"] == newest.batch_id), None)
    starts_s = usage["start_s"] / slots if usage else 0.0  # its workers started side by side
    wall_s = (newest.finished_ms - newest.started_ms) / 1000 - starts_s
    return max(0.0, wall_s / waves - newest.rows_total / newest.chunks_total * per_row_s)


def _count(items: Any) -> int:
    """How many rows ``items`` holds (a sequence, a numpy array, an Arrow table or column)."""
    if hasattr(items, "num_rows"):
        return int(items.num_rows)
    shape = getattr(items, "shape", None)
    if shape:
        return int(shape[0])
    return len(items) if hasattr(items, "__len__") else len(list(items))


class Batch(RecordHandle[BatchRecord]):
    """A handle on one batch: progress, results in order or as they finish, retry, cancel."""

    def __init__(
        self,
        batch_id: str,
        *,
        client: Client | None = None,
        function: FunctionRef | None = None,
        kind: str = "list",
        return_exceptions: bool = False,
        snapshot: BatchRecord | None = None,
    ):
        from lancefn_jupyter.kernel.session import current_client

        self.batch_id = batch_id
        self.client = client or current_client()
        self.function = function
        self._kind = kind
        self.return_exceptions = return_exceptions
        self.reused_chunks = 0
        self._snapshot = snapshot
        self._results: dict[int, Any] = {}  # chunk index → its rows' results (fetched once)

    @classmethod
    def attach(cls, batch_id: str, *, client: Client | None = None) -> Batch:
        """Re-attach to a batch (e.g. after a kernel restart); results come back as a list."""
        batch = cls(batch_id, client=client)
        batch.refresh()
        return batch

    # -- state
    def _describe(self) -> BatchRecord:
        return self.client.batches.describe(self.batch_id)

    def _update(self, snapshot: BatchRecord) -> None:
        """A newer state from the event listener (never goes backwards)."""
        if self._snapshot is None or snapshot.revision >= self._snapshot.revision:
            self._snapshot = snapshot

    @property
    def state(self) -> str:
        """pending, running, paused, finished, failed or cancelled."""
        snapshot = self.snapshot
        if snapshot.batch_state not in TERMINAL_STATES:
            snapshot = self.refresh()
        return batch_state_text(snapshot)

    @property
    def done(self) -> bool:
        return self.snapshot.batch_state in TERMINAL_STATES

    @property
    def progress(self) -> tuple[int, int]:
        """(rows done, rows in all)."""
        snapshot = self.snapshot
        return snapshot.rows_done, snapshot.rows_total

    def wait(self, timeout: float | None = None) -> Batch:
        """Block until every chunk ended (or `timeout` s). Ctrl-C stops waiting, not the batch."""
        with waiting(
            f"Stopped waiting for batch {self.batch_id}; it keeps running. "
            f"Cancel it with Batch.attach({self.batch_id!r}).cancel() or its Cancel button."
        ):
            self._snapshot = self._wait_showing_chunks(timeout)
        return self

    def _wait_showing_chunks(self, timeout: float | None) -> BatchRecord:
        """Wait; while the batch runs, each running chunk's prints are shown under the cell as they come, each line
        after `[chunk N] ` (docs/ARCHITECTURE.md, "Live output"). A batch that ends within ``LIVE_AFTER_S`` costs
        that one request, as before."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        following: dict[str, LiveLog] = {}  # a running chunk's job → its follower
        snapshot = self.client.batches.wait(
            self.batch_id, timeout=LIVE_AFTER_S if timeout is None else min(timeout, LIVE_AFTER_S)
        )
        try:
            while snapshot.batch_state not in TERMINAL_STATES:
                self._follow_chunks(snapshot, following)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return snapshot
                snapshot = self.client.batches.wait(
                    self.batch_id, timeout=LIVE_AFTER_S if left is None else min(left, LIVE_AFTER_S)
                )
            return snapshot
        finally:
            for live in following.values():
                live.close()

    def _follow_chunks(self, snapshot: BatchRecord, following: dict[str, LiveLog]) -> None:
        """Start following the chunks that run now, show what every followed chunk printed, close the ended ones."""
        running = {c.job_id: c for c in snapshot.chunks or () if c.state == JobState.IN_PROGRESS and c.job_id}
        for job_id, chunk in running.items():
            if job_id not in following:
                following[job_id] = LiveLog(
                    job_id,
                    self.client.jobs.log_entries,
                    shown=CHUNK_LINES_SHOWN,
                    prefix=f"[chunk {chunk.index}] ",
                    more=f"Job.attach({job_id!r}).logs()",
                )
        for job_id, live in following.items():
            live.pull() if job_id in running else live.close()

    # -- results
    def _chunk_value(self, chunk: BatchChunk) -> Any:
        """A finished chunk's results as its job returns them (through the jobs' result transport)."""
        if chunk.index not in self._results:
            assert chunk.job_id is not None  # a finished chunk ran as a job
            self._results[chunk.index] = Job(chunk.job_id, client=self.client, function=self.function).result()
        return self._results[chunk.index]

    def _prefetch(self, chunks: list[BatchChunk]) -> None:
        """Fetch finished chunks' results a few at a time: one round trip each, and a batch of many
        small chunks would otherwise spend longer fetching its results than running them."""
        if len(chunks) < 2:
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(_FETCHERS, len(chunks)), thread_name_prefix="lancefn-results") as pool:
            for chunk, value in zip(chunks, pool.map(self._chunk_value, chunks), strict=True):
                self._results[chunk.index] = value

    def _chunk_rows(self, chunk: BatchChunk) -> list[Any]:
        """A finished chunk's results, one item per row."""
        value = self._chunk_value(chunk)
        if hasattr(value, "to_pylist"):  # an Arrow table / array
            return value.to_pylist()
        return list(value)

    def _chunk_error(self, chunk: BatchChunk) -> BatchChunkError:
        failure = chunk.failure or {}
        tb = self._map_traceback(failure.get("traceback") or "")
        message = (
            f"chunk {chunk.index} (rows {chunk.row_start}–{chunk.row_end - 1}) "
            f"{'was cancelled' if chunk.state == JobState.CANCELLED else 'failed in phase ' + str(failure.get('phase', 'run'))}"
            f"{': ' + failure['message'] if failure.get('message') and chunk.state != JobState.CANCELLED else ''}"
        )
        return BatchChunkError(
            message,
            chunk=chunk.index,
            row_start=chunk.row_start,
            row_end=chunk.row_end,
            phase=str(failure.get("phase", "run")),
            remote_traceback=tb,
        )

    def _map_traceback(self, text: str) -> str:
        return self.function.map_traceback(text) if self.function is not None and text else text

    def raise_failure(self, snapshot: BatchRecord) -> None:
        """Raise the BatchError of `snapshot`, a batch that ended without every row's result."""
        ref = f"{snapshot.name}@{snapshot.version}"
        done = snapshot.chunk_counts.get("DONE", 0)
        kept = f"{done} of {snapshot.chunks_total} chunks finished and their results are kept; `.retry_failed()` runs the rest"
        if snapshot.batch_state == JobState.CANCELLED:
            raise BatchError(f"batch {self.batch_id} ({ref}) was cancelled; {kept}", snapshot)
        # The chunk that failed, not one the batch's failure then cancelled (a lower index may be either).
        chunks = snapshot.chunks or ()
        failed = next((c for c in chunks if c.state in (JobState.FAILED, JobState.TIMED_OUT)), None) or next(
            (c for c in chunks if c.state == JobState.CANCELLED), None
        )
        error = self._chunk_error(failed) if failed is not None else None
        text = f"batch {self.batch_id} ({ref}) failed: {error or 'a chunk did not finish'}; {kept}"
        if error is not None and error.remote_traceback:
            text += "\n\nRemote traceback (your code only):\n" + error.remote_traceback
        raise BatchError(text, snapshot, remote_traceback=error.remote_traceback if error else "")

    def result(self, timeout: float | None = None, *, return_exceptions: bool | None = None) -> Any:
        """Every row's result in input order, as the input's kind (list, numpy array, pyarrow Table).

        A failed or cancelled batch raises :class:`BatchError` naming the chunk and its rows, unless
        `return_exceptions=True`: then each row of a chunk that did not finish is a BatchChunkError (a list).
        """
        snapshot = self.snapshot
        if snapshot.batch_state not in TERMINAL_STATES or snapshot.chunks is None:
            snapshot = self.wait(timeout).snapshot
        if snapshot.batch_state not in TERMINAL_STATES:
            raise TimeoutError(f"batch {self.batch_id} is still {display_state(snapshot.batch_state)} after {timeout}s")
        keep_errors = self.return_exceptions if return_exceptions is None else return_exceptions
        if snapshot.batch_state != JobState.DONE and not keep_errors:
            self.raise_failure(snapshot)
        self._prefetch([c for c in snapshot.chunks or () if c.state == JobState.DONE and c.index not in self._results])
        parts: list = []
        for chunk in snapshot.chunks or ():
            if chunk.state == JobState.DONE:
                parts.append(self._chunk_value(chunk))
            else:
                parts.append([self._chunk_error(chunk)] * (chunk.row_end - chunk.row_start))
        if snapshot.batch_state != JobState.DONE:
            return chunking.stack("list", parts)
        return chunking.stack(self._kind, parts)

    def as_completed(self, timeout: float | None = None) -> Iterator[tuple[int, Any]]:
        """`(row index, result)` pairs as their chunks finish (rows of one chunk together, in order).

        A chunk that fails after its retries raises BatchError once reached (or yields
        BatchChunkError values with `return_exceptions=True`)."""
        for chunk, values in self.chunks_as_completed(timeout):
            if isinstance(values, BatchChunkError):
                if not self.return_exceptions:
                    self.raise_failure(self.refresh() if self.done else self.snapshot)
                yield from ((i, values) for i in range(chunk.row_start, chunk.row_end))
            else:
                yield from enumerate(values, start=chunk.row_start)

    def chunks_as_completed(self, timeout: float | None = None) -> Iterator[tuple[BatchChunk, Any]]:
        """`(chunk, its rows' results)` as chunks finish, or `(chunk, BatchChunkError)` for one
        that failed after its retries (a cancelled chunk only once the batch has ended)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        seen: set[int] = set()
        revision: int | None = None
        ended = (JobState.FAILED, JobState.TIMED_OUT, JobState.CANCELLED)
        while True:
            if revision is None:
                snapshot = self.refresh()  # what has finished already, without waiting
            else:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                snapshot = self.client.batches.wait(self.batch_id, timeout=left, revision=revision)
                self._snapshot = snapshot
            revision = snapshot.revision
            terminal = snapshot.batch_state in TERMINAL_STATES
            for chunk in snapshot.chunks or ():
                if chunk.index in seen:
                    continue
                if chunk.state == JobState.DONE:
                    seen.add(chunk.index)
                    yield chunk, self._chunk_rows(chunk)
                elif chunk.state in ended and (terminal or chunk.state != JobState.CANCELLED):
                    seen.add(chunk.index)
                    yield chunk, self._chunk_error(chunk)
            if terminal:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"batch {self.batch_id} is still {display_state(snapshot.batch_state)} after {timeout}s"
                )

    def logs(self, row: int | None = None) -> str:
        """Every chunk's log, in chunk order; `row=17`: only what the function printed for row 17 of the batch
        (from the job of the chunk holding it; docs/ARCHITECTURE.md, "Live output")."""
        chunks = [c for c in self.refresh().chunks or () if c.job_id is not None]
        if row is not None:
            chunks = [c for c in chunks if c.row_start <= row < c.row_end]
        logs = [
            Job(c.job_id, client=self.client).logs(None if row is None else row - c.row_start)
            for c in chunks
            if c.job_id is not None
        ]
        return "\n".join(text for text in logs if text)

    # -- control
    def debug(self, commands: Sequence[str] = ()) -> Any:
        """`Job.debug()` on the failed chunk's job (docs/ARCHITECTURE.md, "Debugging a failure"): its failing row run
        again here, stopped in the post-mortem debugger at the failing line; its remote locals printed first."""
        failure = self.snapshot.failure
        if failure is None or failure.job_id is None:
            raise LancefnError(f"batch {self.batch_id} is {self.state}: it has no failed chunk to debug")
        return Job(failure.job_id, client=self.client, function=self.function).debug(commands)

    def retry_failed(self) -> Batch:
        """Run again only the chunks that did not finish; finished chunks keep their results."""
        self._snapshot = self.client.batches.retry(self.batch_id)
        return self

    def pause(self) -> bool:
        """No new chunk starts; running chunks finish and are kept (a restart keeps it paused). True if this call
        paused it."""
        paused = self.client.batches.pause(self.batch_id)
        self.refresh()
        return paused

    def resume(self) -> bool:
        """A paused batch goes on where it stopped. True if this call resumed it."""
        resumed = self.client.batches.resume(self.batch_id)
        self.refresh()
        return resumed

    def cancel(self) -> bool:
        """Cancel every chunk still pending or running; True if this call cancelled the batch."""
        cancelled = self.client.batches.cancel(self.batch_id)
        self.refresh()
        return cancelled

    # -- display
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from lancefn_jupyter.kernel.widgets import batch_bundle

        return batch_bundle(self)

    def __repr__(self) -> str:
        return batch_card(self.snapshot)[0]
