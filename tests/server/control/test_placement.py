"""The placement strategies (``control/placement.py``; docs/ARCHITECTURE.md, "Starting a job"): who queues a ready job,
the plane's scheduler or the executor, chosen once for the executor; and the job table's own behaviour (``drop``,
``stop_worker``). Pure: a job table over a scheduler of two simulated GPUs, a launcher that records."""

from __future__ import annotations

import logging

import pytest

from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.placement import (
    ExecutorPlacement,
    NewJob,
    SchedulerPlacement,
    owner,
    placement_for,
)
from lancefn_jupyter.server.executors.base import Executor
from lancefn_jupyter.server.policy.gpu_classes import simulated_default
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.storage.store import JobRecord

pytestmark = pytest.mark.unit


class Queueing(Executor):
    """An executor that queues its own jobs, as Ray does."""

    name = "queueing"
    owns_queue = True

    def __init__(self, gpus: int = 4, reason: str | None = None, fails: bool = False) -> None:
        self.gpus, self.reason, self.fails, self.cancelled = gpus, reason, fails, []

    def start(self, callbacks) -> None:
        pass

    def launch(self, task) -> None:
        pass

    def cancel(self, job_id: str) -> None:
        if self.fails:
            raise RuntimeError("the cluster is gone")
        self.cancelled.append(job_id)

    def capacity(self) -> dict[str, int]:
        return {"default": self.gpus}

    def pending_reason(self, gpu_class, num_gpus) -> str | None:
        return self.reason

    def shutdown(self) -> None:
        pass


class Plain(Queueing):
    owns_queue = False


class Launcher:
    """Records what a strategy asks of the machine; its dispatch places with the real scheduler."""

    def __init__(self, table: JobTable) -> None:
        self.table, self.calls = table, []

    def dispatch(self, changed: bool = False, new: NewJob | None = None) -> bool:
        placed = self.table.scheduler.schedule()
        self.calls.append(("dispatch", changed, new.rec.job_id if new else None, [p.job_id for p in placed]))
        return bool(placed)

    def launch(self, rec: JobRecord, new: NewJob | None = None) -> None:
        self.calls.append(("launch", rec.job_id, new is not None))

    def publish_usage(self) -> None:
        self.calls.append(("usage",))


def job(job_id: str, num_gpus: int = 1, state: str = "PENDING", devices: tuple[str, ...] = ()) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        job_type="run_function",
        state=state,
        creation_ms=0,
        spec={"name": "f", "version": "v1"},
        gpu_class="default" if num_gpus else None,
        num_gpus=num_gpus,
        devices=devices,
        namespace="team",
    )


def table_of(executor: Executor | None = None, *recs: JobRecord) -> JobTable:
    table = JobTable(scheduler=SchedulerState({"default": ("sim0", "sim1")}, cpu_slots=1), executor=executor)
    for rec in recs:
        table.active[rec.job_id] = rec
    table.started = True
    return table


def test_the_strategy_follows_whether_the_executor_queues_its_own_jobs():
    classes = simulated_default()
    assert type(placement_for(table_of(), None, classes)) is SchedulerPlacement
    assert type(placement_for(table_of(), Plain(), classes)) is SchedulerPlacement
    assert type(placement_for(table_of(), Queueing(), classes)) is ExecutorPlacement
    assert owner(job("a")) == ("team", "f", "v1")


def test_under_the_scheduler_a_new_job_is_queued_then_placed_and_only_a_waiting_one_announces_its_place():
    a, b, c = job("a"), job("b"), job("c")
    table = table_of(None, a, b, c)
    placement, machine = SchedulerPlacement(table), Launcher(table)
    assert placement.has_queue and not placement.event_with_insert
    waiting = []
    for rec in (a, b, c):
        placement.enqueue(rec)
        waiting.append(placement.place_new(machine, NewJob(rec, [{"x": 1}])))
    assert waiting == [False, False, True]  # two GPUs: the third waits in the queue
    assert machine.calls == [
        ("dispatch", True, "a", ["a"]),
        ("dispatch", True, "b", ["b"]),
        ("dispatch", True, "c", []),
    ]
    assert table.scheduler.queue_position("c") == 1  # first in line
    assert [row["jobs_pending"] for row in placement.usage() if row["name"] == "default"] == [1]


