"""The job state machine (docs/ARCHITECTURE.md, "Package layout"): queue a run, place and launch
what fits, finish and cancel jobs, and re-queue what a restart interrupted.  Runs in the control
plane, with the job table's lock held; executor callbacks (``callbacks.py``) and batches call in.

Job lifecycle::

    run → PENDING (queued; waiting_on_capacity, queue_position)
        → PENDING with devices (placed; the executor is starting the worker)
        → IN_PROGRESS (task_started) → DONE | FAILED | TIMED_OUT
    cancel at any non-terminal point → CANCELLED (devices freed at once)

Durability on start (decision): jobs that were IN_PROGRESS — or already placed on devices —
when the server died are **re-queued as PENDING** at their original place in their class's
FIFO, because the user asked for the work and a worker that died with the server produced
nothing.  Their progress is reset and a log line records the restart.  A job re-queued more
than ``MAX_REQUEUES`` (3) times is FAILED with a retryable ``server_restart`` failure so a
job that crashes the server cannot loop forever.  PENDING jobs stay queued in their original
order; after a restart no device is busy.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any, Unpack

from lancefn_jupyter.server.control.catalog import FunctionCatalog, Placement, Where, stored_definition
from lancefn_jupyter.server.control.environments import Admission, EnvironmentStage
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.rows import check_rows, take_arrow_rows
from lancefn_jupyter.server.control.states import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    IN_PROGRESS,
    PENDING,
    TERMINAL,
    now_ms,
)
from lancefn_jupyter.server.encoding import cap_text
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.executors.base import InlineRun, TaskSpec, redact_env
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.limits import Limits
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.tables.plan import slice_rows
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import JobFailure

log = logging.getLogger("lancefn.server")

MAX_REQUEUES = 3
# How long a request's core thread follows a job it runs itself (``run_waiting``): a quick job ends within it; a
# longer one goes to a task thread and the request waits on the event loop, so 40 requests waiting a minute each
# for slow jobs cannot hold every core thread (docs/ARCHITECTURE.md, "REST details").
INLINE_FOLLOW_S = 0.05
# The most JSON rows a run checks on the event loop (``run_now``): a longer list's check goes to a core thread.
RUN_NOW_MAX_ROWS = 64

# (job id, rows) of the job being queued: launched at once, it need not read its rows back.
NewRows = tuple[str, Any] | None


def _slice_rows_ref(job_id: str) -> dict:
    """The rows file a backfill chunk's slice is read into (one per job, removed when it ends)."""
    return {"arrow_file": f"rows/slice-{job_id}.arrow"}


def owner(rec: JobRecord) -> tuple[str, str, str] | None:
    """What a worker serves, ``(namespace, name, version)``: the scheduler asks which idle workers
    hold it when the job is placed (docs/ARCHITECTURE.md, "Warm state")."""
    if rec.job_type != "run_function":
        return None
    return (rec.namespace, rec.spec.get("name", ""), rec.spec.get("version", ""))


