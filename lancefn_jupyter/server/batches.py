"""Batches: one `map` fanned out as chunk jobs over a GPU class (docs/ARCHITECTURE.md, "Batches").

A batch owns its input cut into chunks (rows stored per chunk) and submits each chunk as an
ordinary ``run_function`` job of the same version through ``ControlPlane.run``, so chunks wait in
the class's FIFO like any job.  ``parallel`` bounds how many chunk jobs exist (pending or running)
at once; ``None`` ("auto") submits every chunk and lets the class's GPUs bound it.

State rule (a batch follows its chunks): PENDING until a chunk runs, IN_PROGRESS while any chunk is
pending or running, then — once no chunk is left to run — CANCELLED if cancel was asked, FAILED if
a chunk failed after its retries, else DONE.  A failed chunk does not stop the others: every finished
chunk's result is kept and ``retry`` runs only what did not finish.

Durability: a chunk's job id and attempt count are written in the same transaction as the job, and a
chunk's outcome is read back from its job on start (``recover``), so a control plane killed at any
point resumes the batch with no row lost and none counted twice (a job's result is one write).

Everything runs under the core's lock: hooks arrive from ``JobJournal.persist`` (``journal.py``).

Size: over 600 lines because a batch's state machine, its durability and its recovery are one
concern that must be read together; cutting and stacking live in ``batching.py``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..models import FunctionVersion, JobState
from .common import ApiError
from .jobs import check_rows
from .namespaces import DEFAULT_NAMESPACE, visible

if TYPE_CHECKING:  # pragma: no cover
    from .core import ControlPlane
    from .store import JobRecord

__all__ = ["BatchManager", "BATCH_SCHEMA", "MAX_CHUNKS", "MAX_RETRIES"]

log = logging.getLogger("lancefn.server")

PENDING, IN_PROGRESS = JobState.PENDING.value, JobState.IN_PROGRESS.value
DONE, FAILED = JobState.DONE.value, JobState.FAILED.value
CANCELLED, TIMED_OUT = JobState.CANCELLED.value, JobState.TIMED_OUT.value
_TERMINAL = {DONE, FAILED, CANCELLED, TIMED_OUT}
MAX_CHUNKS = 100_000
MAX_RETRIES = 10
BATCH_EVENT_INTERVAL_S = 0.2  # batch events are coalesced per batch; terminal ones go out at once
# One letter per chunk in the wire's `strip` (compact enough for 100k chunks in one event).
STRIP_LETTER = {PENDING: "p", IN_PROGRESS: "r", DONE: "d", FAILED: "f", CANCELLED: "c", TIMED_OUT: "f"}

BATCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL UNIQUE,
    namespace TEXT,                    -- the function's namespace: its chunk jobs run there, callers see it by scope
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    input_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,                -- {parallel, retries, timeout_s, rows_total, chunks_total}
    creation_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_by_input ON batches(name, version, input_digest, seq);
CREATE INDEX IF NOT EXISTS batches_by_state ON batches(state, seq);
CREATE TABLE IF NOT EXISTS batch_chunks(
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    row_start INTEGER NOT NULL,
    row_end INTEGER NOT NULL,
    rows TEXT NOT NULL,
    state TEXT NOT NULL,
    job_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    failure TEXT,
    PRIMARY KEY(batch_id, idx)
) WITHOUT ROWID;
"""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


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

    from ..dataplane import to_ipc_bytes

    reader = pa.ipc.open_stream(pa.memory_map(str(path), "r"))
    return [to_ipc_bytes(pa.Table.from_batches([part])) for part in reader if part.num_rows]


def _arrow_rows_count(data: bytes) -> int:
    import pyarrow as pa

    return pa.ipc.open_stream(data).read_all().num_rows


@dataclass
class _Chunk:
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
class _Batch:
    batch_id: str
    name: str
    version: str
    digest: str
    state: str
    parallel: int | None
    retries: int
    timeout_s: float | None
    creation_ms: int
    chunks: list[_Chunk]
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

    @property
    def rows_total(self) -> int:
        return self.chunks[-1].row_end if self.chunks else 0


