"""The control plane's side of warm state (docs/ARCHITECTURE.md, "Warm state") with a recording
executor in place of workers, so the executor's reports are exactly what the test says: the task's
``state``, the timings a job keeps (through a restart of its store), the warm device set a job is
placed on, and a batch whose chunk setup fails twice in phase ``setup``.  What a real worker reports
is tested over HTTP next to these (test_job_timings.py, test_warm_placement.py, batches/)."""

from __future__ import annotations

import pytest
from conftest import registration_body
from helpers import RecordingExecutor, admit, in_process_plane
from helpers import job_wire as wire

from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.storage.store import Store
from lancefn_jupyter.wire.models import JobFailure


class Recording(RecordingExecutor):
    def __init__(self) -> None:
        super().__init__()
        self.warm: dict[tuple[str, str, str], list[tuple[str, ...]]] = {}
        self.warm_asked: list[tuple[str, str, str]] = []
        self.broken = False

    def warm_devices(self, namespace: str, name: str, version: str) -> list[tuple[str, ...]]:
        self.warm_asked.append((namespace, name, version))
        if self.broken:
            raise RuntimeError("the executor lost track")
        return self.warm.get((namespace, name, version), [])


@pytest.fixture
def plane(tmp_path):
    executor = Recording()
    plane = in_process_plane(tmp_path, executor)
    yield plane, executor
    plane.shutdown()


def register(plane: ControlPlane, body: dict) -> str:
    job = plane.jobs.record(plane.catalog.register(body).job_id)
    assert job is not None and job.state == "DONE", job
    return job.result["version"]


def test_the_task_carries_the_versions_state(plane):
    plane, executor = plane
    default = register(plane, registration_body("a"))
    body = registration_body("b")
    body["runtime"]["state"] = "per_job"
    per_job = register(plane, body)
    admit(plane, "a", default, [{"x": 1}])
    admit(plane, "b", per_job, [{"x": 1}])
    assert [(t.name, t.state) for t in executor.tasks] == [("a", "per_worker"), ("b", "per_job")]


def test_a_job_keeps_the_timings_its_executor_reported_across_a_restart(plane, tmp_path):
    plane, executor = plane
    version = register(plane, registration_body())
    job_id = admit(plane, "double", version, [{"x": 2}])
    (task,) = executor.tasks
    executor.callbacks.task_started(job_id, devices=task.devices, node=None)
    executor.callbacks.task_succeeded(job_id, [4], timings={"start_ms": 30.0, "setup_ms": 400.0, "run_ms": 5.5})
    job = wire(plane, job_id)
    assert job["job_state"] == "DONE" and job["result"] == [4]
    timings = job["timings"]
    assert {k: timings[k] for k in ("start_ms", "environment_ms", "setup_ms", "run_ms", "cold")} == {
        "start_ms": 30.0,
        "environment_ms": 0.0,
        "setup_ms": 400.0,
        "run_ms": 5.5,
        "cold": True,
    }
    assert timings["queued_ms"] == max(0, job["started_ms"] - job["creation_ms"] - 30)
    # A warm job right after: nothing paid; the failure path keeps timings too.
    second = admit(plane, "double", version, [{"x": 3}])
    executor.callbacks.task_started(second, devices=executor.tasks[1].devices, node=None)
    executor.callbacks.task_failed(second, JobFailure(phase="run", message="bad row"), timings={"run_ms": 1})
    assert wire(plane, second)["timings"]["cold"] is False and wire(plane, second)["timings"]["run_ms"] == 1
    reopened = Store(tmp_path / "db.sqlite3")  # what a restarted plane reads
    assert reopened.get_job(job_id).timings == timings
    reopened.close()