class JobMachine:
    def __init__(
        self,
        table: JobTable,
        *,
        store: Store,
        data: DataStore,
        classes: GpuClassConfig,
        catalog: FunctionCatalog,
        journal: JobJournal,
        reports: Reports,
        jobs: JobQueries,
        environments: EnvironmentStage,
        limits: Limits | None = None,
    ) -> None:
        """``limits``: the longest a job may run and the most unfinished jobs a namespace may have (none: no limit)."""
        self.table, self.store, self.data, self.classes = table, store, data, classes
        self.limits = limits or Limits()
        self.catalog, self.journal, self.reports, self.jobs = catalog, journal, reports, jobs
        self.environments = environments  # a version's environment, ready before its jobs queue ("Environments")
        self._dispatch_held = 0  # > 0 while cancel_all runs: placement waits until it is done

    # ----------------------------------------------------------------- requests

    def run(
        self,
        name: str,
        version: str,
        rows: Any,
        timeout_s: float | None = None,
        *,
        arrow_rows: Any = None,
        spec_extra: dict | None = None,
        rows_checked: bool = False,
        table_slice: dict | None = None,
        adopt: list[InlineRun] | None = None,
        defer: bool = False,
        commit_later: bool = False,
        **where: Unpack[Where],
    ) -> str:
        """Queue a job; it belongs to the function's namespace (whose env it runs with).
        ``arrow_rows``: the path of an Arrow IPC rows file (instead of JSON ``rows``): a body the
        route streamed to a temp file, or a client's upload; it is checked, then kept as the job's rows.
        A batch's chunk jobs pass ``spec_extra`` (batch_id, chunk, row_start: kept in the job's spec)
        and ``rows_checked`` (their rows were checked when the batch was created); a backfill's chunk
        jobs pass ``table_slice`` instead of rows (kept in the spec; docs/ARCHITECTURE.md, "Backfills").
        ``defer``: JSON rows are saved with the job's first event, in one transaction, before this returns
        (``JobJournal.defer_new``): a request's own job; a batch saves its chunk jobs in its own transactions.
        ``commit_later`` (with ``defer``): not before this returns; the caller saves it (:meth:`save_new`) before
        it answers the job's id. ``adopt``: receives the job's ``InlineRun`` when the executor lets this thread run
        it; the job, if deferred, is then saved later (``run_waiting``)."""
        rec, rows = self._record(
            name, version, rows, timeout_s, arrow_rows, spec_extra, rows_checked, table_slice, where
        )
        admission = self.environments.admission(rec)  # before the lock: it may read the environment cache
        return self._admit(rec, rows, admission, defer=defer, adopt=adopt, commit_later=commit_later)

    def run_now(
        self,
        name: str,
        version: str,
        rows: Any,
        timeout_s: float | None,
        wait_s: float | None = None,
        **where: Unpack[Where],
    ) -> str | None:
        """``run(defer=True, commit_later=True)`` on the event loop, where it must neither wait nor write: only when
        the job table and the store are free now, the rows are a short JSON list and the version needs no
        environment (docs/ARCHITECTURE.md, "REST details"). None: not now (``run`` it on a core thread). An executor
        that queues its own jobs (Ray) gets the job at once, which never waits (``Executor.launch``). ``wait_s``:
        ``run_waiting``'s job instead, saved with its first commit (its outcome, when it ends within
        ``DEFER_COMMIT_S``) or by :meth:`keep`; when its version's worker is idle, the loop starts the job there and
        follows it for ``wait_s`` but at most ``INLINE_FOLLOW_S`` (``InlineRun.follow_on_loop``)."""
        if not isinstance(rows, list) or len(rows) > RUN_NOW_MAX_ROWS:
            return None
        if not self.table.lock.acquire_now():
            return None
        try:
            if not self.store.acquire_now():  # a commit under way: a version read would wait for it
                return None
            try:
                rec, rows = self._record(name, version, rows, timeout_s, None, None, False, None, where)
                if not self.environments.plain(rec):  # its admission may read the environment cache
                    return None
                admission = self.environments.admission(rec)
                if wait_s is None:
                    return self._admit(rec, rows, admission, defer=True, commit_later=True)
                adopted: list[InlineRun] = []
                try:
                    job_id = self._admit(rec, rows, admission, defer=True, adopt=adopted)
                except BaseException:
                    for inline in adopted:  # launched, so it must run: a task thread takes it
                        inline.leave_to_executor()
                    raise
                if adopted:
                    adopted[0].follow_on_loop(time.monotonic() + min(wait_s, INLINE_FOLLOW_S))
                return job_id
            finally:
                self.store.release()
        finally:
            self.table.lock.release()

    def _record(
        self,
        name: str,
        version: str,
        rows: Any,
        timeout_s: float | None,
        arrow_rows: Any,
        spec_extra: dict | None,
        rows_checked: bool,
        table_slice: dict | None,
        where: Where,
    ) -> tuple[JobRecord, Any]:
        """A new job's record and rows (``run``'s checks: 400 or 404 with how to fix it)."""
        fv, owner = self.catalog.runnable(name, version, **where)
        if table_slice is not None:
            rows = []
        elif arrow_rows is not None:
            rows = take_arrow_rows(self.data, fv, arrow_rows)
        elif not rows_checked:
            check_rows(fv, rows)
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ApiError(400, "timeout_s must be a number of seconds > 0, or omitted for no timeout")
        # A batch's chunks were checked with their batch (a limit lowered since applies when they are launched).
        too_long = None if spec_extra else self.limits.timeout_problem(timeout_s)
        if too_long:
            raise ApiError(400, too_long)
        resources = fv.runtime.resources
        where_to = (
            Placement(None, 0, False)
            if resources is None
            else self.catalog.placement(resources.gpu_class, resources.num_gpus)  # the config may have changed
        )
        cap = self.table.scheduler.caps.get(owner)
        if cap is not None and where_to.num_gpus > cap:
            raise ApiError(
                400,
                f"num_gpus={where_to.num_gpus} is more than namespace {owner!r} may hold at once (max_gpus = {cap} "
                f"in the server's API key file); request at most {cap} GPU{'' if cap == 1 else 's'}, or ask the operator",
            )
        if table_slice is not None:
            rows_total = slice_rows(table_slice["ranges"])
        else:
            rows_total = rows["rows_total"] if isinstance(rows, dict) else len(rows)
        job_spec: dict[str, Any] = {"name": name, "version": version, "rows_total": rows_total}
        if table_slice is not None:
            job_spec["table_slice"] = table_slice
        if timeout_s is not None:
            job_spec["timeout_s"] = timeout_s
        if isinstance(rows, dict):
            job_spec["rows_format"] = "arrow"
        if spec_extra:
            job_spec.update(spec_extra)
        rec = JobRecord(
            job_id=uuid.uuid4().hex,
            job_type="run_function",
            state=PENDING,
            creation_ms=now_ms(),
            spec=job_spec,
            name=name,
            gpu_class=where_to.gpu_class,
            num_gpus=where_to.num_gpus,
            rows_total=rows_total,
            namespace=owner,
        )
        return rec, rows

    def _admit(
        self,
        rec: JobRecord,
        rows: Any,
        admission: Admission,
        *,
        defer: bool,
        adopt: list[InlineRun] | None = None,
        commit_later: bool = False,
    ) -> str:
        """Queue the new job ``rec`` as its ``admission`` says (``run``)."""
        defer = defer and isinstance(rows, list) and admission.ready  # see ``JobJournal.defer_new``
        held = False
        try:
            with self.table.lock:
                self._queue(rec, rows, schedule=admission.ready, defer=defer)
                try:
                    if admission.problem is not None:  # refused: it fails at once, in phase "environment"
                        self.fail_environment(rec, JobFailure(phase="environment", message=admission.problem))
                    elif admission.ready:
                        held = self.environments.hold(rec, admission)
                        self._place_new(rec, rows, rec.num_gpus, adopt, soon=defer and commit_later)
                    else:  # waits, PENDING, for its environment's build: in no device queue meanwhile
                        self.environments.stage(rec, admission)
                        self.journal.persist(rec, new=False)
                    if defer and adopt is None and not commit_later:  # saved before its id is answered
                        self.journal.flush(rec.job_id)
                except BaseException:
                    if self.journal.is_new(rec.job_id):  # never saved: nothing of it may remain
                        self._drop_unsaved(rec)
                    raise
                return rec.job_id
        finally:
            if not held:
                self.environments.close(admission)  # a lease not handed to a queued job

    def save_now(self, job_ids: list[str]) -> dict[str, BaseException] | None:
        """``save_new`` on the event loop, only when the job table and the store are free now; None: not now."""
        if not self.table.lock.acquire_now():
            return None
        try:
            if not self.store.acquire_now():
                return None
            try:
                return self.save_new(job_ids)
            finally:
                self.store.release()
        finally:
            self.table.lock.release()

    def save_new(self, job_ids: list[str]) -> dict[str, BaseException]:
        """Save the new jobs ``run(commit_later=True)`` left to its callers, in one transaction: their requests
        answer their ids only after it (docs/ARCHITECTURE.md, "REST details"). A job saved meanwhile (with its
        outcome, or by the journal's timer) is skipped. If the transaction fails, each is saved alone; one that
        still fails is dropped, nothing of it kept, and its error returned (job id → error)."""
        failures: dict[str, BaseException] = {}
        with self.table.lock:
            unsaved = [
                rec for job_id in job_ids if self.journal.is_new(job_id) and (rec := self.table.active.get(job_id))
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
                        if self.journal.is_new(rec.job_id):
                            self._drop_unsaved(rec)
                        failures[rec.job_id] = error
        return failures

    def run_waiting(
        self,
        name: str,
        version: str,
        rows: Any,
        timeout_s: float | None,
        wait_s: float,
        *,
        arrow_rows: Any = None,
        **where: Unpack[Where],
    ) -> tuple[str, dict | None, float]:
        """``run`` for a request that waits up to ``wait_s`` for the job to end (``functions/run``'s inline
        wait): when its version's worker is idle on the devices it gets, this thread runs the job itself
        (``Executor.launch_inline``) until it ends or the wait is over, so a quick job's whole run takes no other
        thread (docs/ARCHITECTURE.md, "REST details"). A job with JSON rows is saved at its first commit
        (``JobJournal.defer_new``): with its outcome when it ends within ``DEFER_COMMIT_S``; the caller
        must :meth:`keep` one that has not ended before answering its id. (job id, its wire form if it
        ended else None, the seconds of the wait left)."""
        deadline = time.monotonic() + wait_s
        adopted: list[InlineRun] = []
        try:
            job_id = self.run(name, version, rows, timeout_s, arrow_rows=arrow_rows, adopt=adopted, defer=True, **where)
        except BaseException:
            for inline in adopted:  # launched, so it must run: a task thread takes it
                inline.leave_to_executor()
            raise
        if adopted:  # followed here for a short while at most: a core thread must never wait on a long job
            adopted[0].run(min(deadline, time.monotonic() + INLINE_FOLLOW_S))
        with self.table.lock:
            rec = self.jobs.record(job_id)
            if rec is not None and rec.state in TERMINAL:  # saved with its outcome
                return job_id, self.reports.job_wire(rec), 0.0
        return job_id, None, max(0.0, deadline - time.monotonic())

    def keep(self, job_id: str) -> None:
        """A job ``run_waiting`` deferred is saved now, before its id is answered; if that fails (a full disk) the
        request fails, and the job is cancelled rather than run for nobody."""
        with self.table.lock:
            try:
                self.journal.flush(job_id)
            except BaseException:
                self.cancel(job_id)
                raise

    def _queue(self, rec: JobRecord, rows: Any, *, schedule: bool = True, defer: bool = False) -> None:
        """Add a new job to the table and the store; nothing of it is kept if the store refuses it.
        ``schedule`` False: not into a device queue (its environment is not ready, or it is refused).
        ``defer``: into the store with its first commit (``JobJournal.defer_new``; JSON rows only)."""
        table = self.table
        if "batch_id" not in rec.spec:  # a batch's chunks count in its batch's quota ("Batches")
            crowded = self.limits.jobs_problem(rec.namespace, table.active.own.get(rec.namespace, 0))
            if crowded:
                raise ApiError(429, crowded, "quota_exceeded")
        table.active[rec.job_id] = rec
        if schedule and not table.executor_queues:
            table.scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus, owner(rec), rec.namespace)
        if defer:
            self.journal.defer_new(rec, rows)
            if table.executor_queues:
                self.journal.persist_soon(rec)  # its first event (the executor queues it), saved with it
            return
        try:
            with self.store.batch():
                if table.executor_queues:
                    self.journal.persist(rec, new=True, rows=rows)
                else:
                    self.store.insert_job(rec, rows)  # its first event follows placement (_place_new)
        except BaseException:  # not stored: it must not linger in memory either
            table.active.pop(rec.job_id, None)
            table.scheduler.release(rec.job_id)
            self.data.remove_rows(rows)
            raise

    def _drop_unsaved(self, rec: JobRecord) -> None:
        """A deferred new job its request could not save (lock held): gone from memory, its worker stopped."""
        table = self.table
        placed = not table.scheduler.is_pending(rec.job_id)
        table.active.pop(rec.job_id, None)
        table.job_env.pop(rec.job_id, None)
        freed = bool(table.scheduler.release(rec.job_id))
        self.journal.discard_new(rec.job_id)
        self.journal.forget(rec.job_id)
        if placed and table.executor is not None:
            try:
                table.executor.cancel(rec.job_id)
            except Exception:
                log.exception("executor.cancel(%s) failed", rec.job_id)
        self.dispatch(changed=freed)

    def enqueue_built(self, recs: list[JobRecord]) -> None:
        """Jobs whose environment is ready now (the stage's build thread, lock held): queued for devices in
        the order they came, then placed; those still waiting for devices announce their queue place."""
        table = self.table
        for rec in recs:
            if not table.executor_queues:
                table.scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus, owner(rec), rec.namespace)
        if table.executor_queues:
            for rec in recs:
                if table.started:
                    self.launch(rec)
            return
        self.dispatch(changed=True)
        for rec in recs:
            if rec.job_id in table.active and table.scheduler.is_pending(rec.job_id):
                self.journal.persist(rec, new=False)

    def fail_environment(self, rec: JobRecord, failure: JobFailure) -> None:
        """The job's environment is refused or could not be built (lock held): FAILED, phase ``environment``."""
        if rec.job_id not in self.table.active:
            return
        env = [self.table.job_env.get(rec.job_id, {})]
        rec.failure = {
            k: cap_text(redact_env(v, env)) if isinstance(v, str) else v for k, v in failure.to_wire().items()
        }
        self.finish(rec, FAILED)

    def _place_new(
        self, rec: JobRecord, rows: Any, num_gpus: int, adopt: list[InlineRun] | None = None, *, soon: bool = False
    ) -> None:
        """Place a new job, or announce its place in the queue; ``soon``: that first event is saved with the job's
        insert, by whoever saves it (``commit_later``)."""
        new_rows = (rec.job_id, rows)
        if self.table.executor_queues:
            if self.table.started:
                self.launch(rec, new_rows, adopt)
            self.reports.publish_usage()
            return
        # Place it before its first event, so a job that starts at once is never shown as
        # "waiting for GPU capacity": placed, its first event already carries its devices.
        self.dispatch(changed=num_gpus > 0, new_rows=new_rows, adopt=adopt)
        if self.table.scheduler.is_pending(rec.job_id):
            if soon:
                self.journal.persist_soon(rec)
            else:
                self.journal.persist(rec, new=False)

    def cancel(self, job_id: str, scope: str | None = None) -> dict:
        table = self.table
        with table.lock:
            rec = self.jobs.get(job_id, scope)
            if rec.state in TERMINAL:
                return {"job_id": job_id, "cancelled": False}
            was_placed = rec.state == IN_PROGRESS or not (
                table.scheduler.is_pending(job_id) or self.environments.waiting(job_id)
            )
            self.finish(rec, CANCELLED)
            if was_placed and table.executor is not None:
                try:
                    table.executor.cancel(job_id)
                except Exception:
                    log.exception("executor.cancel(%s) failed", job_id)
            return {"job_id": job_id, "cancelled": True}

    def cancel_all(self, job_ids: list[str], *, yield_to_waiters: bool = False) -> int:
        """Cancel several jobs as one change (a batch's chunk jobs): the devices they free are
        placed once all are cancelled, so none goes to the next of them only to be cancelled in
        turn.  A job already gone is skipped.  ``yield_to_waiters``: stop after the job under way
        once another thread has waited the lock's grace for it (a batch's cancel slices).  How many were handled."""
        done = 0
        with self.table.lock:
            self._dispatch_held += 1
            try:
                for job_id in job_ids:
                    if done and yield_to_waiters and self.table.lock.overdue():
                        break
                    done += 1
                    try:
                        self.cancel(job_id)
                    except ApiError:  # not in the store: nothing to stop
                        pass
            finally:
                self._dispatch_held -= 1
            self.dispatch(changed=True)
        return done

    # ------------------------------------------------------------ transitions

    def finish(self, rec: JobRecord, state: str) -> None:
        """Move an active job to a terminal state, free its devices and start what can run."""
        table = self.table
        rec.state = state
        rec.finished_ms = now_ms()
        self.reports.estimator.invalidate(rec.gpu_class)
        if state == DONE:
            rec.failure = None
            self.reports.note_run_time(rec)
        had_devices = bool(table.scheduler.release(rec.job_id)) or bool(rec.devices)
        if rec.spec.get("rows_format") == "arrow":  # the rows file is done with; JSON rows stay in SQLite
            self.data.remove_rows(self.store.get_rows(rec.job_id))
        elif "table_slice" in rec.spec:  # the rows file the executor read the slice into
            self.data.remove_rows(_slice_rows_ref(rec.job_id))
        table.active.pop(rec.job_id, None)
        table.job_env.pop(rec.job_id, None)
        self.journal.forget(rec.job_id)
        wire = self.reports.job_wire(rec)  # its event's and its long polls' answer
        self.journal.persist(rec, new=False, wire=wire)
        self.jobs.finished(rec)
        self.jobs.wake(rec.job_id, rec, wire)
        self.dispatch(changed=had_devices or rec.num_gpus > 0)

    def dispatch(self, changed: bool = False, new_rows: NewRows = None, adopt: list[InlineRun] | None = None) -> bool:
        """Place and launch every job that fits now; returns whether anything was placed.

        ``changed``: the caller altered GPU queues/holdings, so a ``usage`` event is due even
        when nothing new is placed.  ``new_rows``: the rows of the job ``run`` is queuing (and
        ``adopt``: where its ``InlineRun`` goes if the executor lets the caller run it, see ``launch``).
        """
        table = self.table
        if not table.started or self._dispatch_held:
            return False
        placements = table.scheduler.schedule()
        if not placements:
            if changed:
                self.reports.publish_usage()
            return False
        for placement in placements:
            self.reports.estimator.invalidate(placement.gpu_class)
        launches = []
        for placement in placements:
            rec = table.active[placement.job_id]
            rec.devices = placement.devices
            launches.append(rec)
            # Committed with the job's next change (a quick job: with its outcome); a placement
            # lost in a crash re-queues the job, like any job that had started.
            self.journal.persist_soon(rec)
        self.reports.publish_usage()
        for rec in launches:
            self.launch(rec, new_rows, adopt)
        return True

    def launch(self, rec: JobRecord, new_rows: NewRows = None, adopt: list[InlineRun] | None = None) -> None:
        """Hand a placed job to the executor; a job that cannot start fails (the server keeps serving).
        ``adopt``: the new job (``new_rows``) is offered to the calling thread first (``Executor.launch_inline``)."""
        table = self.table
        try:
            if table.executor is None:
                raise RuntimeError("no executor is configured")
            new = new_rows is not None and new_rows[0] == rec.job_id
            rows = new_rows[1] if new_rows is not None and new else None
            task = self._task(rec, rows)
            table.job_env[rec.job_id] = task.env  # to redact from its failure messages
            if adopt is not None and new and (inline := table.executor.launch_inline(task)) is not None:
                adopt.append(inline)
                return
            table.executor.launch(task)
        except Exception as error:
            log.exception("launching job %s failed", rec.job_id)
            if rec.job_id in table.active:
                message = redact_env(f"could not start a worker: {error}", [table.job_env.get(rec.job_id, {})])
                rec.failure = JobFailure(phase="executor", message=message, retryable=True).to_wire()
                self.finish(rec, FAILED)

    def _task(self, rec: JobRecord, rows: Any) -> TaskSpec:
        """The executor's task for ``rec``; ``rows`` None: read back from the store."""
        row = self.store.get_version(rec.spec["name"], rec.spec["version"], rec.namespace)
        if row is None:
            raise RuntimeError(f"function version {rec.spec['name']}@{rec.spec['version']} vanished from the store")
        fv = stored_definition(row.definition)
        runtime = fv.get("runtime", {})
        spec = self.classes.get(rec.gpu_class) if rec.gpu_class else None
        if rows is None:  # not saved yet (``commit_later``): the journal holds them; else the store
            rows = self.journal.new_rows(rec.job_id)
            if rows is None:
                rows = self.store.get_rows(rec.job_id)
        timeout_s, limited = self.limits.run_timeout(rec.spec.get("timeout_s"))
        return TaskSpec(
            job_id=rec.job_id,
            name=rec.spec["name"],
            version=rec.spec["version"],
            artifact=row.artifact,
            entrypoint=fv["artifact"]["entrypoint"],
            rows=[] if isinstance(rows, dict) else rows,
            devices=rec.devices,
            simulated=bool(spec and spec.simulated),
            gpu_class=rec.gpu_class,
            num_gpus=rec.num_gpus,
            env=dict(runtime.get("env") or {}),
            packages=tuple((runtime.get("environment") or {}).get("packages", ())),
            timeout_s=timeout_s,
            timeout_limit=limited,
            namespace=rec.namespace,
            data=self._task_data(rec, fv, rows),
            state=runtime.get("state") or "per_worker",  # absent: the default ("Warm state")
            environment=self.environments.request(rec),
            venv=self.environments.venv(rec.job_id),
            table_slice=rec.spec.get("table_slice"),
        )

    def _task_data(self, rec: JobRecord, fv: dict, rows: Any) -> dict:
        """The worker protocol's data-plane fields of a task (docs/ARCHITECTURE.md)."""
        signature = fv.get("signature") or {}
        types = dataplane.task_fields(signature)  # input/output types, and a batched version's forms
        data: dict[str, Any] = {
            **types,
            # result_file, result_fsync, result_stage (docs/ARCHITECTURE.md, "Result staging")
            **self.data.result_fields(rec.job_id, arrow=dataplane.is_data_type(types["output_type"])),
            "rows_total": rec.rows_total,
        }
        if isinstance(rows, dict):
            data["rows_file"] = str(self.data.rows_path(rows))
        elif (
            "table_slice" in rec.spec
        ):  # where the local executor reads the slice to (docs/ARCHITECTURE.md, "Backfills")
            data["rows_file"] = str(self.data.rows_path(_slice_rows_ref(rec.job_id)))
        if (
            "on_error" in rec.spec
        ):  # "skip": a failing row gets a null result (docs/ARCHITECTURE.md, "Batched functions")
            data["on_error"] = rec.spec["on_error"]
        return data

    # ---------------------------------------------------------------- recovery

    def recover(self) -> None:
        """On start (lock held): re-queue the jobs a stop interrupted, fail those over their limit."""
        unfinished = self.store.list_jobs(states=ACTIVE, limit=10**9, oldest_first=True)
        with self.store.batch():
            for rec in unfinished:
                if (rec.state == IN_PROGRESS or rec.devices) and not self._requeue(rec):
                    continue
                problem = self.catalog.capacity_problem(rec.gpu_class, rec.num_gpus) if rec.num_gpus else None
                if problem:
                    rec.state, rec.finished_ms = FAILED, now_ms()
                    rec.failure = JobFailure(phase="validation", message=problem).to_wire()
                    self.journal.persist(rec, new=False)
                    continue
                self.table.active[rec.job_id] = rec
                self._admit_recovered(rec)

    def _admit_recovered(self, rec: JobRecord) -> None:
        """A PENDING job after a restart goes through the environment stage again, like a new one: queued
        when its environment is ready, refused, or waiting (a build the stop interrupted starts over)."""
        admission = self.environments.admission(rec)
        held = False
        try:
            if admission.problem is not None:
                self.fail_environment(rec, JobFailure(phase="environment", message=admission.problem))
            elif admission.ready:
                held = self.environments.hold(rec, admission)
                if not self.table.executor_queues:
                    self.table.scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus, owner(rec), rec.namespace)
            else:
                self.environments.stage(rec, admission)
                self.journal.persist(rec, new=False)
        finally:
            if not held:
                self.environments.close(admission)

    def _requeue(self, rec: JobRecord) -> bool:
        """A job that was running when the plane stopped: PENDING again (True), or FAILED once it
        was re-queued ``MAX_REQUEUES`` times (False)."""
        rec.requeues += 1
        if rec.requeues > MAX_REQUEUES:
            rec.state, rec.finished_ms = FAILED, now_ms()
            rec.failure = JobFailure(
                phase="server_restart",
                message=f"the control plane restarted {rec.requeues} times while this job ran; "
                "it was not re-queued again. Submit it again to retry.",
                retryable=True,
            ).to_wire()
            rec.devices, rec.node = (), None
            self.journal.persist(rec, new=False)
            return False
        rec.state, rec.started_ms, rec.devices, rec.node, rec.rows_done = PENDING, None, (), None, 0
        self.journal.append_log(
            rec, "system", [f"[lancefn] control plane restarted; job re-queued (restart {rec.requeues})"]
        )
        self.journal.persist(rec, new=False)
        return True