class BatchManager:
    def __init__(self, core: "ControlPlane"):
        self.core = core
        self.store = core.store
        self.store.executescript(BATCH_SCHEMA)
        self._batches: dict[str, _Batch] = {}  # active batches (terminal ones are read from the store)
        self._by_job: dict[str, tuple[str, int]] = {}  # live chunk job → (batch, chunk)
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._emitted: dict[str, float] = {}
        self._held: set[str] = set()
        self._recovered = False
        self._fresh_rows: list | None = None  # the chunks of the batch being created (core lock held)

    # ----------------------------------------------------------------- requests

    def create(
        self,
        name: str,
        version: str,
        chunks: Any,
        *,
        parallel: int | None,
        retries: int,
        timeout_s: float | None,
        fresh: bool,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
        arrow_rows: Any = None,
    ) -> dict:
        """Validate everything, then record the batch and submit its first chunks (nothing is
        created when any check fails).  Same version + same input (+ same cut) and not ``fresh``:
        the latest such batch is reused — finished chunks kept, the rest run again.
        ``arrow_rows``: the path of an Arrow IPC stream, one record batch per chunk, instead of
        JSON ``chunks`` (checked against the signature like a ``functions/run`` body)."""
        core = self.core
        # The version the caller means (namespaces, as for functions/run); the batch lives in its namespace.
        fv, namespace = core.catalog.runnable(name, version, namespace=namespace, scope=scope, home=home)
        if arrow_rows is not None:
            try:
                core.data.check_rows(arrow_rows, fv.signature.inputs, f"{fv.name}@{fv.version}")
            except ValueError as error:
                raise ApiError(400, str(error)) from None
            chunks = split_arrow_chunks(arrow_rows)
        if not isinstance(chunks, list) or not chunks:
            raise ApiError(400, "chunks must be a non-empty list of chunks, each a non-empty list of rows")
        if len(chunks) > MAX_CHUNKS:
            raise ApiError(
                400, f"{len(chunks)} chunks is more than the limit of {MAX_CHUNKS}; pass a larger chunk_size"
            )
        if parallel is not None and parallel < 1:
            raise ApiError(400, "parallel must be ≥ 1, or null for as many as the class has GPUs ('auto')")
        if not 0 <= retries <= MAX_RETRIES:
            raise ApiError(400, f"retries must be between 0 and {MAX_RETRIES}")
        encoded = self._check_chunks(fv, chunks)
        digest = input_digest(encoded)
        with core._lock:
            if not fresh:
                previous = self._find(namespace, name, version, digest)
                if previous is not None:
                    self.retry(previous.batch_id)
                    batch = self._get(previous.batch_id)
                    batch.reused_chunks = batch.counts[DONE]
                    return {"batch_id": batch.batch_id, "reused_chunks": batch.reused_chunks}
            batch = _Batch(
                batch_id=uuid.uuid4().hex,
                name=name,
                version=version,
                digest=digest,
                state=PENDING,
                parallel=parallel,
                retries=retries,
                timeout_s=timeout_s,
                creation_ms=_now_ms(),
                chunks=[],
                namespace=namespace,
            )
            start = 0
            for i, rows in enumerate(chunks):
                count = _arrow_rows_count(rows) if isinstance(rows, bytes) else len(rows)
                batch.chunks.append(_Chunk(i, start, start + count))
                start += count
            batch.waiting.extend(range(len(chunks)))
            batch.counts[PENDING] = len(chunks)
            self._fresh_rows = chunks  # the first submissions use these instead of reading them back
            with self.store.batch():
                self.store.execute(
                    "INSERT INTO batches(batch_id, namespace, name, version, input_digest, state, spec, creation_ms) "
                    "VALUES(?,?,?,?,?,?,?,?)",
                    (
                        batch.batch_id,
                        namespace,
                        name,
                        version,
                        digest,
                        PENDING,
                        _dumps(self._spec(batch)),
                        batch.creation_ms,
                    ),
                )
                self.store.executemany(
                    "INSERT INTO batch_chunks(batch_id, idx, row_start, row_end, rows, state) VALUES(?,?,?,?,?,?)",
                    [
                        (batch.batch_id, c.idx, c.row_start, c.row_end, text, PENDING)
                        for c, text in zip(batch.chunks, encoded, strict=False)
                    ],
                )
                self._batches[batch.batch_id] = batch
                try:
                    self._advance(batch)
                except BaseException:
                    self._forget(batch)
                    raise
                finally:
                    self._fresh_rows = None
            self._changed(batch)
            return {"batch_id": batch.batch_id, "reused_chunks": 0}

    @staticmethod
    def _check_chunks(fv: FunctionVersion, chunks: list) -> list[str]:
        """Every row fits the signature (the message names chunk and row); returns each chunk's JSON.
        Fast path: the parameter names per row and one JSON encoding per chunk; the core's per-row
        check only to name a problem."""
        if all(isinstance(rows, bytes) for rows in chunks):
            return chunks  # Arrow chunks: checked as one stream against the signature already
        wanted = {p.name for p in fv.signature.inputs}
        encoded = []
        for i, rows in enumerate(chunks):
            try:
                if isinstance(rows, list) and rows and all(type(row) is dict and row.keys() == wanted for row in rows):
                    text = _dumps(rows)
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

    def describe(self, batch_id: str, *, include_chunks: bool = True, scope: str | None = None) -> dict:
        with self.core._lock:
            return self._wire(self._get(batch_id, scope), include_chunks=include_chunks)

    def list(self, *, state: str | None, name: str | None, limit: int, scope: str | None = None) -> dict:
        clauses, args = [], []
        if scope is not None:  # a namespace's key sees its own batches only
            clauses.append("namespace=?")
            args.append(scope)
        if state:
            clauses.append("state=?")
            args.append(state)
        if name:
            clauses.append("name=?")
            args.append(name)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        with self.core._lock:
            ids = [
                row[0]
                for row in self.store.query(
                    f"SELECT batch_id FROM batches{where} ORDER BY seq DESC LIMIT ?", (*args, limit)
                )
            ]
            return {"batches": [self._wire(self._get(i), include_chunks=False) for i in ids]}

    def cancel(self, batch_id: str, scope: str | None = None) -> dict:
        """Cancel every chunk still pending or running; finished chunks keep their results."""
        with self.core._lock:
            batch = self._get(batch_id, scope)
            if batch.state in _TERMINAL:
                return {"batch_id": batch_id, "cancelled": False}
            batch.cancel_requested = True
            with self.store.batch():
                self.store.execute("UPDATE batches SET cancel_requested=1 WHERE batch_id=?", (batch_id,))
                while batch.waiting:
                    self._set_chunk(batch, batch.chunks[batch.waiting.popleft()], CANCELLED)
                for idx in sorted(batch.live):
                    job_id = batch.chunks[idx].job_id
                    if job_id is not None:
                        self.core.cancel_job(job_id)  # its hook marks the chunk CANCELLED
                self._advance(batch)
            self._changed(batch)
            return {"batch_id": batch_id, "cancelled": True}

    def retry(self, batch_id: str, scope: str | None = None) -> dict:
        """Run again every chunk that did not finish (failed or cancelled); finished ones are kept."""
        with self.core._lock:
            batch = self._get(batch_id, scope)
            redo = [c for c in batch.chunks if c.state in (FAILED, CANCELLED, TIMED_OUT)]
            if not redo:
                return self._wire(batch, include_chunks=False)
            if batch.batch_id not in self._batches:
                self._activate(batch)
            with self.store.batch():
                batch.cancel_requested = False
                batch.state, batch.finished_ms = (IN_PROGRESS if batch.started_ms else PENDING), None
                for chunk in redo:
                    chunk.attempts, chunk.failure = 0, None
                    self._set_chunk(batch, chunk, PENDING)
                    batch.waiting.append(chunk.idx)
                self._save_batch(batch)
                self._advance(batch)
            self._changed(batch)
            return self._wire(batch, include_chunks=False)

    async def wait(self, batch_id: str, timeout_s: float, revision: int | None, scope: str | None = None) -> dict:
        """The batch once terminal or (with ``revision``) newer than it, or as it stands when
        ``timeout_s`` passes (long poll like ``jobs/wait``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            with self.core._lock:
                batch = self._get(batch_id, scope)
                newer = revision is not None and batch.revision > revision
                left = deadline - loop.time()
                if newer or batch.state in _TERMINAL or left <= 0 or not self.core._started:
                    return self._wire(batch, include_chunks=True)
                future = loop.create_future()
                self._waiters.setdefault(batch_id, []).append(future)
            try:
                await asyncio.wait_for(asyncio.shield(future), left)
            except asyncio.TimeoutError:
                pass
            finally:
                with self.core._lock:
                    waiters = self._waiters.get(batch_id)
                    if waiters and future in waiters:
                        waiters.remove(future)
                        if not waiters:
                            del self._waiters[batch_id]

    # ------------------------------------------------------------ core hooks

    def recover(self) -> None:
        """On start (core lock held, after the core re-queued its jobs): load unfinished batches and
        read each live chunk's outcome from its job, then submit what is due."""
        rows = self.store.query(
            "SELECT batch_id FROM batches WHERE state IN (?,?) ORDER BY seq", (PENDING, IN_PROGRESS)
        )
        for (batch_id,) in rows:
            batch = self._load(batch_id)
            assert batch is not None  # the query just listed it
            self._activate(batch)
            for idx in sorted(batch.live):
                chunk = batch.chunks[idx]
                rec = self.core.job_record(chunk.job_id) if chunk.job_id else None
                if rec is None:  # the job never got saved: run the chunk again
                    batch.live.discard(idx)
                    chunk.job_id = None
                    self._set_chunk(batch, chunk, PENDING)
                    batch.waiting.appendleft(idx)
                else:
                    self._job_changed(batch, chunk, rec)
            self._advance(batch)
        self._recovered = True

    def on_job(self, rec: "JobRecord") -> None:
        """A chunk job changed (called by the core after it saved the change)."""
        if not self._recovered:
            return  # recover() reads every chunk job's state once the batches are loaded
        where = self._by_job.get(rec.job_id)
        if where is None:
            return
        batch = self._batches.get(where[0])
        if batch is None:
            return
        try:
            self._job_changed(batch, batch.chunks[where[1]], rec)
            self._advance(batch)
            self._changed(batch)
        except Exception:  # never into the core's job bookkeeping; the batch re-reads on restart
            log.exception("batch %s: could not follow job %s", batch.batch_id, rec.job_id)

    # ---------------------------------------------------------------- internals

    def _job_changed(self, batch: _Batch, chunk: _Chunk, rec: "JobRecord") -> None:
        if chunk.job_id != rec.job_id:
            return  # an earlier attempt
        chunk.rows_done = rec.rows_done or 0
        state = rec.state
        if state == IN_PROGRESS and batch.started_ms is None:
            batch.started_ms = rec.started_ms or _now_ms()
            batch.state = IN_PROGRESS
            self._save_batch(batch)
        if state not in _TERMINAL:
            if state != chunk.state:
                self._set_chunk(batch, chunk, state)
            return
        batch.live.discard(chunk.idx)
        self._by_job.pop(rec.job_id, None)
        if state == DONE:
            chunk.rows_done = chunk.rows
            self._set_chunk(batch, chunk, DONE)
            return
        failure = dict(rec.failure or {})
        failure.setdefault("phase", "timeout" if state == TIMED_OUT else "run")
        failure.setdefault("message", "the chunk's job ended without a failure message")
        chunk.failure = {**failure, "job_id": rec.job_id}
        if state == CANCELLED:
            self._set_chunk(batch, chunk, CANCELLED)
        elif chunk.attempts <= batch.retries and not batch.cancel_requested:
            chunk.job_id, chunk.rows_done = None, 0
            self._set_chunk(batch, chunk, PENDING)
            batch.waiting.appendleft(chunk.idx)  # first in line among this batch's chunks
        else:
            self._set_chunk(batch, chunk, FAILED)

    def _advance(self, batch: _Batch) -> None:
        """Submit chunks while the window has room; finish the batch when nothing is left to run."""
        if batch.state in _TERMINAL:
            return
        window = batch.parallel or len(batch.chunks)
        if batch.waiting and len(batch.live) < window and not batch.cancel_requested:
            with self.store.batch():
                while batch.waiting and len(batch.live) < window:
                    chunk = batch.chunks[batch.waiting.popleft()]
                    try:
                        self._submit(batch, chunk)
                    except ApiError as error:
                        if self._fresh_rows is not None:
                            raise  # creating the batch: the request fails and nothing is kept
                        # E.g. the version was dropped since: the chunk fails, saying why.
                        chunk.failure = {"phase": "validation", "message": error.message}
                        self._set_chunk(batch, chunk, FAILED)
        if batch.live or batch.waiting:
            return
        if batch.cancel_requested:
            batch.state = CANCELLED
        elif batch.counts[FAILED] or batch.counts[CANCELLED]:
            batch.state = FAILED
        else:
            batch.state = DONE
        batch.finished_ms = _now_ms()
        self._save_batch(batch)
        self._forget(batch)

    def _submit(self, batch: _Batch, chunk: _Chunk) -> None:
        if self._fresh_rows is not None and chunk.attempts == 0:
            rows = self._fresh_rows[chunk.idx]
        else:
            rows = self.store.query(
                "SELECT rows FROM batch_chunks WHERE batch_id=? AND idx=?", (batch.batch_id, chunk.idx)
            )[0][0]
            rows = rows if isinstance(rows, bytes) else json.loads(rows)
        arrow_rows = None
        if isinstance(rows, bytes):
            # Arrow chunk: handed to its job as a rows file, the data plane's path for a functions/run body.
            from ..dataplane import write_bytes_file

            arrow_rows, _ = self.core.data.new_rows_file()
            write_bytes_file(arrow_rows, rows, durable=False)
            rows = None
        chunk.attempts += 1
        extra = {"batch_id": batch.batch_id, "chunk": chunk.idx, "row_start": chunk.row_start}
        with self.store.batch():
            # The job and the chunk's pointer to it commit together (see the module's durability note).
            try:
                job_id = self.core.run(
                    batch.name,
                    batch.version,
                    rows,
                    batch.timeout_s,
                    namespace=batch.namespace,
                    home=batch.namespace,  # type: ignore[arg-type]
                    spec_extra=extra,
                    rows_checked=True,
                    arrow_rows=arrow_rows,
                )
            finally:
                if arrow_rows is not None and arrow_rows.exists():  # refused before the run took it
                    arrow_rows.unlink()
            chunk.job_id = job_id
            batch.live.add(chunk.idx)
            self._by_job[job_id] = (batch.batch_id, chunk.idx)
            self._save_chunk(batch, chunk)
        rec = self.core.job_record(job_id)
        if rec is not None and rec.state != chunk.state:  # placed and started at once (hook ran before the mapping)
            self._job_changed(batch, chunk, rec)

    def _set_chunk(self, batch: _Batch, chunk: _Chunk, state: str) -> None:
        if chunk.state == state:
            self._save_chunk(batch, chunk)
            return
        batch.counts[chunk.state] -= 1
        batch.counts[state] += 1
        if state == DONE:
            batch.rows_finished += chunk.rows
        elif chunk.state == DONE:
            batch.rows_finished -= chunk.rows
        chunk.state = state
        self._save_chunk(batch, chunk)

    def _save_chunk(self, batch: _Batch, chunk: _Chunk) -> None:
        self.store.execute(
            "UPDATE batch_chunks SET state=?, job_id=?, attempts=?, failure=? WHERE batch_id=? AND idx=?",
            (
                chunk.state,
                chunk.job_id,
                chunk.attempts,
                None if chunk.failure is None else _dumps(chunk.failure),
                batch.batch_id,
                chunk.idx,
            ),
        )

    def _save_batch(self, batch: _Batch) -> None:
        self.store.execute(
            "UPDATE batches SET state=?, started_ms=?, finished_ms=?, cancel_requested=? WHERE batch_id=?",
            (batch.state, batch.started_ms, batch.finished_ms, int(batch.cancel_requested), batch.batch_id),
        )

    @staticmethod
    def _spec(batch: _Batch) -> dict:
        spec: dict[str, Any] = {
            "parallel": batch.parallel,
            "retries": batch.retries,
            "rows_total": batch.rows_total,
            "chunks_total": len(batch.chunks),
        }
        if batch.timeout_s is not None:
            spec["timeout_s"] = batch.timeout_s
        return spec

    def _find(self, namespace: str | None, name: str, version: str, digest: str) -> _Batch | None:
        rows = self.store.query(
            "SELECT batch_id FROM batches WHERE name=? AND version=? AND input_digest=? AND namespace IS ? ORDER BY seq DESC LIMIT 1",
            (name, version, digest, namespace),
        )
        return self._get(rows[0][0]) if rows else None

    def _get(self, batch_id: str, scope: str | None = None) -> _Batch:
        """The batch, if the caller (``scope``: its namespace; None: the admin) may see it; else the same 404."""
        batch = self._batches.get(batch_id) or self._load(batch_id)
        if batch is None or not visible(scope, batch.namespace):
            raise ApiError(404, f"batch {batch_id} not found; list batches with POST /v1/batches/list")
        return batch

    def _load(self, batch_id: str) -> _Batch | None:
        rows = self.store.query(
            "SELECT namespace, name, version, input_digest, state, spec, creation_ms, started_ms, finished_ms, cancel_requested "
            "FROM batches WHERE batch_id=?",
            (batch_id,),
        )
        if not rows:
            return None
        namespace, name, version, digest, state, spec, creation_ms, started_ms, finished_ms, cancel_requested = rows[0]
        spec = json.loads(spec)
        batch = _Batch(
            batch_id=batch_id,
            name=name,
            version=version,
            digest=digest,
            state=state,
            parallel=spec.get("parallel"),
            retries=spec.get("retries", 0),
            timeout_s=spec.get("timeout_s"),
            creation_ms=creation_ms,
            chunks=[],
            namespace=namespace,
            started_ms=started_ms,
            finished_ms=finished_ms,
            cancel_requested=bool(cancel_requested),
            # Revisions only live in memory; starting from the clock keeps a client's last seen
            # revision older than any after a restart, so its long poll still returns on change.
            revision=time.time_ns() // 1000,
        )
        for idx, row_start, row_end, cstate, job_id, attempts, failure in self.store.query(
            "SELECT idx, row_start, row_end, state, job_id, attempts, failure FROM batch_chunks WHERE batch_id=? ORDER BY idx",
            (batch_id,),
        ):
            chunk = _Chunk(
                idx, row_start, row_end, cstate, job_id, attempts, 0, None if failure is None else json.loads(failure)
            )
            if cstate == DONE:
                chunk.rows_done = chunk.rows
                batch.rows_finished += chunk.rows
            batch.counts[cstate] += 1
            batch.chunks.append(chunk)
        return batch

    def _activate(self, batch: _Batch) -> None:
        """Track a loaded batch in memory: which chunks have live jobs, which wait to be submitted."""
        self._batches[batch.batch_id] = batch
        for chunk in batch.chunks:
            if chunk.state in (PENDING, IN_PROGRESS):
                if chunk.job_id is not None:
                    batch.live.add(chunk.idx)
                    self._by_job[chunk.job_id] = (batch.batch_id, chunk.idx)
                else:
                    batch.waiting.append(chunk.idx)

    def _forget(self, batch: _Batch) -> None:
        self._batches.pop(batch.batch_id, None)
        for chunk in batch.chunks:
            if chunk.job_id is not None and self._by_job.get(chunk.job_id, (None,))[0] == batch.batch_id:
                del self._by_job[chunk.job_id]

    def _changed(self, batch: _Batch) -> None:
        """Wake long polls and publish a (coalesced) `batch` event."""
        batch.revision += 1
        futures = self._waiters.pop(batch.batch_id, None)
        loop = self.core._loop
        if futures and loop is not None:

            def wake() -> None:
                for future in futures:
                    if not future.done():
                        future.set_result(None)

            try:
                loop.call_soon_threadsafe(wake)
            except RuntimeError:
                pass
        now = time.monotonic()
        since = now - self._emitted.get(batch.batch_id, 0.0)
        if batch.state in _TERMINAL or since >= BATCH_EVENT_INTERVAL_S:
            self._emitted[batch.batch_id] = now
            self._held.discard(batch.batch_id)
            self.core.bus.publish("batch", None, _dumps(self._wire(batch, include_chunks=False)), batch.namespace)
            if batch.state in _TERMINAL:
                self._emitted.pop(batch.batch_id, None)
        elif batch.batch_id not in self._held and loop is not None:
            self._held.add(batch.batch_id)
            try:
                loop.call_soon_threadsafe(loop.call_later, BATCH_EVENT_INTERVAL_S - since, self._flush, batch.batch_id)
            except RuntimeError:
                pass

    def _flush(self, batch_id: str) -> None:
        with self.core._lock:
            if batch_id not in self._held:
                return
            self._held.discard(batch_id)
            batch = self._batches.get(batch_id)
            if batch is not None:
                self._emitted[batch_id] = time.monotonic()
                self.core.bus.publish("batch", None, _dumps(self._wire(batch, include_chunks=False)), batch.namespace)

    def _wire(self, batch: _Batch, *, include_chunks: bool) -> dict:
        rows_running = sum(batch.chunks[i].rows_done for i in batch.live) if batch.live else 0
        counts = {
            state: batch.counts[state]
            for state in (PENDING, IN_PROGRESS, DONE, FAILED, CANCELLED)
            if batch.counts[state]
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
        if batch.namespace is not None:
            wire["namespace"] = batch.namespace
        if batch.timeout_s is not None:
            wire["timeout_s"] = batch.timeout_s
        if batch.started_ms is not None:
            wire["started_ms"] = batch.started_ms
        if batch.finished_ms is not None:
            wire["finished_ms"] = batch.finished_ms
        if batch.reused_chunks:
            wire["reused_chunks"] = batch.reused_chunks
        if batch.cancel_requested:
            wire["cancel_requested"] = True
        failed = next((c for c in batch.chunks if c.state in (FAILED, TIMED_OUT)), None)
        if failed is not None and failed.failure:
            wire["failure"] = {
                "chunk": failed.idx,
                "row_start": failed.row_start,
                "row_end": failed.row_end,
                **failed.failure,
            }
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
