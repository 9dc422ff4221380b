"""A batch's chunks are submitted in slices, and a slice ends after one chunk when another thread waits for the
job table's lock (docs/ARCHITECTURE.md, "Batches"): another team's request waits for one submission, not a slice.
In-process plane with an executor that never finishes a job, so every chunk stays submitted."""

from __future__ import annotations

import itertools
import threading

import pytest
from conftest import registration_body

from lancefn_jupyter.server.batches.manager import SUBMIT_SLICE
from lancefn_jupyter.server.executors.base import Executor, TaskSpec
from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.policy.gpu_classes import simulated_default
from lancefn_jupyter.server.storage.store import Store

pytestmark = pytest.mark.unit

CHUNKS = 300


class Holding(Executor):
    """Takes tasks and never reports on them."""

    name = "holding"

    def start(self, callbacks) -> None:
        self.callbacks = callbacks

    def launch(self, task: TaskSpec) -> None:
        pass

    def cancel(self, job_id: str) -> None:
        pass

    def shutdown(self) -> None:
        pass


def test_a_slice_ends_after_one_chunk_while_another_thread_waits_for_the_lock(tmp_path):
    plane = ControlPlane(store=Store(tmp_path / "db.sqlite3"), classes=simulated_default(), executor=Holding())
    plane.start()
    try:
        job = plane.jobs.record(plane.catalog.register(registration_body("a")).job_id)
        assert job is not None
        version = job.result["version"]
        created = plane.batches.create(
            "a", version, [[{"x": i}] for i in range(CHUNKS)], parallel=None, retries=0, timeout_s=None, fresh=True
        )
        batch = plane.batches.describe(created["batch_id"])
        assert batch["batch_id"] == created["batch_id"]

        def submitted() -> int:
            return sum(1 for rec in plane.table.active.values() if rec.job_type == "run_function")

        seen: list[int] = []
        with plane.table.lock:
            first = submitted()
        assert first <= SUBMIT_SLICE  # the reply came after the first slice; a thread submits the rest
        stop = threading.Event()

        def contend() -> None:  # takes the lock again as soon as it lets go: always a waiter while it is held
            while not stop.is_set():
                with plane.table.lock:
                    seen.append(submitted())
                    if seen[-1] == CHUNKS:
                        return

        contender = threading.Thread(target=contend)
        contender.start()
        contender.join(120)
        stop.set()
        assert seen[-1] == CHUNKS, "every chunk was submitted"
        steps = [later - earlier for earlier, later in itertools.pairwise(seen) if later != earlier]
        # The waiter count is a hint (the contender is between two holds now and then): most slices are one chunk.
        ones = sum(1 for step in steps if step == 1)
        assert ones >= 0.8 * len(steps), f"slices went on while a thread waited: {sorted(steps)}"
    finally:
        plane.shutdown()
