"""A batch's chunks are submitted and cancelled in slices, and a slice ends after the chunk under way once another
thread has waited the lock's grace for the job table's lock (docs/ARCHITECTURE.md, "Batches"): another team's request
waits for the grace and one chunk, not a slice. In-process plane with an executor that never finishes a job, so every
chunk stays submitted. The grace is 0 here (a waiter is overdue at once), so the slices are of one chunk."""

from __future__ import annotations

import itertools
import threading
import time

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


def _contend(plane: ControlPlane, count, until: int) -> list[int]:
    """``count()`` each time this thread gets the lock, taking it again as soon as it lets go (so it is always a
    waiter while another thread holds it), until ``count() == until``."""
    seen: list[int] = []

    def contend() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with plane.table.lock:
                seen.append(count())
                if seen[-1] == until:
                    return

    contender = threading.Thread(target=contend)
    contender.start()
    contender.join(130)
    return seen


def _steps(seen: list[int]) -> list[int]:
    """How many chunks went between two of the contender's holds."""
    return [abs(later - earlier) for earlier, later in itertools.pairwise(seen) if later != earlier]


def _mostly_one_chunk(seen: list[int], until: int) -> None:
    assert seen and seen[-1] == until
    steps = _steps(seen)
    # The waiter count is a hint (the contender is between two holds now and then): most slices are one chunk.
    ones = sum(1 for step in steps if step == 1)
    assert ones >= 0.8 * len(steps), f"slices went on while a thread waited: {sorted(steps)}"


def _plane(tmp_path, grace_s: float) -> ControlPlane:
    plane = ControlPlane(store=Store(tmp_path / "db.sqlite3"), classes=simulated_default(), executor=Holding())
    plane.table.lock.grace_s = grace_s
    plane.start()
    return plane


def _submitted(plane: ControlPlane) -> int:
    return sum(1 for rec in plane.table.active.values() if rec.job_type == "run_function")


def test_a_slice_ends_after_one_chunk_while_another_thread_waits_for_the_lock(tmp_path):
    plane = _plane(tmp_path, grace_s=0.0)
    try:
        job = plane.jobs.record(plane.catalog.register(registration_body("a")).job_id)
        assert job is not None
        version = job.result["version"]
        created = plane.batches.create(
            "a", version, [[{"x": i}] for i in range(CHUNKS)], parallel=None, retries=0, timeout_s=None, fresh=True
        )

        def submitted() -> int:
            return _submitted(plane)

        with plane.table.lock:
            # The reply came after the first slice, and a thread submits the rest: it may have taken the lock for a
            # slice (or a chunk of one) before this did, never the whole batch.
            assert submitted() <= 2 * SUBMIT_SLICE
        _mostly_one_chunk(_contend(plane, submitted, CHUNKS), CHUNKS)  # every chunk submitted, one at a time

        cancelling = threading.Thread(target=plane.batches.cancel, args=(created["batch_id"],))
        cancelling.start()
        _mostly_one_chunk(_contend(plane, submitted, 0), 0)  # and cancelled one at a time
        cancelling.join(60)
        assert plane.batches.describe(created["batch_id"])["batch_state"] == "CANCELLED"
    finally:
        plane.shutdown()


def test_a_waiter_within_the_grace_lets_a_slice_run_whole(tmp_path):
    """A waiter that has not waited the grace yet (an hour here) does not end a slice: slices stay whole, so a batch
    whose own chunk jobs take the lock for a moment as they finish is not cut into one-chunk transactions."""
    plane = _plane(tmp_path, grace_s=3600.0)
    try:
        job = plane.jobs.record(plane.catalog.register(registration_body("a")).job_id)
        assert job is not None
        plane.batches.create(
            "a",
            job.result["version"],
            [[{"x": i}] for i in range(CHUNKS)],
            parallel=None,
            retries=0,
            timeout_s=None,
            fresh=True,
        )
        seen = _contend(plane, lambda: _submitted(plane), CHUNKS)
        assert seen[-1] == CHUNKS
        # The contender sees the table only between two slices, and slices start at chunk 0: every count it saw
        # is a whole number of slices (or the last, short one). It may miss a release now and then, so two slices
        # can pass between two of its holds; a slice cut early would show as a count off the grid.
        between = sorted({count for count in seen if 0 < count < CHUNKS})
        assert len(between) >= 5, f"the contender hardly ever got the lock between slices: {seen}"
        off_grid = [count for count in between if count % SUBMIT_SLICE]
        assert not off_grid, f"slices ended early for a waiter within its grace: counts {off_grid[:12]} seen"
    finally:
        plane.shutdown()
