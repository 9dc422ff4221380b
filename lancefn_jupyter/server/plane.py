"""The control plane core: ``ControlPlane`` composes the parts and holds the job state machine.

It ties together the store (durable truth), the pure scheduler (who gets which devices), the
executor (runs tasks) and the event bus (SSE fan-out), and delegates each seam to one part:

- ``catalog.FunctionCatalog``: function versions (register, describe, list, history, diff, drop);
- ``jobs.JobQueries``: job reads, logs and long polls; ``jobs.check_rows`` checks a run's rows;
- ``callbacks.JobCallbacks``: what executors report (the object handed to ``executor.start``);
- ``journal.JobJournal``: a job change and its event committed together, deferred commits, logs;
- ``results.Results``: results taken from workers, the retention rule, ``GET /v1/jobs/result``;
- ``reports.Reports``: a job's wire form, GPU usage and the ``usage``/``queue`` events;
- ``batches.BatchManager``: ``map`` fanned out over chunk jobs.

Every request method but ``wait_job`` (async: it awaits a job's change on the event loop) is
synchronous and guarded by one re-entrant lock, ``_lock``, which all the parts share; executor
callbacks arrive on executor threads and take the same lock.  Events are handed to the asyncio
loop with ``call_soon_threadsafe`` *while the lock is held*, so subscribers see them in seq order.

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

No input may produce a 5xx: every user-facing problem raises :class:`ApiError` with a 4xx
status and a message saying what is wrong and how to fix it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import uuid
from typing import Any, Unpack

from lancefn_jupyter.server.batches.manager import BatchManager
from lancefn_jupyter.server.common import (
    ACTIVE,
    CANCELLED,
    DONE,
    FAILED,
    IN_PROGRESS,
    PENDING,
    TERMINAL,
    ApiError,
    dumps,
    format_validation_error,
    now_ms,
)
from lancefn_jupyter.server.control.callbacks import PROGRESS_EVENT_INTERVAL_S, JobCallbacks
from lancefn_jupyter.server.control.catalog import (
    DEFAULT_MAX_ARTIFACT_BYTES,
    FunctionCatalog,
    Placement,
    Where,
    redact_definition,
    stored_definition,
)
from lancefn_jupyter.server.control.events import EventBus, Subscriber
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.queries import JobQueries, check_rows, take_arrow_rows
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.results import Results
from lancefn_jupyter.server.control.unsaved import UnsavedJobs
from lancefn_jupyter.server.executors.base import REDACTED, Executor, TaskSpec, redact_env
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.namespaces import DEFAULT_NAMESPACE
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.wire.models import JobFailure

__all__ = [
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "MAX_REQUEUES",
    "PROGRESS_EVENT_INTERVAL_S",
    "REDACTED",
    "ApiError",
    "ControlPlane",
    "EventBus",
    "Subscriber",
    "format_validation_error",
    "redact_definition",
]

log = logging.getLogger("lancefn.server")

MAX_REQUEUES = 3


class ControlPlane:
    max_artifact_bytes = DEFAULT_MAX_ARTIFACT_BYTES  # set by create_app

    def __init__(
        self,
        *,
        store: Store,
        classes: GpuClassConfig,
        executor: Executor | None,
        version: str = "0",
        cpu_slots: int | None = None,
        data: DataStore | None = None,
    ):
        self.store = store
        # Arrow rows and results live as files next to the database (docs/ARCHITECTURE.md).
        self.data = data or DataStore(store.path.parent)
        self.classes = classes
        self.executor = executor
        self.version = version
        self.bus = EventBus()
        self._lock = threading.RLock()
        # CPU functions run at most one per core at a time (each is a worker process).
        self._scheduler = SchedulerState(classes.devices(), cpu_slots=cpu_slots or os.cpu_count() or 1)
        self._active: dict[str, JobRecord] = {}  # PENDING and IN_PROGRESS jobs; the store has the rest
        self._job_env: dict[str, dict[str, str]] = {}  # launched jobs' function env (never logged)
        self._new_rows: tuple[str, Any] | None = None  # (job id, rows) of the job `run` is queuing
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self.reports = Reports(self)
        self.journal = JobJournal(self)
        # Jobs whose latest change the full disk kept from being saved; memory is authoritative
        # for them (a finished job stays there, not in _active) until a retry saves them.
        self._unsaved = UnsavedJobs(
            store, self.bus, self._lock, lambda rec: dumps(self.reports.job_wire(rec)), lambda: self._started
        )
        self.catalog = FunctionCatalog(self)
        self.jobs = JobQueries(self)
        self.results = Results(self)
        self.callbacks = JobCallbacks(self)
        self.batches = BatchManager(self)  # fan-out of `map` over chunk jobs (server/batches/manager.py)

    @property
    def executor_name(self) -> str:
        return self.executor.name if self.executor is not None else "none"

    @property
    def _executor_queues(self) -> bool:
        """The executor queues and places jobs itself (Ray): the core launches them at once,
        bypassing the scheduler, and they stay PENDING until the executor reports them started."""
        return bool(getattr(self.executor, "owns_queue", False))

    # ---------------------------------------------------------------- lifecycle

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self.bus.attach(loop)

    def start(self) -> None:
        """Recover durable state, start the executor and place whatever can run."""
        with self._lock:
            if self.executor is not None:
                self.executor.start(self.callbacks)
                self._apply_executor_capacity()
            self.data.sweep_temp()
            self._recover()
            for done in reversed(self.store.list_jobs(states=(DONE,), job_type="run_function", limit=1000)):
                self.reports.note_run_time(done)
            self.results.enforce_retention()
            self.batches.recover()
            self._started = True
            self._dispatch()
            if self._executor_queues:  # recovered jobs, oldest first
                for rec in list(self._active.values()):
                    self._launch(rec)

    def begin_shutdown(self) -> None:
        """First step of a graceful stop (on the loop thread): end streams and long polls now
        so open connections don't hold the server up."""
        self.bus.close()
        with self._lock:
            self._started = False
            self.jobs.wake_all()

    def shutdown(self) -> None:
        with self._lock:
            self._started = False
            executor, self.executor = self.executor, None
        if executor is not None:
            try:
                executor.shutdown()
            except Exception:  # shutting down anyway; the reason goes to the log
                log.exception("executor shutdown failed")
        with self._lock:
            self.journal.flush_all()
            self._unsaved.cancel_retry()
            self.reports.close()
            self._unsaved.save(retry=False)
        self.jobs.wake_all()  # waiters get the job as it stands now rather than hanging until their timeout

    def _apply_executor_capacity(self) -> None:
        capacity = self.executor.capacity() if self.executor is not None else None
        for spec in self.classes.classes:
            count = (capacity or {}).get(spec.name)
            if count is not None and not spec.devices:
                # Classes without local devices (Ray) get one slot id per GPU the executor reports.
                self._scheduler.set_devices(spec.name, tuple(f"slot{i}" for i in range(count)))
            elif not spec.devices:
                self._scheduler.set_devices(
                    spec.name, tuple(f"slot{i}" for i in range(spec.gpu_class.max_gpu_count_per_worker))
                )

    def _recover(self) -> None:
        unfinished = self.store.list_jobs(states=ACTIVE, limit=10**9, oldest_first=True)
        persist = self.journal.persist
        with self.store.batch():
            for rec in unfinished:
                if rec.state == IN_PROGRESS or rec.devices:
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
                        persist(rec, new=False)
                        continue
                    rec.state, rec.started_ms, rec.devices, rec.node, rec.rows_done = PENDING, None, (), None, 0
                    self.journal.append_log(
                        rec, "system", [f"[lancefn] control plane restarted; job re-queued (restart {rec.requeues})"]
                    )
                    persist(rec, new=False)
                problem = self.catalog.capacity_problem(rec.gpu_class, rec.num_gpus) if rec.num_gpus else None
                if problem:
                    rec.state, rec.finished_ms = FAILED, now_ms()
                    rec.failure = JobFailure(phase="validation", message=problem).to_wire()
                    persist(rec, new=False)
                    continue
                self._active[rec.job_id] = rec
                if not self._executor_queues:
                    self._scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus)

    # ------------------------------------------------- function routes (catalog.py)

    def register(self, body: Any, namespace: str = DEFAULT_NAMESPACE) -> str:
        return self.catalog.register(body, namespace)

    def describe_function(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        return self.catalog.describe(name, version, **where)

    def function_artifact(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        return self.catalog.artifact(name, version, **where)

    def function_history(self, name: str | None, limit: int, **where: Unpack[Where]) -> dict:
        return self.catalog.history(name, limit, **where)

    def function_diff(self, name: str, old: str | None, new: str | None, **where: Unpack[Where]) -> dict:
        return self.catalog.diff(name, old, new, **where)

    def list_functions(
        self,
        *,
        name: str | None,
        include_definition: bool,
        page_token: str | None,
        limit: int = 100,
        scope: str | None = None,
    ) -> dict:
        return self.catalog.list_functions(
            name=name, include_definition=include_definition, page_token=page_token, limit=limit, scope=scope
        )

    def drop_function(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        return self.catalog.drop(name, version, **where)

    # ------------------------------------------------------ job routes (jobs.py)

    def job_record(self, job_id: str) -> JobRecord | None:
        """A job as the core knows it now (memory first), or None."""
        return self.jobs.record(job_id)

    def describe_job(self, job_id: str, scope: str | None = None) -> dict:
        return self.jobs.describe(job_id, scope)

    def list_jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
        page_token: str | None = None,
        limit: int = 100,
        scope: str | None = None,
    ) -> dict:
        return self.jobs.list(
            state=state, name=name, job_type=job_type, page_token=page_token, limit=limit, scope=scope
        )

    def job_logs(self, job_id: str, offset: int = 0, limit: int = 1000, scope: str | None = None) -> dict:
        return self.jobs.logs(job_id, offset, limit, scope)

    async def wait_job(
        self, job_id: str, timeout_s: float, scope: str | None = None, *, unless_queued: bool = False
    ) -> dict:
        return await self.jobs.wait(job_id, timeout_s, scope, unless_queued=unless_queued)

    def result_file(self, job_id: str, scope: str | None = None) -> tuple[str | None, Any]:
        return self.results.result_file(job_id, scope)

    def gpu_classes(self) -> dict:
        # Every field, defaults included (docs/ARCHITECTURE.md, "REST API (v1)").
        return {"classes": [spec.gpu_class.model_dump(mode="json") for spec in self.classes.classes]}

    def gpu_usage(self) -> dict:
        with self._lock:
            return {"classes": self.reports.usage()}

    def queue_snapshot(self, scope: str | None = None) -> dict | None:
        return self.reports.queue_snapshot(scope)

    def events_after(self, seq: int, limit: int = 1000, scope: str | None = None) -> list[tuple[int, str]]:
        return self.store.events_after(seq, limit, namespace=scope)

    def last_event_seq(self) -> int:
        return self.store.last_event_seq()

    # ----------------------------------------------------------- the state machine

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
        **where: Unpack[Where],
    ) -> str:
        """Queue a job; it belongs to the function's namespace (whose env it runs with).
        ``arrow_rows``: the path of an Arrow IPC rows file (instead of JSON ``rows``): a body the
        route streamed to a temp file, or a client's upload; it is checked, then kept as the job's rows.
        A batch's chunk jobs pass ``spec_extra`` (batch_id, chunk, row_start: kept in the job's spec)
        and ``rows_checked`` (their rows were checked when the batch was created)."""
        fv, owner = self.catalog.runnable(name, version, **where)
        if arrow_rows is not None:
            rows = take_arrow_rows(self.data, fv, arrow_rows)
        elif not rows_checked:
            check_rows(fv, rows)
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ApiError(400, "timeout_s must be a number of seconds > 0, or omitted for no timeout")
        resources = fv.runtime.resources
        where_to = (
            Placement(None, 0, False)
            if resources is None
            else self.catalog.placement(resources.gpu_class, resources.num_gpus)  # the config may have changed
        )
        rows_total = rows["rows_total"] if isinstance(rows, dict) else len(rows)
        job_spec: dict[str, Any] = {"name": name, "version": version, "rows_total": rows_total}
        if timeout_s is not None:
            job_spec["timeout_s"] = timeout_s
        if isinstance(rows, dict):
            job_spec["rows_format"] = "arrow"
        if spec_extra:
            job_spec.update(spec_extra)
        with self._lock:
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
            self._active[rec.job_id] = rec
            if not self._executor_queues:
                self._scheduler.enqueue(rec.job_id, where_to.gpu_class, where_to.num_gpus)
            try:
                with self.store.batch():
                    if self._executor_queues:
                        self.journal.persist(rec, new=True, rows=rows)
                    else:
                        self.store.insert_job(rec, rows)  # its first event follows placement, below
            except BaseException:  # not stored: it must not linger in memory either
                self._active.pop(rec.job_id, None)
                self._scheduler.release(rec.job_id)
                self.data.remove_rows(rows)
                raise
            self._new_rows = (rec.job_id, rows)  # launched now, it need not read its rows back
            try:
                if self._executor_queues:
                    if self._started:
                        self._launch(rec)
                    self.reports.publish_usage()
                else:
                    # Place it before its first event, so a job that starts at once is never shown as
                    # "waiting for GPU capacity": placed, its first event already carries its devices.
                    self._dispatch(changed=where_to.num_gpus > 0)
                    if self._scheduler.is_pending(rec.job_id):
                        self.journal.persist(rec, new=False)
            finally:
                self._new_rows = None
            return rec.job_id

    def cancel_job(self, job_id: str, scope: str | None = None) -> dict:
        with self._lock:
            rec = self.jobs.get(job_id, scope)
            if rec.state in TERMINAL:
                return {"job_id": job_id, "cancelled": False}
            was_placed = rec.state == IN_PROGRESS or not self._scheduler.is_pending(job_id)
            self._finish(rec, CANCELLED)
            if was_placed and self.executor is not None:
                try:
                    self.executor.cancel(job_id)
                except Exception:
                    log.exception("executor.cancel(%s) failed", job_id)
            return {"job_id": job_id, "cancelled": True}

    def _finish(self, rec: JobRecord, state: str) -> None:
        """Move an active job to a terminal state, free its devices and start what can run."""
        rec.state = state
        rec.finished_ms = now_ms()
        self.reports.estimator.invalidate()
        if state == DONE:
            rec.failure = None
            self.reports.note_run_time(rec)
        had_devices = bool(self._scheduler.release(rec.job_id)) or bool(rec.devices)
        if rec.spec.get("rows_format") == "arrow":  # the rows file is done with; JSON rows stay in SQLite
            self.data.remove_rows(self.store.get_rows(rec.job_id))
        self._active.pop(rec.job_id, None)
        self.journal.forget(rec.job_id)
        self._job_env.pop(rec.job_id, None)
        self.callbacks.forget(rec.job_id)
        self.journal.persist(rec, new=False)
        self.jobs.finished(rec)
        self.jobs.wake(rec.job_id, rec)
        self._dispatch(changed=had_devices or rec.num_gpus > 0)

    def _dispatch(self, changed: bool = False) -> bool:
        """Place and launch every job that fits now; returns whether anything was placed.

        ``changed``: the caller altered GPU queues/holdings, so a ``usage`` event is due even
        when nothing new is placed.
        """
        if not self._started:
            return False
        placements = self._scheduler.schedule()
        if not placements:
            if changed:
                self.reports.publish_usage()
            return False
        self.reports.estimator.invalidate()
        launches = []
        for placement in placements:
            rec = self._active[placement.job_id]
            rec.devices = placement.devices
            launches.append(rec)
            # Committed with the job's next change (a quick job: with its outcome); a placement
            # lost in a crash re-queues the job, like any job that had started.
            self.journal.persist_soon(rec)
        self.reports.publish_usage()
        for rec in launches:
            self._launch(rec)
        return True

    def _launch(self, rec: JobRecord) -> None:
        try:
            if self.executor is None:
                raise RuntimeError("no executor is configured")
            row = self.store.get_version(rec.spec["name"], rec.spec["version"], rec.namespace)
            if row is None:
                raise RuntimeError(f"function version {rec.spec['name']}@{rec.spec['version']} vanished from the store")
            fv = stored_definition(row.definition)
            runtime = fv.get("runtime", {})
            spec = self.classes.get(rec.gpu_class) if rec.gpu_class else None
            fresh = self._new_rows
            rows = fresh[1] if fresh is not None and fresh[0] == rec.job_id else self.store.get_rows(rec.job_id)
            task = TaskSpec(
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
                timeout_s=rec.spec.get("timeout_s"),
                namespace=rec.namespace,
                data=self._task_data(rec, fv, rows),
            )
            self._job_env[rec.job_id] = task.env  # to redact from its failure messages
            self.executor.launch(task)
        except Exception as error:  # the job fails; the server keeps serving
            log.exception("launching job %s failed", rec.job_id)
            if rec.job_id in self._active:
                message = redact_env(f"could not start a worker: {error}", [self._job_env.get(rec.job_id, {})])
                rec.failure = JobFailure(phase="executor", message=message, retryable=True).to_wire()
                self._finish(rec, FAILED)

    def _task_data(self, rec: JobRecord, fv: dict, rows: Any) -> dict:
        """The worker protocol's data-plane fields of a task (docs/ARCHITECTURE.md)."""
        signature = fv.get("signature") or {}
        data: dict[str, Any] = {
            "input_types": {p["name"]: p["arrow_type"] for p in signature.get("inputs", ())},
            "output_type": (signature.get("output") or {}).get("arrow_type"),
            "result_file": str(self.data.result_path(rec.job_id)),
            "result_fsync": self.data.fsync,
            "rows_total": rec.rows_total,
        }
        if isinstance(rows, dict):
            data["rows_file"] = str(self.data.rows_path(rows))
        return data
