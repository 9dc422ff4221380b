"""The control plane's composition root: ``ControlPlane`` builds the parts, wires their
observers and runs their lifecycle (start, graceful stop).  Runs in the control plane process.

The parts, each handed the job table (``control/jobtable.py``: the shared lock and state) and
the named peers it needs, never the plane (docs/ARCHITECTURE.md, "Package layout"):

- ``catalog``: function versions (register, describe, list, history, diff, drop);
- ``jobs``: job reads, logs and long polls (``control/queries.py``);
- ``placement``: who queues a ready job, the scheduler or the executor (``control/placement.py``), chosen here once
  for the executor;
- ``intake``: the one door for a new job, every lane (``control/intake.py``): a request's run, a batch's chunk, a
  registration;
- ``machine``: the job state machine: cancel, finish, dispatch, launch, recover;
- ``environments``: a version's environment made ready before its jobs queue (``control/environments.py``),
  handed the machine's ``enqueue_built`` / ``fail_environment``; a journal forgetter (leases);
- ``callbacks``: what executors report (the object handed to ``executor.start``);
- ``journal``: a job change and its event committed together, deferred commits, logs; it
  announces changes to its watchers (``batches.on_job``) and finished jobs to its forgetters
  (``callbacks.forget``);
- ``results``: results taken from workers, the retention rule, ``GET /v1/jobs/result``;
- ``reports``: a job's wire form, GPU usage and the ``usage``/``queue`` events;
- ``batches``: ``map`` fanned out over chunk jobs.

The routes call the parts, read as plain attributes of the plane (``plane.intake.submit``): the
plane has no request methods of its own.  Every part's request method but the long polls (async:
they await a change on the event loop) is synchronous and guarded by the table's one re-entrant
lock; executor callbacks arrive on executor threads and take the same lock.  Events are handed to
the asyncio loop (``control/loop_calls.py``, ``call_on_loop``: ``call_soon_threadsafe``, or ``call_soon`` on the loop's own thread, which
keeps the same order) *while the lock is held*, so subscribers see them in seq order.

No input may produce a 5xx: every user-facing problem raises :class:`ApiError` with a 4xx
status and a message saying what is wrong and how to fix it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.server.batches.manager import BatchManager
from lancefn_jupyter.server.control.callbacks import JobCallbacks
from lancefn_jupyter.server.control.catalog import FunctionCatalog, stored_version
from lancefn_jupyter.server.control.environments import EnvironmentStage
from lancefn_jupyter.server.control.events import EventBus
from lancefn_jupyter.server.control.intake import Intake
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.machine import JobMachine
from lancefn_jupyter.server.control.placement import placement_for
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.results import Results
from lancefn_jupyter.server.control.states import DONE, TERMINAL, now_ms
from lancefn_jupyter.server.control.unsaved import UnsavedJobs
from lancefn_jupyter.server.control.vault import SecretVault
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.executors.base import Executor
from lancefn_jupyter.server.executors.table_agent import TableAgents
from lancefn_jupyter.server.policy.budgets import Budget, Spend, utc_day
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.limits import Limits
from lancefn_jupyter.server.policy.resources import class_totals, resource_request
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.policy.table_roots import TableRoots
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import Store

if TYPE_CHECKING:
    from lancefn_jupyter.environments.cache import EnvironmentCache

__all__ = ["ControlPlane"]

BUDGET_CHECK_S = 30.0  # how often the budgets' day is looked at: a namespace's jobs wait at most this past midnight
log = logging.getLogger("lancefn.server")


class ControlPlane:
    def __init__(
        self,
        *,
        store: Store,
        classes: GpuClassConfig,
        executor: Executor | None,
        version: str = "0",
        cpu_slots: int | None = None,
        data: DataStore | None = None,
        environments: EnvironmentCache | None = None,
        table_roots: TableRoots | None = None,
        digest_key: bytes | None = None,
        gpu_caps: Mapping[str, int] | None = None,
        budgets: Mapping[str, Budget] | None = None,
        allow_direct_references: bool = True,
        limits: Limits | None = None,
    ):
        """``environments``: the cache the plane builds versions' environments in, for an executor that
        ``builds_environments`` (docs/ARCHITECTURE.md, "Environments"); None: workers run on the base Python.
        ``digest_key``: the home's secret env values are keyed with in version ids and digests ("Function versions").
        ``gpu_caps``: namespace → the most GPUs it may hold at once (``max_gpus`` in the key file; "Scheduling").
        ``budgets``: namespace → its daily GPU-hours and cost (the key file; "Budgets").
        ``allow_direct_references``: pip entries ``NAME @ URL`` are accepted and built (a server of one namespace,
        or ``--allow-direct-references``; "Environments").
        ``limits``: the longest a job may run and each namespace's quotas ("Scheduling", "Batches"; none: no limit)."""
        self.store = store
        # Arrow rows and results live as files next to the database (docs/ARCHITECTURE.md).
        self.data = data or DataStore(store.path.parent)
        self.classes = classes
        self.version = version
        self.bus = EventBus()
        # CPU functions run at most one per core at a time (each is a worker process).
        scheduler = SchedulerState(
            classes.devices(),
            cpu_slots=cpu_slots or os.cpu_count() or 1,
            warm=self._warm_devices,
            caps=gpu_caps,
            totals={spec.name: class_totals(spec.gpu_class, len(spec.devices)) for spec in classes.classes},
        )
        self.table = table = JobTable(scheduler=scheduler, executor=executor)
        if executor is not None and gpu_caps:
            executor.limit_namespaces(gpu_caps)  # what it asks of a cluster stays within them
        # the one place that asks who queues; a job's CPU and memory read from its version ("Compute resources")
        needs = functools.lru_cache(4096)(self._needs)
        self.placement = placement_for(table, executor, classes, needs=needs)
        self.spend = Spend(budgets) if budgets else None
        self._stopped = threading.Event()
        self.reports = Reports(
            table, classes=classes, bus=self.bus, placement=self.placement, needs=needs, spend=self.spend
        )
        # Jobs whose latest change the full disk kept from being saved; memory is authoritative
        # for them (a finished job stays there, not in the table) until a retry saves them.
        self.unsaved = UnsavedJobs(
            store, self.bus, table.lock, lambda rec: dumps(self.reports.job_wire(rec)), lambda: table.started
        )
        self.journal = JobJournal(table, store=store, bus=self.bus, reports=self.reports, unsaved=self.unsaved)
        self.secrets = SecretVault(store)  # each namespace's secrets ("Secrets"): one copy, shared
        self.environments = EnvironmentStage(
            table,
            store=store,
            journal=self.journal,
            cache=environments,
            allow_direct_references=allow_direct_references,
            secrets=self.secrets,
        )
        self.catalog = FunctionCatalog(
            store=store,
            classes=classes,
            lock=table.lock,
            journal=self.journal,
            environment_check=self.environments.problem,
            digest_key=digest_key,
            allow_direct_references=allow_direct_references,
            secrets=self.secrets,
        )
        self.jobs = JobQueries(table, store=store, unsaved=self.unsaved, reports=self.reports)
        self.results = Results(data=self.data, jobs=self.jobs, journal=self.journal)
        self.machine = JobMachine(
            table,
            store=store,
            data=self.data,
            classes=classes,
            catalog=self.catalog,
            journal=self.journal,
            reports=self.reports,
            jobs=self.jobs,
            environments=self.environments,
            placement=self.placement,
            limits=limits,
        )
        self.intake = Intake(
            table,
            store=store,
            data=self.data,
            catalog=self.catalog,
            environments=self.environments,
            journal=self.journal,
            reports=self.reports,
            jobs=self.jobs,
            machine=self.machine,
            placement=self.placement,
            limits=self.machine.limits,
        )
        self.environments.enqueue = self.machine.enqueue_built
        self.environments.fail = self.machine.fail_environment
        self.callbacks = JobCallbacks(
            table,
            journal=self.journal,
            reports=self.reports,
            results=self.results,
            jobs=self.jobs,
            machine=self.machine,
        )
        # A team's backfill table I/O with the team's rights on a shared server ("Backfills", "Which tables").
        self.table_agents = TableAgents()
        if executor is not None:
            executor.table_agents = self.table_agents
        # Fan-out of `map` over chunk jobs (server/batches/manager.py).
        self.batches = BatchManager(
            table,
            store=store,
            data=self.data,
            bus=self.bus,
            catalog=self.catalog,
            jobs=self.jobs,
            machine=self.machine,
            intake=self.intake,
            results=self.results,
            table_roots=table_roots,
            table_agents=self.table_agents,
        )
        self.journal.watchers.append(self.batches.on_job)
        self.journal.forgetters.append(self.callbacks.forget)
        self.journal.forgetters.append(self.environments.forget)
        self.journal.forgetters.append(self.data.staging.discard)

    # ---------------------------------------------------------------- lifecycle

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.table.loop = loop
        self.bus.attach(loop)

    def start(self) -> None:
        """Recover durable state, start the executor and place whatever can run."""
        table = self.table
        with table.lock:
            if table.executor is not None:
                table.executor.start(self.callbacks)
                self._apply_executor_capacity()
            self.data.start()  # temp files go, staged results move to the home
            self.machine.recover()
            for done in reversed(self.store.list_jobs(states=(DONE,), job_type="run_function", limit=1000)):
                self.reports.note_run_time(done)
            self._recount_spend()
            self.results.enforce_retention()
            self.batches.recover()
            table.started = True
            self.placement.start(self.machine)

    def begin_shutdown(self) -> None:
        """First step of a graceful stop (on the loop thread): end streams and long polls now
        so open connections don't hold the server up."""
        self.bus.close()
        with self.table.lock:
            self.table.started = False
            self.jobs.wake_all()

    def has_work(self) -> bool:
        """Whether a job is pending or running (or a batch has chunks to go): the server is not idle."""
        return bool(self.table.active) or self.batches.has_work()

    def shutdown(self) -> None:
        table = self.table
        self._stopped.set()
        self.environments.shutdown()
        self.batches.close()  # the commit under way finishes; queued ones are redone on the next start
        with table.lock:
            table.started = False
            executor, table.executor = table.executor, None
        if executor is not None:
            try:
                executor.shutdown()
            except Exception:  # shutting down anyway; the reason goes to the log
                log.exception("executor shutdown failed")
        self.table_agents.close()  # after the commits and the executor: nothing asks them any more
        self.data.close()  # staged results reach the home
        with table.lock:
            self.journal.flush_all()
            self.unsaved.cancel_retry()
            self.reports.close()
            self.unsaved.save(retry=False)
        self.jobs.wake_all()  # waiters get the job as it stands now rather than hanging until their timeout

    def _recount_spend(self) -> None:
        """Today's spend of the namespaces with a budget, from the jobs that ended today (lock held; "Budgets"); a
        thread starts each UTC day afresh."""
        if self.spend is None:
            return
        for namespace in self.spend.budgets:
            for rec in self.store.list_jobs(
                states=tuple(TERMINAL), job_type="run_function", limit=10**6, namespace=namespace
            ):
                if rec.finished_ms is not None and utc_day(rec.finished_ms) == self.spend.day:
                    self.reports.note_spend(rec)
        threading.Thread(target=self._roll_spend, name="lancefn-budgets", daemon=True).start()

    def _roll_spend(self) -> None:
        """At each UTC midnight the budgets start afresh and the namespaces' waiting jobs are placed."""
        spend = self.spend
        assert spend is not None
        while not self._stopped.wait(BUDGET_CHECK_S):
            with self.table.lock:
                if spend.roll(now_ms()):
                    self.table.scheduler.paused.clear()
                    self.placement.budgets_reset(self.machine)

    def _needs(self, namespace: str, name: str, version: str, gpu_class: str | None) -> tuple[float, int] | None:
        """The host (CPU cores, memory bytes) a job of the version holds while it runs (``resource_request``;
        docs/ARCHITECTURE.md, "Compute resources"); None: it asks for none. Cached: a version never changes."""
        row = self.store.get_version(name, version, namespace)
        spec = self.classes.get(gpu_class)
        if row is None or spec is None:
            return None
        request = resource_request(stored_version(row.definition).runtime.resources, spec.gpu_class)
        return (request.cpu or 0.0, request.memory or 0) if request else None

    def _warm_devices(self, owner: Any) -> list[tuple[str, ...]]:
        """The scheduler's warm lookup (docs/ARCHITECTURE.md, "Warm state"): the device sets whose
        idle worker holds ``owner``'s ``(namespace, name, version)``; none when the executor fails
        to say (the job then takes the lowest free devices)."""
        executor = self.table.executor
        if executor is None:
            return []
        try:
            namespace, name, version = owner  # as ``placement.owner`` makes it
            return list(executor.warm_devices(namespace, name, version))
        except Exception:
            log.exception("executor.warm_devices(%r) failed; placing on the lowest free devices", owner)
            return []

    def _apply_executor_capacity(self) -> None:
        executor = self.table.executor
        capacity = executor.capacity() if executor is not None else None
        for spec in self.classes.classes:
            count = (capacity or {}).get(spec.name)
            if count is not None and not spec.devices:
                # Classes without local devices (Ray) get one slot id per GPU the executor reports.
                self.table.scheduler.set_devices(spec.name, tuple(f"slot{i}" for i in range(count)))
            elif not spec.devices:
                self.table.scheduler.set_devices(
                    spec.name, tuple(f"slot{i}" for i in range(spec.gpu_class.max_gpu_count_per_worker))
                )
