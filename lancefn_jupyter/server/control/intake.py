"""The intake: the one door every new job comes in by (docs/ARCHITECTURE.md, "REST details", "Intake"). A typed
request (:class:`JobRequest`; a registration's :class:`RegisterRequest`) goes in, the job's id comes out with the job
when the request waits for it (:class:`Admitted`). The intake picks the lane (:func:`choose_lane`), checks the
request, admits the job through its environment stage, adds it to the job table and the store, and has the placement
strategy (``placement.py``) queue or launch it; ``JobMachine`` takes it from there (launch, finish, cancel).

Two calls, one request type: :meth:`Intake.submit` on the event loop (a REST request: every lane, the group commit,
the inline wait) and :meth:`Intake.admit` on any other thread (a batch's chunk jobs under the batch's transaction, a
core thread's share of a lane). Runs in the control plane."""

from __future__ import annotations

import asyncio
import functools
import math
import time
import uuid
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple, overload

from lancefn_jupyter.server.control.catalog import FunctionCatalog, Prepared, Registration, Where
from lancefn_jupyter.server.control.environments import Admission, EnvironmentStage
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.machine import JobMachine
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.control.placement import NewJob, PlacementStrategy
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.rows import check_init, check_rows, take_arrow_rows
from lancefn_jupyter.server.control.states import PENDING, TERMINAL, now_ms
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.policy.limits import Limits
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.tables.plan import slice_rows
from lancefn_jupyter.wire.backfill_models import TableSlice
from lancefn_jupyter.wire.models import JobFailure

# How long a request's core thread follows a job it runs itself (the waiting lane): a quick job ends within it; a
# longer one goes to a task thread and the request waits on the event loop, so 40 requests waiting a minute each
# for slow jobs cannot hold every core thread (docs/ARCHITECTURE.md, "REST details").
INLINE_FOLLOW_S = 0.05
# The most JSON rows a run checks on the event loop (:meth:`Intake.admit_on_loop`): a longer list's check goes to a
# core thread.
ON_LOOP_MAX_ROWS = 64


class BatchChunk(NamedTuple):
    """The chunk of a batch (or backfill) a job runs: kept in its spec (docs/ARCHITECTURE.md, "Batches"). Its rows
    were checked with its batch."""

    batch_id: str
    chunk: int
    row_start: int
    on_error: str | None = None  # a backfill's "skip": a failing row gets a null result ("Batched functions")


class JobRequest(NamedTuple):
    """A job to start: the function version, its rows (JSON ``rows``, an Arrow IPC ``arrow_rows`` file, or a
    backfill chunk's ``table_slice``), and how the caller waits."""

    name: str
    version: str
    where: Where  # which namespace's version (``http.auth.pick``)
    rows: Any = None  # JSON rows, one {param: value} object per call; checked against the signature
    arrow_rows: Any = None  # the path of an Arrow IPC rows file (a streamed body, an upload, a batch's Arrow chunk)
    table_slice: TableSlice | None = None  # a backfill chunk's slice of its table ("Backfills")
    timeout_s: float | None = None
    wait_s: float | None = None  # the reply waits up to this long for the job to end (``functions/run``)
    small: bool = False  # its body was one the event loop parses (≤ ``INLINE_JSON_BYTES``): its rows may be too
    chunk: BatchChunk | None = None  # a batch's chunk job, saved by its batch's transaction (``admit`` only)
    init: Any = None  # a class entry's initialization values (LanceDB 0.40's ``signature.initialization``)


class RegisterRequest(NamedTuple):
    """A registration checked but not recorded (``FunctionCatalog.prepare``): its version and DONE job."""

    prepared: Prepared
    namespace: str
    lancedb: bool = False  # LanceDB 0.40's route: the job's result in its shape


class Admitted(NamedTuple):
    """The intake's answer: the job's id, its wire form once the request waited (the ended job, or as it stands),
    and how much of the wait is left (a core thread's share of the waiting lane)."""

    job_id: str
    job: dict | None = None
    wait_left_s: float = 0.0


