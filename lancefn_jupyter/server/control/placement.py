"""Who queues a job that is ready to run, and so how it is placed (docs/ARCHITECTURE.md, "Scheduling"): the plane's
scheduler (:class:`SchedulerPlacement`: the local executor) or the executor itself (:class:`ExecutorPlacement`: Ray,
whose cluster decides where and when). The strategy is chosen once, where the plane is composed (``plane.py``,
:func:`placement_for`); the parts ask it, never which executor runs. Runs in the control plane, with the job table's
lock held.

A job is *ready* once its environment is (``environments.py``): new (the intake), built, or recovered after a restart.
Under the scheduler it joins a device queue and is launched when :meth:`Launcher.dispatch` places it; under an
executor that queues, it is launched at once and stays PENDING until the executor reports it started."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.states import IN_PROGRESS, TERMINAL
from lancefn_jupyter.server.executors.base import Executor, InlineRun
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.storage.store import JobRecord

# (namespace, name, version, gpu_class) → the host (CPU cores, memory bytes) its job holds while it runs, or None.
Needs = Callable[[str, str, str, str | None], "tuple[float, int] | None"]


def owner(rec: JobRecord) -> tuple[str, str, str] | None:
    """What a worker serves, ``(namespace, name, version)``: the scheduler asks which idle workers
    hold it when the job is placed (docs/ARCHITECTURE.md, "Warm state")."""
    if rec.job_type != "run_function":
        return None
    return (rec.namespace, rec.spec.get("name", ""), rec.spec.get("version", ""))


@dataclass(slots=True, eq=False)
class NewJob:
    """The job the intake is admitting, on its way to its first launch: its rows come with it (a queued job's are read
    back from the journal), and ``inline`` receives its ``InlineRun`` when ``wants_inline`` and the executor lets the
    admitting thread run it (``Executor.launch_inline``)."""

    rec: JobRecord
    rows: Any
    wants_inline: bool = False
    inline: InlineRun | None = None


class Launcher(Protocol):
    """What a strategy places and launches jobs with (``JobMachine``)."""

    def dispatch(self, changed: bool = False, new: NewJob | None = None) -> bool: ...

    def launch(self, rec: JobRecord, new: NewJob | None = None) -> None: ...

    def publish_usage(self) -> None: ...


class PlacementStrategy(ABC):
    # Whether a new job's first (queued) event is written with its insert: yes when the executor queues it (nothing
    # changes before it starts); no under the scheduler, which may place it at once: its first event then carries
    # its devices, so a job that starts at once is never shown waiting for capacity.
    event_with_insert: bool
    # Whether the plane holds a queue to show: its ``queue`` events and snapshots, pending jobs' positions.
    has_queue: bool

    def __init__(self, table: JobTable) -> None:
        self.table = table

    @abstractmethod
    def enqueue(self, rec: JobRecord) -> None:
        """A ready job joins the queue it waits in."""

    @abstractmethod
    def place_new(self, machine: Launcher, new: NewJob) -> bool:
        """Place (or launch) the job the intake admits; True when it waits in the plane's queue, so its queued event
        is due."""

    @abstractmethod
    def place_ready(self, machine: Launcher, recs: list[JobRecord]) -> list[JobRecord]:
        """Jobs whose environment was built, in the order they came: queued and placed, or launched; those still
        waiting in the plane's queue (their queued event is due)."""

    @abstractmethod
    def start(self, machine: Launcher) -> None:
        """The plane started (recovered jobs are ready): place or launch them."""

    def start_changes_usage(self, rec: JobRecord) -> bool:
        """Whether ``rec``'s start (``task_started``) changes the GPU usage the plane reports."""
        return False

    @abstractmethod
    def usage(self) -> list[dict]:
        """GpuUsage per class (``GET /v1/gpu/usage``, the ``usage`` event)."""

    @abstractmethod
    def describe_wait(self, rec: JobRecord, placement: dict) -> None:
        """Fill in ``placement`` (its wire form) for a PENDING job that is in no plane queue and waits for no
        environment."""

    def budgets_reset(self, machine: Launcher) -> None:
        """A new UTC day: no namespace is over its budget any more (``SchedulerState.paused`` was cleared); start
        what waited for it (lock held; docs/ARCHITECTURE.md, "Budgets")."""
        machine.dispatch(changed=True)


class SchedulerPlacement(PlacementStrategy):
    """The plane's scheduler queues ready jobs per class and places them on devices (``policy/scheduler.py``)."""

    event_with_insert = False
    has_queue = True

    def __init__(self, table: JobTable, needs: Needs | None = None) -> None:
        super().__init__(table)
        self.needs = needs

    def enqueue(self, rec: JobRecord) -> None:
        who = owner(rec)
        needs = None
        if self.needs is not None and who is not None and rec.num_gpus:  # "Compute resources"
            needs = self.needs(*who, rec.gpu_class)
        self.table.scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus, who, rec.namespace, needs)

    def place_new(self, machine: Launcher, new: NewJob) -> bool:
        machine.dispatch(changed=new.rec.num_gpus > 0, new=new)
        return self.table.scheduler.is_pending(new.rec.job_id)

    def place_ready(self, machine: Launcher, recs: list[JobRecord]) -> list[JobRecord]:
        for rec in recs:
            self.enqueue(rec)
        machine.dispatch(changed=True)
        table = self.table
        return [rec for rec in recs if rec.job_id in table.active and table.scheduler.is_pending(rec.job_id)]

    def start(self, machine: Launcher) -> None:
        machine.dispatch()

    def usage(self) -> list[dict]:
        return self.table.scheduler.usage()

    def describe_wait(self, rec: JobRecord, placement: dict) -> None:
        """Nothing to add: out of the scheduler's queue, it is placed (the executor is starting its worker)."""


