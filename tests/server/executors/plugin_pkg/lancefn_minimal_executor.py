"""A third executor, registered from outside lancefn_jupyter: this folder's ``*.dist-info/entry_points.txt`` names
:data:`PLUGIN` in the group ``lancefn.executors``, so ``lancefn-server --executor minimal`` finds it once the folder is
on ``PYTHONPATH`` (docs/ARCHITECTURE.md, "Executor plug-ins"; CONTRIBUTING.md, "How to write an executor").

It runs each task on a fresh worker process of its own (the real worker module, ``worker.process.WorkerProcess``),
on the devices the control plane placed it on, and stops it after the task: no warm workers, no timeouts, no
isolation. Its data ships in place (the worker shares the control plane's disk); a backfill chunk's table slice is
read into its rows file first, as the local executor does.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from lancefn_jupyter.server.executors.base import Executor, ExecutorCallbacks, TaskSpec
from lancefn_jupyter.server.executors.local import worker_base_env
from lancefn_jupyter.server.executors.plugins import Built, ExecutorContext, ExecutorRefused
from lancefn_jupyter.server.executors.relay import event_problem, relay, worker_task
from lancefn_jupyter.server.executors.shipping import in_place
from lancefn_jupyter.server.executors.table_agent import read_rows
from lancefn_jupyter.wire.models import JobFailure
from lancefn_jupyter.worker.process import ProtocolError, WorkerProcess, WorkerStartError, invalid_event
from lancefn_jupyter.worker.protocol import FINAL_EVENTS


class MinimalExecutor(Executor):
    name = "minimal"

    def __init__(self, node: str) -> None:
        self.node = node  # reported as each job's placement node
        self.callbacks: ExecutorCallbacks | None = None
        self.lock = threading.Lock()
        self.workers: dict[str, WorkerProcess] = {}  # by job id, while it runs
        self.cancelled: set[str] = set()

    def start(self, callbacks: ExecutorCallbacks) -> None:
        self.callbacks = callbacks

    def launch(self, task: TaskSpec) -> None:
        threading.Thread(target=self.run, args=(task,), name="minimal-job", daemon=True).start()

    def cancel(self, job_id: str) -> None:
        with self.lock:
            self.cancelled.add(job_id)
            worker = self.workers.pop(job_id, None)
        if worker is not None:
            worker.kill()

    def shutdown(self) -> None:
        with self.lock:
            workers, self.workers = list(self.workers.values()), {}
        for worker in workers:
            worker.kill()

    def run(self, task: TaskSpec) -> None:
        assert self.callbacks is not None
        try:
            if task.table_slice is not None:
                read_rows(self.table_agents, task)  # in place: the slice into the task's rows file
            worker = self.worker(task)
        except (OSError, ValueError, WorkerStartError) as error:
            self.callbacks.task_failed(task.job_id, JobFailure(phase="worker", message=str(error)))
            return
        try:
            # In place: a backfill chunk's slice is in its rows file by now (above).
            worker.start_task(worker_task(task, PLUGIN.ship(task.data.fields(), None)))
            self.callbacks.task_started(task.job_id, devices=task.devices, node=self.node)
            problem = self.follow(task, worker)
        finally:
            with self.lock:
                self.workers.pop(task.job_id, None)
            worker.kill()
        if problem is not None:  # a cancelled job's report is ignored by the core
            self.callbacks.task_failed(task.job_id, JobFailure(phase="worker", message=problem))

    def worker(self, task: TaskSpec) -> WorkerProcess:
        env = worker_base_env()
        env["CUDA_VISIBLE_DEVICES"] = "" if task.simulated else ",".join(task.devices)
        if task.simulated:
            env["NUMBA_ENABLE_CUDASIM"] = "1"
        worker = WorkerProcess(env)
        with self.lock:
            if task.job_id in self.cancelled:  # cancelled while it started
                worker.kill()
                raise WorkerStartError("cancelled")
            self.workers[task.job_id] = worker
        return worker

    def follow(self, task: TaskSpec, worker: WorkerProcess) -> str | None:
        """Relay the task's events up to its outcome; what went wrong when there was none."""
        assert self.callbacks is not None
        while True:
            try:
                event = worker.next_event()
            except ProtocolError as error:
                return str(error)
            if event is None:
                return "the worker exited before the task ended"
            problem = event_problem(event, task.job_id)
            if problem is not None:
                return invalid_event(event, problem)
            relay(self.callbacks, task.job_id, event)
            if event["event"] in FINAL_EVENTS:
                return None


class MinimalPlugin:
    name = "minimal"
    needs_devices = True  # the control plane places jobs on the classes' devices
    ship = staticmethod(in_place)

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("minimal executor (--executor minimal)")
        group.add_argument("--minimal-node", default="minimal-0", help="the node name its jobs report")

    def refuse(self, options: argparse.Namespace, chosen: str) -> str | None:
        return None

    def build(self, options: argparse.Namespace, context: ExecutorContext) -> Built:
        if not options.minimal_node.strip():
            raise ExecutorRefused("--minimal-node must name a node, e.g. --minimal-node gpu-box-1")
        environments = context.environments(None)  # its workers run as the server's user
        return Built(self.create(node=options.minimal_node), environments)

    def create(self, **opts: Any) -> Executor:
        return MinimalExecutor(opts.get("node") or "minimal-0")


PLUGIN = MinimalPlugin()