class Lane(Enum):
    """How a request's job is admitted and answered (docs/ARCHITECTURE.md, "REST details")."""

    LOOP_WAITING = "queued on the event loop, a warm job run there, the reply waiting for it"
    CORE_WAITING = "queued on a core thread, a warm job run there for a while, the reply waiting for it"
    GROUPED = "queued on the event loop or in a core thread's round; saved with other requests' jobs"
    CORE = "queued and saved on a core thread"
    CHUNK = "a batch's chunk job: queued and saved on the batch's thread, in its transaction"


def choose_lane(request: JobRequest) -> Lane:
    """The lane ``request`` takes (pure). A lane on the loop falls back to its core-thread lane when the job table
    or the store is busy, or the version may need an environment."""
    if request.chunk is not None:
        return Lane.CHUNK
    json_rows = request.arrow_rows is None and request.table_slice is None
    if request.wait_s:
        return Lane.LOOP_WAITING if json_rows and request.small else Lane.CORE_WAITING
    return Lane.GROUPED if json_rows else Lane.CORE


class Intake:
    def __init__(
        self,
        table: JobTable,
        *,
        store: Store,
        data: DataStore,
        catalog: FunctionCatalog,
        environments: EnvironmentStage,
        journal: JobJournal,
        reports: Reports,
        jobs: JobQueries,
        machine: JobMachine,
        placement: PlacementStrategy,
        limits: Limits,
    ) -> None:
        self.table, self.store, self.data, self.catalog = table, store, data, catalog
        self.environments, self.journal, self.reports, self.jobs = environments, journal, reports, jobs
        self.machine, self.placement, self.limits = machine, placement, limits
        self._group = GroupCommit(self)

    # ----------------------------------------------------------------- the door

    @overload
    async def submit(self, request: JobRequest) -> Admitted: ...

    @overload
    async def submit(self, request: RegisterRequest) -> Registration: ...

    async def submit(self, request: JobRequest | RegisterRequest) -> Admitted | Registration:
        """(The event loop.) Admit a request's job by its lane: its id once it is saved; with ``wait_s``, the job
        too, once it ended or the wait is over (a job waiting for capacity or its environment is answered at once,
        saved first). A 4xx names what to change."""
        if isinstance(request, RegisterRequest):
            return await off_loop(self.catalog.record, request.prepared, request.namespace, request.lancedb)
        lane = choose_lane(request)
        if lane is Lane.LOOP_WAITING:
            job_id = self.admit_on_loop(request, waiting=True)
            if job_id is not None:
                return await self._wait(job_id, request.wait_s or 0.0)
            lane = Lane.CORE_WAITING
        if lane is Lane.CORE_WAITING:
            admitted = await off_loop(self.admit, request)
            if admitted.job is not None:
                return admitted
            return await self._wait(admitted.job_id, admitted.wait_left_s)
        if lane is Lane.GROUPED:
            job_id = await self._group.run(request)
        elif lane is Lane.CORE:
            job_id = (await off_loop(self.admit, request)).job_id
        else:
            raise ValueError("a chunk job is admitted by its batch (Intake.admit), under the batch's transaction")
        if request.wait_s is None:
            return Admitted(job_id)
        return Admitted(job_id, await self.jobs.wait(job_id, request.wait_s, None, unless_queued=True))

    def admit(self, request: JobRequest) -> Admitted:
        """(Any thread but the loop's.) Admit ``request``'s job here and now: saved before this returns (a chunk's,
        with its batch's transaction), except with ``wait_s``: then, when its version's worker is idle on the devices
        it gets, this thread runs the job itself (``Executor.launch_inline``) until it ends or ``INLINE_FOLLOW_S``
        passes, so a quick job's whole run takes no other thread; its JSON rows are saved with its first commit
        (``JobJournal.insert_with_first_commit``), its outcome when it ends within ``DEFER_COMMIT_S``, and the caller
        must :meth:`save_before_reply` one that has not ended before answering its id."""
        if not request.wait_s or request.chunk is not None:
            return Admitted(self._admit_here(request).rec.job_id)
        deadline = time.monotonic() + request.wait_s
        new = self._admit_here(request, insert_late=True, wants_inline=True)
        if new.inline is not None:  # followed here for a short while at most: a core thread never waits on a long job
            new.inline.run(min(deadline, time.monotonic() + INLINE_FOLLOW_S))
        job_id = new.rec.job_id
        with self.table.lock:
            rec = self.jobs.record(job_id)
            if rec is not None and rec.state in TERMINAL:  # saved with its outcome
                return Admitted(job_id, self.reports.job_wire(rec))
        return Admitted(job_id, None, max(0.0, deadline - time.monotonic()))

    async def _wait(self, job_id: str, wait_s: float) -> Admitted:
        """The waiting lanes' reply: the job once it ended or ``wait_s`` passed; one not ended is saved first."""
        job = await self.jobs.wait(job_id, wait_s, None, unless_queued=True)
        if job["job_state"] not in TERMINAL:  # its id goes out: saved first
            await off_loop(self.save_before_reply, job_id)
        return Admitted(job_id, job)

    def save_before_reply(self, job_id: str) -> None:
        """A job whose insert waited for its first commit is saved now, before its id is answered; if that fails (a
        full disk) the request fails, and the job is cancelled rather than run for nobody."""
        with self.table.lock:
            try:
                self.journal.flush(job_id)
            except BaseException:
                self.machine.cancel(job_id)
                raise

    # ------------------------------------------------------------ on the loop

    def admit_on_loop(self, request: JobRequest, *, waiting: bool = False) -> str | None:
        """Admit a job on the event loop, where nothing may wait or write: only when the job table and the store are
        free now, the rows are a short JSON list and the version needs no environment (docs/ARCHITECTURE.md, "REST
        details"); None: not now (a core thread's lane admits it). The job is saved by its group's commit
        (:meth:`save_on_loop`, :meth:`save_group`). An executor that queues its own jobs (Ray) gets it at once, which
        never waits (``Executor.launch``). ``waiting``: the waiting lane's job instead, saved with its first commit
        (its outcome, when it ends within ``DEFER_COMMIT_S``) or by :meth:`save_before_reply`; when its version's
        worker is idle, the loop starts the job there and follows it for ``wait_s`` but at most ``INLINE_FOLLOW_S``
        (``InlineRun.follow_on_loop``)."""
        rows = request.rows
        if not isinstance(rows, list) or len(rows) > ON_LOOP_MAX_ROWS:
            return None
        if not self.table.lock.acquire_now():
            return None
        try:
            if not self.store.acquire_now():  # a commit under way: a version read would wait for it
                return None
            try:
                rec, rows = self._record(request)
                if not self.environments.plain(rec):  # its admission may read the environment cache
                    return None
                admission = self.environments.admission(rec)
                new = self._enter(rec, rows, admission, insert_late=True, wants_inline=waiting, grouped=not waiting)
                if new.inline is not None:
                    new.inline.follow_on_loop(time.monotonic() + min(request.wait_s or 0.0, INLINE_FOLLOW_S))
                return rec.job_id
            finally:
                self.store.release()
        finally:
            self.table.lock.release()

    def admit_in_round(self, request: JobRequest) -> str:
        """(A core thread: the group's round.) Admit a grouped run the loop could not; saved by the round's commit."""
        return self._admit_here(request, insert_late=True, grouped=True).rec.job_id

    def save_on_loop(self, job_ids: list[str]) -> dict[str, BaseException] | None:
        """:meth:`save_group` on the event loop, only when the job table and the store are free now; None: not now."""
        if not self.table.lock.acquire_now():
            return None
        try:
            if not self.store.acquire_now():
                return None
            try:
                return self.save_group(job_ids)
            finally:
                self.store.release()
        finally:
            self.table.lock.release()

    def save_group(self, job_ids: list[str]) -> dict[str, BaseException]:
        """Save the new jobs a group's requests wait for, in one transaction: their requests answer their ids only
        after it (docs/ARCHITECTURE.md, "REST details"). A job saved meanwhile (with its outcome, or by the journal's
        timer) is skipped. If the transaction fails, each is saved alone; one that still fails is dropped, nothing of
        it kept, and its error returned (job id → error)."""
        failures: dict[str, BaseException] = {}
        with self.table.lock:
            unsaved = [
                rec
                for job_id in job_ids
                if self.journal.awaits_insert(job_id) and (rec := self.table.active.get(job_id))
            ]
            if not unsaved:
                return failures
            try:
                self.journal.persist_many(unsaved)
            except Exception:
                for rec in unsaved:
                    try:
                        self.journal.flush(rec.job_id)
                    except Exception as error:
                        if self.journal.awaits_insert(rec.job_id):
                            self._drop_unsaved(rec)
                        failures[rec.job_id] = error
        return failures

    # -------------------------------------------------------------- admission

    def _admit_here(
        self, request: JobRequest, *, insert_late: bool = False, wants_inline: bool = False, grouped: bool = False
    ) -> NewJob:
        rec, rows = self._record(request)
        admission = self.environments.admission(rec)  # before the lock: it may read the environment cache
        return self._enter(rec, rows, admission, insert_late=insert_late, wants_inline=wants_inline, grouped=grouped)

    def _record(self, request: JobRequest) -> tuple[JobRecord, Any]:
        """A new job's record and rows (the request's checks: 400 or 404 with how to fix it)."""
        name, version, timeout_s, table_slice = request.name, request.version, request.timeout_s, request.table_slice
        fv, owner = self.catalog.runnable(name, version, **request.where)
        if table_slice is not None:
            rows: Any = []
        elif request.arrow_rows is not None:
            rows = take_arrow_rows(self.data, fv, request.arrow_rows)
        else:
            rows = request.rows
            if request.chunk is None:  # a chunk's rows were checked with its batch
                check_rows(fv, rows)
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ApiError(400, "timeout_s must be a number of seconds > 0, or omitted for no timeout")
        # A batch's chunks were checked with their batch (a limit lowered since applies when they are launched).
        too_long = None if request.chunk is not None else self.limits.timeout_problem(timeout_s)
        if too_long:
            raise ApiError(400, too_long)
        gpu_class, num_gpus = None, 0
        resources = fv.runtime.resources
        if resources is not None:
            where_to = self.catalog.placement(resources.gpu_class, resources.num_gpus)  # the config may have changed
            gpu_class, num_gpus = where_to.gpu_class, where_to.num_gpus
        cap = self.table.scheduler.caps.get(owner)
        if cap is not None and num_gpus > cap:
            raise ApiError(
                400,
                f"num_gpus={num_gpus} is more than namespace {owner!r} may hold at once (max_gpus = {cap} "
                f"in the server's API key file); request at most {cap} GPU{'' if cap == 1 else 's'}, or ask the operator",
            )
        if table_slice is not None:
            rows_total = slice_rows(table_slice.ranges)
        else:
            rows_total = rows["rows_total"] if isinstance(rows, dict) else len(rows)
        job_spec: dict[str, Any] = {"name": name, "version": version, "rows_total": rows_total}
        if table_slice is not None:
            job_spec["table_slice"] = table_slice.to_wire()
        if timeout_s is not None:
            job_spec["timeout_s"] = timeout_s
        if isinstance(rows, dict):
            job_spec["rows_format"] = "arrow"
        init = check_init(fv, request.init)
        if init is not None:  # its own warm instance on a worker ("Warm state")
            job_spec["init"] = init
        if request.chunk is not None:
            chunk = request.chunk
            job_spec.update(batch_id=chunk.batch_id, chunk=chunk.chunk, row_start=chunk.row_start)
            if chunk.on_error is not None:
                job_spec["on_error"] = chunk.on_error
        rec = JobRecord(uuid.uuid4().hex, "run_function", PENDING, now_ms(), job_spec, name, gpu_class=gpu_class)
        rec.num_gpus, rec.rows_total, rec.namespace = num_gpus, rows_total, owner
        return rec, rows

    def _enter(
        self, rec: JobRecord, rows: Any, admission: Admission, *, insert_late: bool, wants_inline: bool, grouped: bool
    ) -> NewJob:
        """Add the new job ``rec`` as its ``admission`` says: queued (placed, launched) when its environment is ready,
        failed when it is refused, else waiting for its build. ``insert_late``: JSON rows are saved with the job's
        first commit (``JobJournal.insert_with_first_commit``); ``grouped``: by the group's commit, its first event
        with it. ``wants_inline``: the executor may let this thread run it (``NewJob.inline``)."""
        insert_late = insert_late and isinstance(rows, list) and admission.ready
        new = NewJob(rec, rows, wants_inline)
        held = False
        try:
            with self.table.lock:
                self._add(rec, rows, schedule=admission.ready, insert_late=insert_late)
                try:
                    if admission.problem is not None:  # refused: it fails at once, in phase "environment"
                        self.machine.fail_environment(rec, JobFailure(phase="environment", message=admission.problem))
                    elif admission.ready:
                        held = self.environments.hold(rec, admission)
                        self._place_new(new, first_event_later=insert_late and grouped)
                    else:  # waits, PENDING, for its environment's build: in no device queue meanwhile
                        self.environments.stage(rec, admission)
                        self.journal.persist(rec, new=False)
                except BaseException:
                    if self.journal.awaits_insert(rec.job_id):  # never saved: nothing of it may remain
                        self._drop_unsaved(rec)
                    if new.inline is not None:  # launched, so it must run: the executor takes it
                        new.inline.leave_to_executor()
                    raise
                return new
        finally:
            if not held:
                self.environments.close(admission)  # a lease not handed to a queued job

    def _add(self, rec: JobRecord, rows: Any, *, schedule: bool, insert_late: bool) -> None:
        """Add a new job to the table and the store; nothing of it is kept if the store refuses it.
        ``schedule`` False: not into a queue (its environment is not ready, or it is refused)."""
        table = self.table
        if "batch_id" not in rec.spec:  # a batch's chunks count in its batch's quota ("Batches")
            crowded = self.limits.jobs_problem(rec.namespace, table.active.own.get(rec.namespace, 0))
            if crowded:
                raise ApiError(429, crowded, "quota_exceeded")
        table.active[rec.job_id] = rec
        if schedule:
            self.placement.enqueue(rec)
        event_with_insert = self.placement.event_with_insert
        if insert_late:
            self.journal.insert_with_first_commit(rec, rows)
            if event_with_insert:
                self.journal.persist_soon(rec)  # its first event, saved with it
            return
        try:
            with self.store.batch():
                if event_with_insert:
                    self.journal.persist(rec, new=True, rows=rows)
                else:
                    self.store.insert_job(rec, rows)  # its first event follows placement (_place_new)
        except BaseException:  # not stored: it must not linger in memory either
            table.drop(rec.job_id)
            self.data.remove_rows(rows)
            raise

    def _place_new(self, new: NewJob, *, first_event_later: bool) -> None:
        """Place (or launch) the new job; one left waiting in the plane's queue announces its place, an event saved
        with its insert by whoever saves it when ``first_event_later``."""
        if self.placement.place_new(self.machine, new):
            if first_event_later:
                self.journal.persist_soon(new.rec)
            else:
                self.journal.persist(new.rec, new=False)

    def _drop_unsaved(self, rec: JobRecord) -> None:
        """A new job its request could not save (lock held): gone from memory, its worker stopped."""
        table = self.table
        placed = not table.scheduler.is_pending(rec.job_id)
        freed = table.drop(rec.job_id)
        self.journal.drop_uninserted(rec.job_id)
        self.journal.forget(rec.job_id)
        if placed:
            table.stop_worker(rec.job_id)
        self.machine.dispatch(changed=freed)