def test_under_the_scheduler_built_jobs_join_the_queue_in_order_and_the_waiting_ones_are_returned():
    recs = [job(f"j{i}") for i in range(3)]
    table = table_of(None, *recs)
    placement, machine = SchedulerPlacement(table), Launcher(table)
    assert placement.place_ready(machine, recs) == [recs[2]]
    assert machine.calls == [("dispatch", True, None, ["j0", "j1"])]
    placement.start(machine)
    assert machine.calls[-1] == ("dispatch", False, None, [])
    assert not placement.start_changes_usage(recs[0])
    shown = {"waiting_on_capacity": False}
    placement.describe_wait(recs[0], shown)
    assert shown == {"waiting_on_capacity": False}


def test_an_executor_that_queues_gets_each_ready_job_at_once_and_the_scheduler_never_sees_it():
    a, b = job("a"), job("b")
    executor = Queueing()
    table = table_of(executor, a, b)
    placement, machine = ExecutorPlacement(table, simulated_default()), Launcher(table)
    assert placement.event_with_insert and not placement.has_queue
    placement.enqueue(a)
    assert not table.scheduler.is_pending("a") and table.scheduler.queue_position("a") is None
    assert placement.place_new(machine, NewJob(a, [{"x": 1}])) is False  # its event went with its insert
    assert machine.calls == [("launch", "a", True), ("usage",)]
    assert placement.place_ready(machine, [b]) == []
    assert machine.calls[-1] == ("launch", "b", False)
    table.started = False  # stopping: nothing is launched any more, the usage still moves
    assert placement.place_new(machine, NewJob(job("c"), [])) is False
    assert machine.calls[-1] == ("usage",)
    table.started = True
    machine.calls.clear()
    placement.start(machine)  # recovered jobs, oldest first
    assert machine.calls == [("launch", "a", False), ("launch", "b", False)]


def test_an_executor_that_queues_reports_its_capacity_and_why_jobs_wait():
    running, held, cpu = job("r", 2, "IN_PROGRESS", ("0", "1")), job("p", 1), job("cpu", 0)
    executor = Queueing(gpus=4, reason="no node can fit 1 GPU")
    placement = ExecutorPlacement(table_of(executor, running, held, cpu), simulated_default())
    [row] = placement.usage()
    assert row == {
        "name": "default",
        "gpus_total": 4,
        "gpus_busy": 2,
        "jobs_running": 1,
        "jobs_pending": 1,
        "pending_reason": "no node can fit 1 GPU",
    }
    shown: dict = {"waiting_on_capacity": False}
    placement.describe_wait(held, shown)
    assert shown == {"waiting_on_capacity": True, "pending_reason": "no node can fit 1 GPU"}
    started: dict = {}
    placement.describe_wait(running, started)  # on its devices: not waiting
    assert started == {}
    assert placement.start_changes_usage(running) and not placement.start_changes_usage(cpu)


def test_the_executor_strategy_survives_the_executor_being_gone_at_shutdown():
    placement = ExecutorPlacement(table_of(None, job("p")), simulated_default())
    assert placement.usage()[0]["gpus_total"] == 0
    shown: dict = {}
    placement.describe_wait(job("p"), shown)
    assert shown == {"waiting_on_capacity": True}


def test_a_job_leaving_the_table_takes_its_env_and_devices_with_it():
    a, b = job("a"), job("b")
    table = table_of(None, a, b)
    placement = SchedulerPlacement(table)
    for rec in (a, b):
        placement.enqueue(rec)
    table.scheduler.schedule()  # both placed
    table.job_env["a"] = {"TOKEN": "x"}
    queued = job("q")
    table.active["q"] = queued
    placement.enqueue(queued)
    assert table.drop("a") is True  # it held a GPU
    assert "a" not in table.active and "a" not in table.job_env and table.active.own == {"team": 2}
    assert table.drop("q") is False  # queued: its place goes, it held no device
    assert not table.scheduler.is_pending("q")
    assert table.drop("gone") is False  # already gone: nothing to do


def test_stopping_a_worker_asks_the_executor_and_logs_its_failure(caplog):
    executor = Queueing()
    table_of(executor).stop_worker("a")
    assert executor.cancelled == ["a"]
    table_of(None).stop_worker("a")  # no executor: nothing to stop
    with caplog.at_level(logging.ERROR, logger="lancefn.server"):
        table_of(Queueing(fails=True)).stop_worker("b")
    assert "executor.cancel(b) failed" in caplog.text