def test_a_job_is_placed_on_the_free_devices_whose_idle_worker_holds_its_version(plane):
    plane, executor = plane
    version = register(plane, registration_body())
    executor.warm[("default", "double", version)] = [("sim1",)]
    first = admit(plane, "double", version, [{"x": 1}])
    assert executor.tasks[-1].devices == ("sim1",)
    assert executor.warm_asked == [("default", "double", version)]
    # Its warm device is busy now: the next job takes the lowest free one.
    admit(plane, "double", version, [{"x": 2}])
    assert executor.tasks[-1].devices == ("sim0",)
    executor.callbacks.task_started(first, devices=("sim1",), node=None)
    executor.callbacks.task_succeeded(first, [2])
    # An executor that cannot say: the lowest free devices, and the job still runs.
    executor.broken = True
    admit(plane, "double", version, [{"x": 3}])
    assert executor.tasks[-1].devices == ("sim1",) and len(executor.tasks) == 3


def test_a_second_setup_failure_fails_the_batch_at_once_with_that_setups_message(plane):
    plane, executor = plane
    version = register(plane, registration_body())
    reply = plane.batches.create(
        "double", version, [[{"x": i}] for i in range(4)], parallel=1, retries=0, timeout_s=None, fresh=True
    )
    batch_id = reply["batch_id"]
    for attempt in (1, 2):
        task = executor.tasks[-1]
        assert task.job_id == plane.batches.describe(batch_id)["chunks"][0]["job_id"]
        executor.callbacks.task_started(task.job_id, devices=task.devices, node=None)
        failure = JobFailure(phase="setup", message=f"CUDA out of memory (try {attempt})")
        executor.callbacks.task_failed(task.job_id, failure, timings={"start_ms": 10, "setup_ms": 50})
        batch = plane.batches.describe(batch_id)
        if attempt == 1:  # one more try although retries=0
            assert batch["batch_state"] == "IN_PROGRESS" and batch["chunks"][0]["attempts"] == 2
    assert batch["batch_state"] == "FAILED" and batch["strip"] == "fccc"
    assert [c["attempts"] for c in batch["chunks"]] == [2, 0, 0, 0]
    assert (batch["failure"]["chunk"], batch["failure"]["phase"]) == (0, "setup")
    assert batch["failure"]["message"] == "CUDA out of memory (try 2)"
    assert len(executor.tasks) == 2  # the waiting chunks never became jobs


def test_a_setup_failure_cancels_the_batchs_live_chunk_jobs(plane):
    plane, executor = plane
    version = register(plane, registration_body())
    reply = plane.batches.create(
        "double", version, [[{"x": i}] for i in range(5)], parallel=None, retries=2, timeout_s=None, fresh=True
    )
    batch_id = reply["batch_id"]
    first, second = executor.tasks  # both GPUs busy, three chunks queued behind them
    for task in (first, second):
        executor.callbacks.task_started(task.job_id, devices=task.devices, node=None)
    executor.callbacks.task_failed(first.job_id, JobFailure(phase="setup", message="no weights"))
    # Chunk 0's one more try queues behind the chunks already queued; chunk 2 took the freed GPU.
    chunks = plane.batches.describe(batch_id)["chunks"]
    assert executor.tasks[-1].job_id == chunks[2]["job_id"]
    assert chunks[0]["attempts"] == 2 and chunks[0]["state"] == "PENDING"
    executor.callbacks.task_failed(second.job_id, JobFailure(phase="setup", message="no weights either"))
    batch = plane.batches.describe(batch_id)
    assert batch["batch_state"] == "FAILED" and batch["chunk_counts"] == {"FAILED": 1, "CANCELLED": 4}
    assert batch["failure"]["chunk"] == 1 and batch["failure"]["message"] == "no weights either"
    assert executor.cancelled == [chunks[2]["job_id"]]  # the one running: its worker is stopped
    assert {plane.jobs.record(c["job_id"]).state for c in batch["chunks"] if c["index"] != 1} == {"CANCELLED"}
    assert plane.reports.gpu_usage()["classes"][0]["jobs_pending"] == 0
    assert plane.reports.gpu_usage()["classes"][0]["gpus_busy"] == 0