_Outcome = str | BaseException  # a saved job's id, or why its run failed


class GroupCommit:
    """The grouped lane: runs of JSON rows answered once their job is saved, the jobs of several requests saved in
    one transaction (docs/ARCHITECTURE.md, "REST details"). Runs on the event loop.

    A run is admitted on the loop itself when the job table and the store are free (:meth:`Intake.admit_on_loop`),
    and the jobs admitted in one pass of the loop are saved at its end, in one commit, again only when both are free
    (:meth:`Intake.save_on_loop`): no core thread, no hand-off between threads, nothing waited for. When either is
    busy (a core thread committing, an executor reporting), a *round* on a core thread does the rest: it admits the
    runs that could not be admitted on the loop and saves every job of the round in one transaction. One round runs
    at a time; what arrives meanwhile goes to the next."""

    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self._queued: list[tuple[Callable[[], str], asyncio.Future]] = []  # runs for the next round to admit
        self._unsaved: list[tuple[str, asyncio.Future]] = []  # jobs admitted on the loop, not saved yet
        self._save_armed = False  # a save at the end of this pass of the loop is due
        self._round: asyncio.Task | None = None

    async def run(self, request: JobRequest) -> str:
        """The job's id once it is saved; the run's error (``ApiError``, a full disk's) if it failed. A request whose
        body was not ``small`` goes to a round whatever its row count."""
        intake = self._intake
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        job_id = intake.admit_on_loop(request) if request.small else None
        if job_id is None:
            call = functools.partial(intake.admit_in_round, request)
            self._queued.append((call, future))
        else:
            self._unsaved.append((job_id, future))
        if not self._save_armed and self._round is None:
            self._save_armed = True
            loop.call_soon(self._save)  # after the requests this pass of the loop has read
        return await future

    def _save(self) -> None:
        self._save_armed = False
        if self._round is not None:  # it takes what came meanwhile
            return
        if not self._queued:
            unsaved, self._unsaved = self._unsaved, []
            try:
                failures = self._intake.save_on_loop([job_id for job_id, _ in unsaved])
            except Exception as error:  # a bug of ours: its requests get it (a 500) rather than no answer
                failures = {job_id: error for job_id, _ in unsaved}
            if failures is not None:
                for job_id, future in unsaved:
                    _settle(future, failures.get(job_id, job_id))
                return
            self._unsaved[:0] = unsaved  # busy: the round saves them
        self._round = asyncio.get_running_loop().create_task(self._rounds())

    async def _rounds(self) -> None:
        try:
            while self._queued or self._unsaved:
                queued, self._queued = self._queued, []
                unsaved, self._unsaved = self._unsaved, []
                try:
                    outcomes, failures = await off_loop(
                        self._round_work, [call for call, _ in queued], [job_id for job_id, _ in unsaved]
                    )
                except Exception as error:  # a bug of ours: every request of the round gets it (a 500)
                    outcomes, failures = [error] * len(queued), {job_id: error for job_id, _ in unsaved}
                for (_, future), outcome in zip(queued, outcomes, strict=True):
                    _settle(future, outcome)
                for job_id, future in unsaved:
                    _settle(future, failures.get(job_id, job_id))
        finally:
            self._round = None

    def _round_work(
        self, calls: list[Callable[[], str]], job_ids: list[str]
    ) -> tuple[list[_Outcome], dict[str, BaseException]]:
        """One round (core thread): admit the runs that waited for it, then save every job of the round."""
        outcomes: list[_Outcome] = []
        for call in calls:
            try:
                job_id = call()
            except Exception as error:  # that request's own error (a 400, a 404, a full disk's 507)
                outcomes.append(error)
                continue
            outcomes.append(job_id)
            job_ids.append(job_id)
        failures = self._intake.save_group(job_ids)
        return [failures.get(o, o) if isinstance(o, str) else o for o in outcomes], failures


def _settle(future: asyncio.Future, outcome: _Outcome) -> None:
    if future.done():  # its request went away (the client disconnected); the job is saved all the same
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
