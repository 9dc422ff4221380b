"""Batches: one `map` fanned out as chunk jobs over a GPU class (docs/ARCHITECTURE.md, "Batches").

A batch owns its input cut into chunks (rows stored per chunk) and submits each chunk as an
ordinary ``run_function`` job of the same version through the intake (``Intake.admit``), so chunks wait in
the class's FIFO like any job.  ``parallel`` bounds how many chunk jobs exist (pending or running)
at once; ``None`` ("auto") submits every chunk and lets the class's GPUs bound it.

State rule (a batch follows its chunks): PENDING until a chunk runs, IN_PROGRESS while any chunk is
pending or running, then — once no chunk is left to run — CANCELLED if cancel was asked, FAILED if
a chunk failed after its retries, else DONE.  A failed chunk does not stop the others: every finished
chunk's result is kept and ``retry`` runs only what did not finish.

Durability: a chunk's job id and attempt count are written in the same transaction as the job, and a
chunk's outcome is read back from its job on start (``recover``), so a control plane killed at any
point resumes the batch with no row lost and none counted twice (a job's result is one write).

Runs in the control plane, the batches' state under the job table's lock: job changes arrive as a
watcher of the journal (``JobJournal.persist``; ``plane.py`` registers ``on_job``).  Work that is O(N)
over a batch never takes the lock in one hold: a new batch's rows are written before it is recorded,
finished batches are read from the store without it, and chunks are submitted, reset and cancelled in
slices with a rest between them (a thread per batch submits, ``_drain``; docs/ARCHITECTURE.md, "Batches").

A batch's state in memory and its wire form are in ``state.py`` (pure), its tables in
``store.py``; a backfill's checks, plan, state and tables in ``backfill.py``, its DONE chunks and
fragment commits in ``commits.py`` (``FragmentCommits``, which calls back through ``BatchHooks``).

Over 600 lines: one concern, a batch's chunk jobs under the lock (create, submit in slices,
follow, cancel, retry, recover), whose steps share the batch's state and the lock.
"""

from __future__ import annotations

import asyncio
import builtins  # list() below shadows the type in annotations
import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from lancefn_jupyter.server.batches.backfill import BackfillRun, BackfillStore, Fragment, prepare, table_key
from lancefn_jupyter.server.batches.commits import BatchHooks, FragmentCommits
from lancefn_jupyter.server.batches.state import (
    GIVEN_UP,
    MAX_CHUNKS,
    MAX_RETRIES,
    SETUP_PHASES,
    BatchRun,
    Chunk,
    batch_as_job,
    batch_wire,
    check_chunks,
    check_request,
    cut,
    input_digest,
    split_arrow_chunks,
)
from lancefn_jupyter.server.batches.store import BATCH_SCHEMA, BatchStore
from lancefn_jupyter.server.control.catalog import FunctionCatalog
from lancefn_jupyter.server.control.dialect import batch_event_row
from lancefn_jupyter.server.control.event_filter import kept_rows
from lancefn_jupyter.server.control.events import EventBus
from lancefn_jupyter.server.control.intake import BatchChunk, Intake, JobRequest
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.machine import JobMachine
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.results import Results
from lancefn_jupyter.server.control.rows import check_init, init_of_binding
from lancefn_jupyter.server.control.states import (
    CANCELLED,
    DONE,
    FAILED,
    IN_PROGRESS,
    PENDING,
    TERMINAL,
    TIMED_OUT,
    now_ms,
)
from lancefn_jupyter.server.control.waiters import Waiters
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.executors.table_agent import TableAccessError, TableAgents
from lancefn_jupyter.server.policy.namespaces import DEFAULT_NAMESPACE, visible
from lancefn_jupyter.server.policy.table_roots import TableRoots
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.tables.plan import slice_rows
from lancefn_jupyter.wire.backfill_models import BackfillRequest
from lancefn_jupyter.wire.models import canonical_json

__all__ = ["BATCH_SCHEMA", "MAX_CHUNKS", "MAX_RETRIES", "BatchManager"]

log = logging.getLogger("lancefn.server")

BATCH_EVENT_INTERVAL_S = 0.2  # batch events are coalesced per batch; terminal ones go out at once


# The rows of the batch being created, by chunk: its first submissions use these instead of
# reading them back (None: the chunks' rows are read from the batch's tables).
FreshRows = list | None


def new_batch(
    name: str, version: str, digest: str, parallel: int | None, retries: int, timeout_s: float | None, namespace: str
) -> BatchRun:
    """A new, empty batch (its chunks are added next)."""
    return BatchRun(
        batch_id=uuid.uuid4().hex,
        name=name,
        version=version,
        digest=digest,
        state=PENDING,
        parallel=parallel,
        retries=retries,
        timeout_s=timeout_s,
        creation_ms=now_ms(),
        chunks=[],
        namespace=namespace,
    )