class ExecutorPlacement(PlacementStrategy):
    """The executor queues and places jobs itself (``Executor.owns_queue``): each is launched as soon as it is ready,
    bypassing the scheduler, and the usage is the GPUs the executor reports per class (``Executor.capacity``)."""

    event_with_insert = True
    has_queue = False

    def __init__(self, table: JobTable, classes: GpuClassConfig) -> None:
        super().__init__(table)
        self.classes = classes
        # Jobs of a namespace over its daily budget, not handed to the executor until the budgets reset, in the order
        # they came ("Budgets": the executor's queue cannot pass a namespace over, so they wait here)
        self.held: dict[str, None] = {}

    def enqueue(self, rec: JobRecord) -> None:
        """Nothing: the executor queues it when it is launched."""

    def _launch(self, machine: Launcher, rec: JobRecord, new: NewJob | None = None) -> None:
        if rec.namespace in self.table.scheduler.paused:
            self.held[rec.job_id] = None
        else:
            machine.launch(rec, new)

    def place_new(self, machine: Launcher, new: NewJob) -> bool:
        if self.table.started:
            self._launch(machine, new.rec, new)
        machine.publish_usage()
        return False

    def place_ready(self, machine: Launcher, recs: list[JobRecord]) -> list[JobRecord]:
        if self.table.started:
            for rec in recs:
                self._launch(machine, rec)
        return []

    def start(self, machine: Launcher) -> None:
        for rec in list(self.table.active.values()):  # recovered jobs, oldest first
            self._launch(machine, rec)

    def budgets_reset(self, machine: Launcher) -> None:
        held, self.held = self.held, {}
        for job_id in held:
            rec = self.table.active.get(job_id)
            if rec is not None and rec.state not in TERMINAL:  # not cancelled meanwhile
                self._launch(machine, rec)
        machine.publish_usage()

    def start_changes_usage(self, rec: JobRecord) -> bool:
        return rec.num_gpus > 0

    def usage(self) -> list[dict]:
        """The GPUs the executor reports per class and the jobs it is running / holding."""
        executor = self.table.executor
        capacity = (executor.capacity() if executor is not None else None) or {}
        rows: dict[str, dict[str, Any]] = {
            spec.name: {
                "name": spec.name,
                "gpus_total": int(capacity.get(spec.name, 0)),
                "gpus_busy": 0,
                "jobs_running": 0,
                "jobs_pending": 0,
            }
            for spec in self.classes.classes
        }
        for rec in self.table.active.values():
            row = rows.get(rec.gpu_class or "") if rec.num_gpus else None
            if row is None:
                continue
            if rec.state == IN_PROGRESS:
                row["gpus_busy"] += rec.num_gpus
                row["jobs_running"] += 1
            else:
                row["jobs_pending"] += 1
                if "pending_reason" not in row and executor is not None:
                    reason = executor.pending_reason(rec.gpu_class, rec.num_gpus)
                    if reason:
                        row["pending_reason"] = reason
        for name, nodes in ((executor.scaling() if executor is not None else None) or {}).items():
            if name in rows:  # a class an autoscaler scales: nodes up / starting / maximum (docs/ray.md)
                rows[name].update((key, nodes[key]) for key in ("nodes_up", "nodes_starting", "nodes_max"))
        return list(rows.values())

    def describe_wait(self, rec: JobRecord, placement: dict) -> None:
        if rec.devices:
            return
        placement["waiting_on_capacity"] = True  # queued in the executor (or held here): no positions
        if rec.job_id in self.held:
            placement["pending_reason"] = self.table.scheduler.paused.get(rec.namespace) or "waiting for its budget"
            return
        executor = self.table.executor
        reason = executor.pending_reason(rec.gpu_class, rec.num_gpus) if executor is not None else None
        if reason:
            placement["pending_reason"] = reason
        scaling = ((executor.scaling() if executor is not None and rec.num_gpus else None) or {}).get(
            rec.gpu_class or ""
        )
        if scaling and "next_up_ms" in scaling:
            # Its class scales up: not before the next node joins, as long as recent starts took (docs/ray.md)
            placement["expected_start_ms"] = max(scaling["next_up_ms"], int(time.time() * 1000))
            placement["expected_start_uncertain"] = True


def placement_for(
    table: JobTable, executor: Executor | None, classes: GpuClassConfig, needs: Needs | None = None
) -> PlacementStrategy:
    """The strategy for ``executor`` (``plane.py``): the executor's queue when it queues jobs itself, else the
    scheduler's."""
    if executor is not None and executor.owns_queue:
        return ExecutorPlacement(table, classes)
    return SchedulerPlacement(table, needs)
