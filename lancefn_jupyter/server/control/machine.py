"""The job state machine (docs/ARCHITECTURE.md, "Package layout"): its transitions once a job is admitted (the
intake, ``intake.py``, admits every new one): place and launch what fits, finish and cancel jobs, and re-queue what a
restart interrupted.  Runs in the control plane, with the job table's lock held; the intake, executor callbacks
(``callbacks.py``), the environment stage and batches call in.

Job lifecycle::

    admitted → PENDING (queued; waiting_on_capacity, queue_position)
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
from typing import Any

from lancefn_jupyter.server.control.catalog import FunctionCatalog, stored_version
from lancefn_jupyter.server.control.environments import EnvironmentStage
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.placement import NewJob, PlacementStrategy
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.reports import Reports
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
from lancefn_jupyter.server.control.vault import SecretMissing
from lancefn_jupyter.server.encoding import cap_text
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.executors.base import TaskSpec, redact_env
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.limits import Limits
from lancefn_jupyter.server.policy.resources import resource_request
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.backfill_models import TableSlice
from lancefn_jupyter.wire.models import FunctionVersion, JobFailure
from lancefn_jupyter.wire.task_models import TaskData

log = logging.getLogger("lancefn.server")

MAX_REQUEUES = 3


def _slice_rows_ref(job_id: str) -> dict:
    """The rows file a backfill chunk's slice is read into (one per job, removed when it ends)."""
    return {"arrow_file": f"rows/slice-{job_id}.arrow"}


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
        placement: PlacementStrategy,
        limits: Limits | None = None,
    ) -> None:
        """``placement``: who queues a ready job (the scheduler, or the executor). ``limits``: the longest a job may
        run and the most unfinished jobs a namespace may have (none: no limit)."""
        self.table, self.store, self.data, self.classes = table, store, data, classes
        self.placement = placement
        self.limits = limits or Limits()
        self.catalog, self.journal, self.reports, self.jobs = catalog, journal, reports, jobs
        self.environments = environments  # a version's environment, ready before its jobs queue ("Environments")
        self._dispatch_held = 0  # > 0 while cancel_all runs: placement waits until it is done

    # ----------------------------------------------------------------- requests

    def enqueue_built(self, recs: list[JobRecord]) -> None:
        """Jobs whose environment is ready now (the stage's build thread, lock held): queued for devices in
        the order they came, then placed; those still waiting for devices announce their queue place."""
        for rec in self.placement.place_ready(self, recs):
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
            if was_placed:
                table.stop_worker(job_id)
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
        rec.state = state
        rec.finished_ms = now_ms()
        self.reports.estimator.invalidate(rec.gpu_class)
        if state == DONE:
            rec.failure = None
            self.reports.note_run_time(rec)
        self.reports.note_spend(rec)  # its namespace's daily budget ("Budgets")
        had_devices = self.table.drop(rec.job_id) or bool(rec.devices)
        if rec.spec.get("rows_format") == "arrow":  # the rows file is done with; JSON rows stay in SQLite
            self.data.remove_rows(self.store.get_rows(rec.job_id))
        elif "table_slice" in rec.spec:  # the rows file the executor read the slice into
            self.data.remove_rows(_slice_rows_ref(rec.job_id))
        self.journal.forget(rec.job_id)
        wire = self.reports.job_wire(rec)  # its event's and its long polls' answer
        self.journal.persist(rec, new=False, wire=wire)
        self.jobs.finished(rec)
        self.jobs.wake(rec.job_id, rec, wire)
        self.dispatch(changed=had_devices or rec.num_gpus > 0)

    def publish_usage(self) -> None:
        """A ``usage`` event is due (the placement strategy's changes)."""
        self.reports.publish_usage()

    def dispatch(self, changed: bool = False, new: NewJob | None = None) -> bool:
        """Place and launch every job that fits now; returns whether anything was placed.

        ``changed``: the caller altered GPU queues/holdings, so a ``usage`` event is due even
        when nothing new is placed.  ``new``: the job the intake is admitting, whose rows come with it (``launch``).
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
            self.launch(rec, new if new is not None and new.rec is rec else None)
        return True

    def launch(self, rec: JobRecord, new: NewJob | None = None) -> None:
        """Hand a placed job to the executor; a job that cannot start fails (the server keeps serving). Its rows:
        ``new``'s, the job being admitted; else a queued job's, read back from the journal (``JobJournal.rows``).
        A ``new`` job that ``wants_inline`` is offered to the calling thread first (``Executor.launch_inline``)."""
        table = self.table
        try:
            if table.executor is None:
                raise RuntimeError("no executor is configured")
            task = self._task(rec, new.rows if new is not None else self.journal.rows(rec.job_id))
            table.job_env[rec.job_id] = task.env  # to redact from its failure messages
            if new is not None and new.wants_inline and (inline := table.executor.launch_inline(task)) is not None:
                new.inline = inline
                return
            table.executor.launch(task)
        except SecretMissing as missing:  # dropped since the job was admitted: its phase is the environment's
            if rec.job_id in table.active:
                rec.failure = JobFailure(phase="environment", message=str(missing)).to_wire()
                self.finish(rec, FAILED)
        except Exception as error:
            log.exception("launching job %s failed", rec.job_id)
            if rec.job_id in table.active:
                message = redact_env(f"could not start a worker: {error}", [table.job_env.get(rec.job_id, {})])
                rec.failure = JobFailure(phase="executor", message=message, retryable=True).to_wire()
                self.finish(rec, FAILED)

    def _task(self, rec: JobRecord, rows: Any) -> TaskSpec:
        """The executor's task for ``rec`` with its ``rows``."""
        row = self.store.get_version(rec.spec["name"], rec.spec["version"], rec.namespace)
        if row is None:
            raise RuntimeError(f"function version {rec.spec['name']}@{rec.spec['version']} vanished from the store")
        fv = stored_version(row.definition)
        runtime = fv.runtime
        spec = self.classes.get(rec.gpu_class) if rec.gpu_class else None
        timeout_s, limited = self.limits.run_timeout(rec.spec.get("timeout_s"))
        table_slice = rec.spec.get("table_slice")  # the job's stored spec: read back as the model
        return TaskSpec(
            job_id=rec.job_id,
            name=rec.spec["name"],
            version=rec.spec["version"],
            artifact=row.artifact,
            entrypoint=fv.artifact.entrypoint,
            rows=[] if isinstance(rows, dict) else rows,
            devices=rec.devices,
            simulated=bool(spec and spec.simulated),
            gpu_class=rec.gpu_class,
            num_gpus=rec.num_gpus,
            # Bound secrets join the env values by the same path ("Secrets"); one gone fails the job (launch).
            env={**(runtime.env or {}), **self.catalog.secrets.values(rec.namespace, fv.secret_bindings)}
            if fv.secret_bindings
            else dict(runtime.env or {}),
            packages=runtime.environment.packages if runtime.environment else (),
            timeout_s=timeout_s,
            timeout_limit=limited,
            namespace=rec.namespace,
            data=self._task_data(rec, fv, rows),
            state=runtime.state or "per_worker",  # absent: the default ("Warm state")
            environment=self.environments.request(rec),
            venv=self.environments.venv(rec.job_id),
            table_slice=None if table_slice is None else TableSlice.from_wire(table_slice),
            resources=resource_request(runtime.resources, spec.gpu_class if spec else None),
            setup_digest=self.catalog.setup_digest(rec.namespace, rec.spec["name"], fv, row.artifact),
        )

    def _task_data(self, rec: JobRecord, fv: FunctionVersion, rows: Any) -> TaskData:
        """The worker protocol's data-plane fields of a task (docs/ARCHITECTURE.md)."""
        rows_file = None
        if isinstance(rows, dict):
            rows_file = str(self.data.rows_path(rows))
        elif (
            "table_slice" in rec.spec
        ):  # where the local executor reads the slice to (docs/ARCHITECTURE.md, "Backfills")
            rows_file = str(self.data.rows_path(_slice_rows_ref(rec.job_id)))
        return TaskData.of(
            fv.signature,
            # result_file, result_fsync, result_stage (docs/ARCHITECTURE.md, "Result staging")
            **self.data.result_fields(rec.job_id, arrow=dataplane.is_data_type(fv.signature.output.arrow_type)),
            rows_total=rec.rows_total,
            rows_file=rows_file,
            init=rec.spec.get("init"),  # a class entry's __init__ arguments ("Warm state")
            # "skip": a failing row gets a null result (docs/ARCHITECTURE.md, "Batched functions")
            on_error=rec.spec.get("on_error"),
        )

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
                self.placement.enqueue(rec)
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