class BatchManager:
    def __init__(
        self,
        table: JobTable,
        *,
        store: Store,
        data: DataStore,
        bus: EventBus,
        catalog: FunctionCatalog,
        jobs: JobQueries,
        machine: JobMachine,
        intake: Intake,
        results: Results,
        table_roots: TableRoots | None = None,
        table_agents: TableAgents | None = None,
    ) -> None:
        """``table_roots``: where each namespace's backfills may open tables (default: anywhere); ``table_agents``:
        who does a team's table I/O on a shared server (docs/ARCHITECTURE.md, "Backfills", "Which tables")."""
        self.table, self.store, self.data, self.bus = table, store, data, bus
        self.catalog, self.jobs, self.machine, self.results = catalog, jobs, machine, results
        self.intake = intake  # the door the chunk jobs go in by
        self.table_roots = table_roots or TableRoots()
        self.table_agents = table_agents or TableAgents()
        self.saved = BatchStore(store)
        self.backfills = BackfillStore(store)
        self._batches: dict[str, BatchRun] = {}  # active batches (terminal ones are read from the store)
        hooks = BatchHooks(
            batch=self._batches.get,
            rerun=self._rerun,
            stop=self._stop_chunks,
            advance=self._follow_up,
            changed=self._changed,
        )
        self.commits = FragmentCommits(
            table,
            store=store,
            saved=self.saved,
            backfills=self.backfills,
            jobs=jobs,
            data=data,
            results=results,
            table_agents=self.table_agents,
            hooks=hooks,
        )
        self._by_job: dict[str, tuple[str, int]] = {}  # live chunk job → (batch, chunk)
        self._waiters = Waiters(table.lock)
        self._emitted: dict[str, float] = {}
        self._held: set[str] = set()
        self._draining: set[str] = set()  # batches whose due chunks a thread is submitting (_drain)
        self._resetting: set[str] = set()  # batches a retry is resetting, slice by slice: not finished meanwhile
        self._recovered = False

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
        init: Any = None,
    ) -> dict:
        """Validate everything, then record the batch and submit its first chunks (nothing is
        created when any check fails).  Same version + same input (+ same cut) and not ``fresh``:
        the latest such batch is reused — finished chunks kept, the rest run again.
        ``arrow_rows``: the path of an Arrow IPC stream, one record batch per chunk, instead of
        JSON ``chunks`` (checked against the signature like a ``functions/run`` body)."""
        # The version the caller means (namespaces, as for functions/run); the batch lives in its namespace.
        fv, namespace = self.catalog.runnable(name, version, namespace=namespace, scope=scope, home=home)
        if arrow_rows is not None:
            try:
                self.data.check_rows(arrow_rows, fv.signature.inputs, f"{fv.name}@{fv.version}")
            except ValueError as error:
                raise ApiError(400, str(error)) from None
            chunks = split_arrow_chunks(arrow_rows)
        check_request(chunks, parallel, retries)
        self._check_timeout(timeout_s)
        encoded = check_chunks(fv, chunks)
        init = check_init(fv, init)
        # Other initialization values are another input: a batch of them is never resumed as this one.
        digest = input_digest(encoded if init is None else [*encoded, canonical_json(init)])
        previous = None
        if not fresh:
            with self.table.lock:
                previous = self.saved.find(namespace, name, version, digest)
        if previous is not None:
            batch, kept = self._retry(previous)  # in slices itself
            with self.table.lock:
                batch.reused_chunks = kept
            return {"batch_id": batch.batch_id, "reused_chunks": kept}
        with self.table.lock:  # before its chunks are written; _start checks again, to be sure
            self._check_quota(namespace, len(chunks))
        batch = new_batch(name, version, digest, parallel, retries, timeout_s, namespace)
        batch.init = init
        for chunk in cut(chunks):
            batch.add_chunk(chunk)
        self._write_chunks(batch, encoded)
        with self.table.lock:
            self._start(batch, chunks)
        return {"batch_id": batch.batch_id, "reused_chunks": 0}

    def create_backfill(
        self,
        request: BackfillRequest,
        *,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        """A backfill (docs/ARCHITECTURE.md, "Backfills"): check the request against the function
        and the table, plan the rows (outside the lock: it scans the table), then record the batch
        and submit its first chunks. One unfinished backfill per (table, into): else a 409."""
        fv, namespace = self.catalog.runnable(
            request.name, request.version, namespace=namespace, scope=scope, home=home
        )
        self._check_timeout(request.timeout_s)
        init = check_init(fv, backfill_init(request))
        uri = table_key(request.table_uri)
        refused = self.table_roots.problem(uri, scope, admin=scope is None)
        if refused:  # before the table is opened: its existence is none of this caller's business
            raise ApiError(403, refused)
        root = self.table_roots.own_root(uri, scope, admin=scope is None)
        open_source = None
        if root is not None:  # the team's rights: its tree checked, then opened by its root owner's agent
            try:
                self.table_agents.agent(root)
                self.table_agents.check(root, uri)
            except TableAccessError as error:
                raise ApiError(error.status, str(error)) from None
            open_source = functools.partial(self._agent_source, root)
        self._refuse_second(uri, request.into)
        prepared = prepare(fv, request, uri, open_source=open_source, root=root)
        with self.table.lock:  # before its chunks are written; _start checks again, to be sure
            self._check_quota(namespace, len(prepared.slices))
        run = BackfillRun(prepared.spec, {fid: Fragment(idxs) for fid, idxs in prepared.fragments.items()})
        batch = new_batch(
            request.name,
            request.version,
            prepared.digest,
            request.parallel,
            request.retries,
            request.timeout_s,
            namespace,
        )
        batch.backfill = run
        batch.init = init
        start = 0
        for idx, piece in enumerate(prepared.slices):
            count = slice_rows(piece.ranges)
            batch.add_chunk(Chunk(idx, start, start + count))
            start += count
        self._write_chunks(batch, [dumps(piece.to_wire()) for piece in prepared.slices])
        with self.table.lock:
            try:
                self._refuse_second(uri, request.into)
            except ApiError:
                self.saved.delete_chunks(batch.batch_id)
                raise
            self._start(batch, prepared.slices, run)
        return {
            "batch_id": batch.batch_id,
            "rows_total": batch.rows_total,
            "chunks_total": len(batch.chunks),
            "table_version": run.spec.table_version,
        }

    def _agent_source(self, root: str, uri: str) -> Any:
        """The table as its root owner's agent opens it (a failure of the agent: a 503 saying why)."""
        try:
            return self.table_agents.plan_source(root, uri)
        except TableAccessError as error:
            raise ApiError(error.status, str(error)) from None

    def _check_timeout(self, timeout_s: float | None) -> None:
        """400 when the chunks' ``timeout_s`` is longer than the server's maximum job run time ("Scheduling")."""
        too_long = self.machine.limits.timeout_problem(timeout_s)
        if too_long:
            raise ApiError(400, too_long)

    def _check_quota(self, namespace: str, chunks: int) -> None:
        """429 when one more unfinished batch of ``chunks`` chunks would pass ``namespace``'s quotas (lock held):
        the batches it holds unfinished (backfills included) and their chunks, all of which stay in memory until the
        batch finishes (docs/ARCHITECTURE.md, "Batches"). O(unfinished batches)."""
        held = [batch for batch in self._batches.values() if batch.namespace == namespace]
        problem = self.machine.limits.batch_problem(namespace, len(held), sum(len(b.chunks) for b in held), chunks)
        if problem:
            raise ApiError(429, problem, "quota_exceeded")

    def _write_chunks(self, batch: BatchRun, encoded: list) -> None:
        """A new batch's chunks and rows, in slices without the job table's lock (nothing reads them yet)."""
        for first in range(0, len(batch.chunks), WRITE_SLICE):
            start = time.perf_counter()
            self.saved.insert_chunks(batch, encoded, first, first + WRITE_SLICE)
            _rest(time.perf_counter() - start)

    def _start(self, batch: BatchRun, chunks: list, run: BackfillRun | None = None) -> None:
        """Record a new batch (and its backfill) over its written chunks and submit its first slice of
        chunks, as one change: a chunk refused there fails the request and nothing of the batch is kept
        (lock held).  What makes a chunk refused (the version, its placement, the namespace's cap) is the
        same for every chunk, so the later slices (``_drain``) pass too unless the version is dropped meanwhile."""
        batch.waiting.extend(range(len(chunks)))
        try:
            self._check_quota(batch.namespace or DEFAULT_NAMESPACE, len(batch.chunks))
            with self.store.batch():
                self.saved.insert(batch)
                if run is not None:
                    self.backfills.insert(batch.batch_id, run)
                self._batches[batch.batch_id] = batch
                try:
                    more = self._advance(batch, fresh=chunks, strict=True)
                except BaseException:
                    self._forget(batch)
                    raise
        except BaseException:
            self.saved.delete_chunks(batch.batch_id)
            raise
        if more:
            self._kick(batch)  # the rest from the batch's tables: the reply does not wait for them
        self._changed(batch)

    def _refuse_second(self, uri: str, into: str) -> None:
        running = self.backfills.unfinished(uri, into)
        if running is not None:
            raise ApiError(
                409,
                f"backfill {running} of column {into!r} in {uri} is still running; wait for it, attach to it "
                f"(Backfill.attach({running!r})) or cancel it (POST /v1/batches/cancel) before starting another",
            )

    def backfill_errors(self, batch_id: str, offset: int, limit: int, scope: str | None = None) -> dict:
        """The rows a backfill skipped (``on_error="skip"``), in row id order."""
        batch, _ = self._find(batch_id, scope)
        if batch.backfill is None:
            raise ApiError(400, f"batch {batch_id} is not a backfill; its failures are in POST /v1/batches/describe")
        errors, total = self.backfills.errors(batch_id, offset, limit)
        return {"errors": errors, "total": total}

    def describe(self, batch_id: str, *, include_chunks: bool = True, scope: str | None = None) -> dict:
        return self._wire(*self._find(batch_id, scope), include_chunks=include_chunks)

    def list(self, *, state: str | None, name: str | None, limit: int, scope: str | None = None) -> dict:
        ids = self.saved.ids(scope=scope, state=state, name=name, limit=limit)
        return {"batches": [self._wire(*self._find(i), include_chunks=False) for i in ids]}

    def page_as_jobs(
        self, *, state: str | None, name: str | None, before: int | None, limit: int, scope: str | None = None
    ) -> builtins.list[tuple[int, dict]]:
        """``(seq, job envelope)`` of batches and backfills newest first, below ``before`` when given, for
        ``jobs/list`` (a paused one is stored unfinished; the caller keeps the rows of the state it asked for)."""
        states = (PENDING, IN_PROGRESS) if state == "PAUSED" else (state,) if state else None
        found = self.saved.page(scope=scope, states=states, name=name, before=before, limit=limit)
        return [(seq, batch_as_job(self._wire(*self._find(i), include_chunks=False))) for seq, i in found]

    def _find(self, batch_id: str, scope: str | None = None) -> tuple[BatchRun, bool]:
        """``(batch, active)`` as ``_get`` finds it, without the lock held: a finished batch is read from the
        store (O(its chunks)) while others go on."""
        with self.table.lock:
            batch = self._batches.get(batch_id)
        if batch is None:
            loaded = self._load(batch_id)
            with self.table.lock:
                batch = self._batches.get(batch_id)  # a retry may have activated it meanwhile
            if batch is None:
                if loaded is None or not visible(scope, loaded.namespace):
                    raise _not_found(batch_id)
                return loaded, False
        if not visible(scope, batch.namespace):
            raise _not_found(batch_id)
        return batch, True

    def _wire(self, batch: BatchRun, active: bool, *, include_chunks: bool) -> dict:
        if not active:  # a copy read from the store: no other thread has it
            return batch_wire(batch, include_chunks=include_chunks)
        with self.table.lock:
            return batch_wire(batch, include_chunks=include_chunks)

    def cancel(self, batch_id: str, scope: str | None = None) -> dict:
        """Cancel every chunk still pending or running; finished chunks keep their results."""
        with self.table.lock:
            batch = self._get(batch_id, scope)
            if batch.state in TERMINAL:
                return {"batch_id": batch_id, "cancelled": False}
            batch.cancel_requested = True  # from here no chunk is submitted or re-queued
            with self.store.batch():
                self.saved.save_batch(batch)
                self.saved.record(batch, batch.state, "cancel requested")
            # Queued jobs first, placed ones last: their devices are freed only once nothing of the
            # batch is left to take them.
            live = batch.live_jobs()
            pending = self.table.scheduler.is_pending
            live = [j for j in live if pending(j)] + [j for j in live if not pending(j)]
        # In slices of CANCEL_SLICE chunks, the lock released between them, so that the event loop
        # and other teams' jobs are never held up for more than one slice (docs/ARCHITECTURE.md,
        # "Batches": cancel).  O(N) over the batch in all.
        # A slice ends early, after at least one chunk, once another thread has waited the lock's grace (as for submits).
        while batch.waiting:
            start = time.perf_counter()
            with self.table.lock, self.store.batch():
                slice_size = min(CANCEL_SLICE, len(batch.waiting))
                for done in range(slice_size):
                    if done and self.table.lock.overdue():
                        break
                    self._set_chunk(batch, batch.chunks[batch.waiting.popleft()], CANCELLED)
                else:
                    done = slice_size
            _rest(time.perf_counter() - start, done < slice_size)
        first = 0
        while first < len(live):
            start = time.perf_counter()
            with self.table.lock, self.store.batch():
                group = live[first : first + CANCEL_SLICE]
                handled = self.machine.cancel_all(group, yield_to_waiters=True)  # their hook marks each chunk
            first += handled
            _rest(time.perf_counter() - start, handled < len(group))
        with self.table.lock:
            with self.store.batch():
                self._advance(batch)
            self._changed(batch)
            return {"batch_id": batch_id, "cancelled": True}

    def pause(self, batch_id: str, scope: str | None = None) -> dict:
        """No new chunk starts; running chunks finish and are kept (docs/ARCHITECTURE.md, "Batches": pause). The reply
        is LanceDB 0.40's (``paused``: this call paused it; ``committing``: a backfill's commit is under way) and the
        batch's wire form."""
        with self.table.lock:
            batch = self._get(batch_id, scope)
            if batch.state in TERMINAL:
                raise ApiError(409, f"batch {batch_id} has ended ({batch.state}); there is nothing to pause")
            newly = not batch.paused
            if newly:
                batch.paused = True
                with self.store.batch():
                    self.saved.save_spec(batch)
                    self.saved.record(batch, "PAUSED", "paused")
                self._changed(batch)
            committing = batch.backfill is not None and bool(batch.backfill.committing)
            return {"paused": newly, "committing": committing, "batch": batch_wire(batch, include_chunks=False)}

    def resume(self, batch_id: str, scope: str | None = None) -> dict:
        """A paused batch goes on: its waiting chunks start as the window allows. LanceDB 0.40's reply (``resumed``:
        this call resumed it; ``still_pausing`` is never true here: resuming takes effect at once)."""
        with self.table.lock:
            batch = self._get(batch_id, scope)
            resumed = batch.paused and batch.state not in TERMINAL
            if resumed:
                batch.paused = False
                with self.store.batch():
                    self.saved.save_spec(batch)
                    self.saved.record(batch, batch.state, "resumed")
                self._follow_up(batch)
                self._changed(batch)
            return {"resumed": resumed, "still_pausing": False, "batch": batch_wire(batch, include_chunks=False)}

    def events(
        self, batch_id: str, limit: int, scope: str | None = None, keep: Callable[[dict], bool] | None = None
    ) -> builtins.list[dict]:
        """A batch's or backfill's recorded changes (``BatchStore.record``) as LanceDB 0.40's event rows, oldest first:
        the first ``limit`` ``keep`` keeps. Another namespace's batch is the same 404 as a missing one."""
        with self.table.lock:
            batch = self._batches.get(batch_id)
        found, namespace = (True, batch.namespace) if batch is not None else self.saved.namespace(batch_id)
        if not found or not visible(scope, namespace):
            raise _not_found(batch_id)
        return kept_rows(
            lambda after, size: self.saved.events(batch_id, size, after=after),
            lambda seq, data: batch_event_row(seq, batch_id, json.loads(data)),
            limit,
            keep,
        )

    def describe_as_job(self, batch_id: str, scope: str | None = None) -> dict:
        """The batch or backfill as a job envelope (``state.batch_as_job``) for the jobs routes."""
        return batch_as_job(self.describe(batch_id, include_chunks=False, scope=scope))

    def retry(self, batch_id: str, scope: str | None = None) -> dict:
        """Run again every chunk that did not finish (failed or cancelled); finished ones are kept."""
        batch, _ = self._retry(batch_id, scope)
        with self.table.lock:
            return batch_wire(batch, include_chunks=False)

    def _retry(self, batch_id: str, scope: str | None = None) -> tuple[BatchRun, int]:
        """``retry``'s work: the batch and how many of its chunks had finished when it was reset (a redone
        chunk may finish before the caller looks again, so the count is taken here)."""
        found, _ = self._find(batch_id, scope)  # read without the lock (O(its chunks))
        with self.table.lock:
            batch = self._batches.get(batch_id) or found
            if batch is found and self.saved.ending(batch_id) != (found.state, found.finished_ms):
                batch = self._get(batch_id, scope)  # retried and finished again meanwhile: read it again
            redo = [c for c in batch.chunks if c.state in (FAILED, CANCELLED, TIMED_OUT)]
            kept_done = batch.counts[DONE]
            run = batch.backfill
            uncommitted = run is not None and any(not f.committed for f in run.fragments.values())
            if not redo and not (uncommitted and batch.state in TERMINAL):
                return batch, kept_done
            if batch.batch_id in self._resetting:
                return batch, kept_done  # another retry is at it
            if batch.batch_id not in self._batches:  # unfinished again: it counts in its namespace's quota
                self._check_quota(batch.namespace or DEFAULT_NAMESPACE, len(batch.chunks))
                self._activate(batch)
            self._resetting.add(batch.batch_id)
            with self.store.batch():
                batch.cancel_requested = False
                batch.state, batch.finished_ms = (IN_PROGRESS if batch.started_ms else PENDING), None
                # A retry starts the setup-failure rule afresh: DONE chunks forget theirs.
                kept = [c for c in batch.chunks if c.failure is not None and c.state == DONE]
                for chunk in kept:
                    chunk.failure = None
                self.saved.save_chunks(batch, kept)
                if run is not None:  # the skip limit and a failed commit start afresh too
                    run.failure, run.commit_failure = None, None
                    self.backfills.save(batch.batch_id, run)
                self.saved.save_batch(batch)
                self.saved.record(batch, batch.state, "retried")
        try:
            # In slices as for cancel; meanwhile _advance does not finish the batch (_resetting).
            for first in range(0, len(redo), RESET_SLICE):
                start = time.perf_counter()
                with self.table.lock, self.store.batch():
                    if batch.cancel_requested:
                        break  # cancelled meanwhile: the chunks not reset yet stay as they are
                    chunks = [c for c in redo[first : first + RESET_SLICE] if c.state in GIVEN_UP]
                    for chunk in chunks:
                        chunk.attempts, chunk.failure = 0, None
                        batch.move(chunk, PENDING)
                        batch.waiting.append(chunk.idx)
                    self.saved.save_chunks(batch, chunks)  # one statement per slice
                _rest(time.perf_counter() - start)
        finally:
            with self.table.lock:
                self._resetting.discard(batch.batch_id)
                if run is not None:
                    self.commits.queue(batch)
                self._follow_up(batch)
                self._changed(batch)
        return batch, kept_done

    async def wait(self, batch_id: str, timeout_s: float, revision: int | None, scope: str | None = None) -> dict:
        """The batch once terminal or (with ``revision``) newer than it, or as it stands when
        ``timeout_s`` passes (long poll like ``jobs/wait``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            with self.table.lock:
                batch = self._get(batch_id, scope)
                newer = revision is not None and batch.revision > revision
                left = deadline - loop.time()
                if newer or batch.state in TERMINAL or left <= 0 or not self.table.started:
                    return batch_wire(batch, include_chunks=True)
                future = self._waiters.add(batch_id, loop)
            await self._waiters.wait(batch_id, future, left)

    # ------------------------------------------------------- journal hooks

    def recover(self) -> None:
        """On start (lock held, after the machine re-queued its jobs): load unfinished batches and
        read each live chunk's outcome from its job, then submit what is due."""
        self.saved.drop_orphans()
        for batch_id in self.saved.unfinished_ids():
            batch = self._load(batch_id)
            assert batch is not None  # the query just listed it
            self._activate(batch)
            if batch.backfill is not None:  # chunks DONE before the stop: their fragments commit (again)
                self.commits.queue(batch)
            for idx in sorted(batch.live):
                chunk = batch.chunks[idx]
                rec = self.jobs.record(chunk.job_id) if chunk.job_id else None
                if rec is None:  # the job never got saved: run the chunk again
                    batch.live.discard(idx)
                    chunk.job_id = None
                    self._set_chunk(batch, chunk, PENDING)
                    batch.waiting.appendleft(idx)
                else:
                    self._job_changed(batch, chunk, rec)
            self._follow_up(batch)  # the rest once recovery releases the lock
        self._recovered = True
        self.commits.start()

    def has_work(self) -> bool:
        """Whether a batch is active (chunks to run or running): the server is not idle ("Embedded server idle exit")."""
        return bool(self._batches)

    def close(self) -> None:
        """Stop the committer (commits waiting for chunks give up; one writing finishes)."""
        self.commits.stop()

    def on_job(self, rec: JobRecord) -> None:
        """A job changed (a journal watcher, called once the change is saved): follow it if it is a chunk's."""
        if "batch_id" not in rec.spec or not self._recovered:
            return  # recover() reads every chunk job's state once the batches are loaded
        where = self._by_job.get(rec.job_id)
        if where is None:
            return
        batch = self._batches.get(where[0])
        if batch is None:
            return
        try:
            self._job_changed(batch, batch.chunks[where[1]], rec)
            self._follow_up(batch)
            self._changed(batch)
        except Exception:  # never into the journal's job bookkeeping; the batch re-reads on restart
            log.exception("batch %s: could not follow job %s", batch.batch_id, rec.job_id)

    # ---------------------------------------------------------------- internals

    def _job_changed(self, batch: BatchRun, chunk: Chunk, rec: JobRecord) -> None:
        if chunk.job_id != rec.job_id:
            return  # an earlier attempt
        chunk.rows_done = rec.rows_done or 0
        state = rec.state
        if state == IN_PROGRESS and batch.started_ms is None:
            batch.started_ms = rec.started_ms or now_ms()
            batch.state = IN_PROGRESS
            with self.store.batch():
                self.saved.save_batch(batch)
                self.saved.record(batch, IN_PROGRESS, "started", at_ms=batch.started_ms)
        if state not in TERMINAL:
            if state != chunk.state:
                self._set_chunk(batch, chunk, state, rec if state == IN_PROGRESS else None)
            return
        batch.live.discard(chunk.idx)
        self._by_job.pop(rec.job_id, None)
        usage = self.jobs.reports.job_usage(rec)
        if usage is not None:
            batch.add_spent(usage, chunk.rows if state == DONE else rec.rows_done or 0)
        if state == DONE:
            chunk.rows_done = chunk.rows
            self._set_chunk(batch, chunk, DONE, rec)
            if batch.backfill is not None:
                self.commits.chunk_done(batch, chunk, rec)
            return
        # The failing rows and remote frames stay with the chunk's job ("Debugging a failure"): a batch's reply
        # carries every chunk's failure, so it keeps the rest only.
        failure = {k: v for k, v in (rec.failure or {}).items() if k not in ("rows", "frames")}
        failure.setdefault("phase", "timeout" if state == TIMED_OUT else "run")
        failure.setdefault("message", "the chunk's job ended without a failure message")
        setup = state != CANCELLED and failure["phase"] in SETUP_PHASES
        setup_failed_before = setup and batch.setup_failed()  # read before this failure is kept
        chunk.failure = {**failure, "job_id": rec.job_id}
        if state == CANCELLED:
            self._set_chunk(batch, chunk, CANCELLED, rec)
        elif setup and setup_failed_before:
            self._set_chunk(batch, chunk, FAILED, rec)
            self._stop_after_setup(batch)
        elif setup and not batch.cancel_requested:
            # One more try whatever `retries` says: the executor retired the worker, so it lands on a
            # fresh one; a second failed setup stops the batch (docs/ARCHITECTURE.md, "Warm state").
            chunk.job_id, chunk.rows_done = None, 0
            self._set_chunk(batch, chunk, PENDING, rec)
            batch.waiting.appendleft(chunk.idx)
        elif chunk.attempts <= batch.retries and not batch.cancel_requested:
            chunk.job_id, chunk.rows_done = None, 0
            self._set_chunk(batch, chunk, PENDING, rec)
            batch.waiting.appendleft(chunk.idx)  # first in line among this batch's chunks
        else:
            self._set_chunk(batch, chunk, FAILED, rec)

    def _stop_after_setup(self, batch: BatchRun) -> None:
        """A second chunk setup failed: the version's setup is broken, so the batch fails now (it is
        FAILED, not CANCELLED: nobody asked to cancel) and its failure is that setup's.  Waiting
        chunks are cancelled, and so are the live chunks' jobs (their hook marks each chunk; one
        the hook cannot reach, during recovery, is marked here)."""
        self._stop_chunks(batch)

    def _stop_chunks(self, batch: BatchRun) -> None:
        """Cancel the batch's waiting chunks and its live chunks' jobs (it fails, nobody asked to cancel)."""
        while batch.waiting:
            self._set_chunk(batch, batch.chunks[batch.waiting.popleft()], CANCELLED)
        live = batch.live_jobs()
        self.machine.cancel_all(live)
        for job_id in live:
            where, rec = self._by_job.get(job_id), self.jobs.record(job_id)
            if where is not None and rec is not None and rec.state in TERMINAL:
                self._job_changed(batch, batch.chunks[where[1]], rec)

    def _advance(self, batch: BatchRun, fresh: FreshRows = None, *, strict: bool = False) -> bool:
        """Submit up to SUBMIT_SLICE chunks while the window has room (fewer once another thread has waited
        the lock's grace for it: at least one); finish the batch when nothing is left to run.  True when more chunks are due
        now (``_drain`` or ``_kick`` submits them, the lock released between slices).  ``fresh``: the rows of the batch being created (read from its
        tables otherwise); ``strict``: a refused chunk fails the request (nothing is kept)."""
        if batch.state in TERMINAL:
            return False
        window = batch.parallel or len(batch.chunks)
        if batch.waiting and len(batch.live) < window and not batch.cancel_requested and not batch.paused:
            with self.store.batch():
                for submitted in range(SUBMIT_SLICE):
                    if not (batch.waiting and len(batch.live) < window):
                        break
                    if submitted and self.table.lock.overdue():
                        return True  # another thread has waited its grace for the lock: the rest after it
                    chunk = batch.chunks[batch.waiting.popleft()]
                    try:
                        self._submit(batch, chunk, fresh)
                    except ApiError as error:
                        if strict:
                            raise  # creating the batch: the request fails and nothing is kept
                        # E.g. the version was dropped since: the chunk fails, saying why.
                        chunk.failure = {"phase": "validation", "message": error.message}
                        self._set_chunk(batch, chunk, FAILED)
                else:
                    if batch.waiting and len(batch.live) < window:
                        return True
        if batch.live or batch.waiting or batch.batch_id in self._resetting:
            return False
        if batch.backfill is not None and batch.backfill.committing:
            return False  # DONE only once every fragment is committed ("Backfills", "State")
        batch.state = batch.outcome()
        batch.finished_ms = now_ms()
        with self.store.batch():
            self.saved.save_batch(batch)
            self.saved.record(batch, batch.state, "ended", at_ms=batch.finished_ms)
        self._forget(batch)
        return False

    def _drain(self, batch: BatchRun) -> None:
        """A thread: submit the batch's due chunks slice by slice, the lock free between two slices so that
        the event loop and other teams' jobs wait for one slice at most (O(N) in all; docs/ARCHITECTURE.md,
        "Batches")."""
        held, early = 0.0, False
        try:
            while True:
                _rest(held, early)
                with self.table.lock:
                    start = time.perf_counter()
                    due = len(batch.waiting)
                    # Stopping: what is left waits, saved, for the restart (recover).
                    more = self.table.started and self._advance(batch)
                    self._changed(batch)
                    held = time.perf_counter() - start
                    early = more and due - len(batch.waiting) < SUBMIT_SLICE  # ended for an overdue waiter
                    if not more:  # under the same hold as the last slice: a later _kick starts a new thread
                        self._draining.discard(batch.batch_id)
                        return
        except Exception:  # a thread of its own: say so; the rest is submitted on the next change or restart
            log.exception("batch %s: could not submit its chunks", batch.batch_id)
            with self.table.lock:
                self._draining.discard(batch.batch_id)

    def _follow_up(self, batch: BatchRun) -> None:
        """``_advance``, then the rest of what is due by a thread of the batch (``_kick``)."""
        if self._advance(batch):
            self._kick(batch)

    def _kick(self, batch: BatchRun) -> None:
        """More chunks are due than one slice (lock held): a thread submits them (``_drain``), one per batch."""
        if batch.batch_id not in self._draining:
            self._draining.add(batch.batch_id)
            threading.Thread(target=self._drain, args=(batch,), name=f"batch-{batch.batch_id[:8]}", daemon=True).start()

    def _chunk_rows(self, batch: BatchRun, chunk: Chunk, fresh: FreshRows) -> Any:
        """The chunk's rows: the new batch's own on their first submission, else as stored (a backfill's: its slice)."""
        if fresh is not None and chunk.attempts == 0:
            return fresh[chunk.idx]
        if batch.backfill is not None:
            return self.saved.chunk_slice(batch.batch_id, chunk.idx)
        return self.saved.chunk_rows(batch.batch_id, chunk.idx)

    def _submit(self, batch: BatchRun, chunk: Chunk, fresh: FreshRows) -> None:
        rows = self._chunk_rows(batch, chunk, fresh)
        arrow_rows = table_slice = on_error = None
        if batch.backfill is not None:  # a slice of the table: read where the chunk runs ("Running a chunk")
            table_slice, rows = rows, None
            if batch.backfill.spec.on_error != "fail":
                on_error = batch.backfill.spec.on_error
        elif isinstance(rows, bytes):
            # Arrow chunk: handed to its job as a rows file, the data plane's path for a functions/run body.
            from lancefn_jupyter.wire.dataplane import write_bytes_file

            arrow_rows, _ = self.data.new_rows_file()
            write_bytes_file(arrow_rows, rows, durable=False)
            rows = None
        chunk.attempts += 1
        with self.store.batch():
            # The job and the chunk's pointer to it commit together (see the module's durability note).
            try:
                job_id = self.intake.admit(
                    JobRequest(
                        batch.name,
                        batch.version,
                        {"namespace": batch.namespace, "home": batch.namespace},  # type: ignore[typeddict-item]
                        rows=rows,
                        arrow_rows=arrow_rows,
                        table_slice=table_slice,
                        timeout_s=batch.timeout_s,
                        chunk=BatchChunk(batch.batch_id, chunk.idx, chunk.row_start, on_error),
                        init=batch.init,
                    )
                ).job_id
            finally:
                if arrow_rows is not None and arrow_rows.exists():  # refused before the run took it
                    arrow_rows.unlink()
            chunk.job_id = job_id
            batch.live.add(chunk.idx)
            self._by_job[job_id] = (batch.batch_id, chunk.idx)
            self.saved.save_chunk(batch, chunk)
        rec = self.jobs.record(job_id)
        if rec is not None and rec.state != chunk.state:  # placed and started at once (hook ran before the mapping)
            self._job_changed(batch, chunk, rec)

    def _set_chunk(self, batch: BatchRun, chunk: Chunk, state: str, job: JobRecord | None = None) -> None:
        """``chunk`` is now in ``state``, saved; ``job``: its job started or ended, recorded with it (one commit)."""
        if chunk.state != state:
            batch.move(chunk, state)
        if job is None:
            self.saved.save_chunk(batch, chunk)
            return
        started = job.state == IN_PROGRESS
        with self.store.batch():
            self.saved.save_chunk(batch, chunk)
            if not started and batch.spent:  # its job ended: what it spent is in (``_job_changed``)
                self.saved.save_spent(batch)
            self.saved.record(
                batch,
                job.state,
                "chunk started" if started else "chunk ended",
                at_ms=job.started_ms if started else job.finished_ms,
                chunk=chunk,
                job=job,
            )

    def _get(self, batch_id: str, scope: str | None = None) -> BatchRun:
        """The batch, if the caller (``scope``: its namespace; None: the admin) may see it; else the same 404."""
        batch = self._batches.get(batch_id) or self._load(batch_id)
        if batch is None or not visible(scope, batch.namespace):
            raise _not_found(batch_id)
        return batch

    def _rerun(self, batch: BatchRun, chunk: Chunk) -> None:
        """A DONE chunk whose result is gone (removed by retention before it was kept): run it again."""
        log.warning("backfill %s: chunk %s's result is gone; running it again", batch.batch_id, chunk.idx)
        if chunk.job_id is not None:
            self._by_job.pop(chunk.job_id, None)
        chunk.job_id, chunk.rows_done, chunk.attempts = None, 0, 0
        self._set_chunk(batch, chunk, PENDING)
        batch.waiting.appendleft(chunk.idx)

    def _load(self, batch_id: str) -> BatchRun | None:
        batch = self.saved.load(batch_id)
        if batch is not None:
            batch.backfill = self.backfills.load(batch_id)
        return batch

    def _activate(self, batch: BatchRun) -> None:
        """Track a loaded batch in memory: which chunks have live jobs, which wait to be submitted."""
        self._batches[batch.batch_id] = batch
        for chunk in batch.chunks:
            if chunk.state in (PENDING, IN_PROGRESS):
                if chunk.job_id is not None:
                    batch.live.add(chunk.idx)
                    self._by_job[chunk.job_id] = (batch.batch_id, chunk.idx)
                else:
                    batch.waiting.append(chunk.idx)

    def _forget(self, batch: BatchRun) -> None:
        self._batches.pop(batch.batch_id, None)
        if batch.backfill is not None:
            self.commits.forget(batch.batch_id)
        for chunk in batch.chunks:
            if chunk.job_id is not None and self._by_job.get(chunk.job_id, (None,))[0] == batch.batch_id:
                del self._by_job[chunk.job_id]

    def _changed(self, batch: BatchRun) -> None:
        """Wake long polls and publish a (coalesced) `batch` event."""
        batch.revision += 1
        loop = self.table.loop
        self._waiters.wake(batch.batch_id, loop)
        now = time.monotonic()
        since = now - self._emitted.get(batch.batch_id, 0.0)
        if batch.state in TERMINAL or since >= BATCH_EVENT_INTERVAL_S:
            self._emitted[batch.batch_id] = now
            self._held.discard(batch.batch_id)
            self._publish(batch)
            if batch.state in TERMINAL:
                self._emitted.pop(batch.batch_id, None)
        elif batch.batch_id not in self._held and loop is not None:
            self._held.add(batch.batch_id)
            try:
                loop.call_soon_threadsafe(loop.call_later, BATCH_EVENT_INTERVAL_S - since, self._flush, batch.batch_id)
            except RuntimeError:
                pass

    def _flush(self, batch_id: str) -> None:
        with self.table.lock:
            if batch_id not in self._held:
                return
            self._held.discard(batch_id)
            batch = self._batches.get(batch_id)
            if batch is not None:
                self._emitted[batch_id] = time.monotonic()
                self._publish(batch)

    def _publish(self, batch: BatchRun) -> None:
        self.bus.publish("batch", None, dumps(batch_wire(batch, include_chunks=False)), batch.namespace)


CANCEL_SLICE = 32  # chunks cancelled per hold of the lock (batches/cancel)
SUBMIT_SLICE = 16  # chunks submitted per hold of the lock (creating, retrying and following a batch)
RESET_SLICE = 256  # chunks a retry resets per hold of the lock
WRITE_SLICE = 1000  # a new batch's chunk rows written per transaction (before the batch is recorded)
CANCEL_PAUSE_S = 0.001  # between two slices at least: the lock is free long enough for its waiters


def backfill_init(request: BackfillRequest) -> Any:
    """A backfill's init values as given: JSON ``init``, or a LanceDB binding's ``initialization`` row."""
    if request.initialization is None:
        return request.init
    if request.init is not None:
        raise ApiError(400, "give init (JSON) or initialization (a LanceDB binding's Arrow row), not both")
    return init_of_binding(request.initialization)


def _not_found(batch_id: str) -> ApiError:
    """The same 404 for a missing batch and another namespace's."""
    return ApiError(404, f"batch {batch_id} not found; list batches with POST /v1/batches/list")


def _rest(held_s: float, early: bool = False) -> None:
    """Between two slices, as long as the last one held the lock (and, being Python, the GIL): the event loop
    and other teams' requests get at least half of the time, whatever a slice costs on this machine. At least
    CANCEL_PAUSE_S, unless the slice ended early for a waiter (which gets the lock as it is let go): a floor
    after every one-chunk slice would cap a batch at a chunk per millisecond while jobs finish around it."""
    time.sleep(held_s if early else max(CANCEL_PAUSE_S, held_s))
