"""The plane's environment stage (docs/ARCHITECTURE.md, "Environments") in process, with a recording executor and
a fake cache whose builds finish when the test says: a job waits PENDING in no device queue with its pending
reason while its environment builds, once per key, its output in the job's logs; built → queued with its
``venv`` and a lease closed when it ends; failed → FAILED in phase ``environment``, and the next job builds
again; refused → FAILED at once; cancel while building; a restart re-stages; timings; registration warnings.
The real cache and worker over HTTP: ``tests/server/executors/test_local_environments.py``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import registration_body
from helpers import RecordingExecutor, admit, in_process_plane
from helpers import job_wire as wire
from helpers import wait_until as wait_for

from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.environments.cache import Environment, EnvironmentFailure
from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.plane import ControlPlane


class Recording(RecordingExecutor):
    builds_environments = True

    def __init__(self, cache: FakeCache) -> None:
        super().__init__()
        self.cache = cache

    def environment_problem(self, request: EnvironmentRequest) -> str | None:
        return self.cache.problem(request)


class PerNamespace(Recording):
    """Workers (and builds) of each namespace as a uid of its own, as the local executor's ``--worker-uids``."""

    def environment_builder(self, namespace: str) -> BuildUser | None:
        uid = {"a": 61001, "b": 61002}[namespace]
        return BuildUser(uid, uid)


class FakeCache:
    """``EnvironmentCache``'s interface: a request needs a build when it names packages; builds block until
    ``release(key)``; ``fail`` makes the next build of a key fail."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, Environment] = {}
        self.builds: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.failing: set[str] = set()
        self.leases: list[int] = []

    def problem(self, request: EnvironmentRequest) -> str | None:
        return f"image={request.image!r}: no containers here" if request.image else None

    def needs_build(self, request: EnvironmentRequest) -> bool:
        return bool(request.packages)

    def key(self, request: EnvironmentRequest, *, gpu: bool = False, builder: BuildUser | None = None) -> str:
        return "k-" + "-".join(request.packages) + (f"-u{builder.uid}" if builder is not None else "")

    def lookup(
        self, request: EnvironmentRequest, *, gpu: bool = False, builder: BuildUser | None = None
    ) -> Environment | None:
        return self.built.get(self.key(request, builder=builder))

    def gate(self, key: str) -> threading.Event:
        return self.gates.setdefault(key, threading.Event())

    def ensure(
        self, request: EnvironmentRequest, log=None, *, gpu: bool = False, builder: BuildUser | None = None
    ) -> Environment | None:
        key = self.key(request, builder=builder)
        self.builds.append(key)
        if log is not None:
            log([f"Resolved {len(request.packages)} packages", "Installed tabulate==0.9.0"])
        assert self.gate(key).wait(30)
        self.gates.pop(key, None)
        if key in self.failing:
            self.failing.discard(key)
            raise EnvironmentFailure(
                "pip packages could not be built: × No solution found: nosuchpkg was not found",
                lines=["× No solution found"],
            )
        path = self.root / key
        path.mkdir(exist_ok=True)
        env = Environment(key, path, "/usr/bin/python3", path / "lock", (), 0)
        self.built[key] = env
        return env

    def lease(self, env: Environment) -> int | None:
        fd = os.open(os.devnull, os.O_RDONLY)
        self.leases.append(fd)
        return fd

    def release(self, key: str) -> None:
        self.gate(key).set()


def open_fds(cache: FakeCache) -> list[int]:
    alive = []
    for fd in sorted(set(cache.leases)):  # a closed descriptor's number is handed out again
        try:
            os.fstat(fd)
            alive.append(fd)
        except OSError:
            pass
    return alive


@pytest.fixture
def setup(tmp_path):
    cache = FakeCache(tmp_path)
    executor = Recording(cache)
    plane = in_process_plane(tmp_path, executor, environments=cache)
    yield plane, executor, cache
    plane.shutdown()


def version_with(plane: ControlPlane, name: str = "double", packages: tuple[str, ...] = (), **runtime) -> str:
    body = registration_body(name, packages=packages)
    body["runtime"].update(runtime)
    if "image" in runtime:
        body["runtime"]["environment"]["image"] = body["runtime"].pop("image")
    job_id, warnings = plane.catalog.register(body)
    rec = plane.jobs.record(job_id)
    assert rec is not None and rec.state == "DONE"
    plane.last_warnings = warnings  # type: ignore[attr-defined]
    return rec.result["version"]


def logs(plane: ControlPlane, job_id: str) -> list[str]:
    return plane.jobs.logs(job_id, 0, 1000, None)["lines"]


def test_a_job_waits_for_its_environment_without_holding_a_gpu_then_runs_in_it(setup):
    plane, executor, cache = setup
    version = version_with(plane, packages=("tabulate",))
    job_id = admit(plane, "double", version, [{"x": 1}])
    job = wire(plane, job_id)
    assert job["job_state"] == "PENDING" and executor.tasks == []
    placement = job["placement"]
    assert placement["pending_reason"].startswith("building environment (1 package, ")
    assert placement["pending_reason"].endswith(" s so far)")
    assert placement["waiting_on_capacity"] is False and placement["devices"] == []
    assert placement["queue_position"] is None
    assert plane.reports.gpu_usage()["classes"][0]["gpus_busy"] == 0
    wait_for(lambda: "[env] Installed tabulate==0.9.0" in logs(plane, job_id), "the build's output in the logs")
    cache.release("k-tabulate")
    (task,) = wait_for(lambda: executor.tasks, "the job launched once built")
    assert task.venv is not None and task.venv.key == "k-tabulate"
    assert task.environment is not None and task.environment.packages == ("tabulate",)
    assert "pending_reason" not in wire(plane, job_id)["placement"]
    assert any(line.startswith("[env] environment ready in ") for line in logs(plane, job_id))
    assert len(open_fds(cache)) == 1  # the job's lease
    executor.callbacks.task_started(job_id, devices=task.devices, node=None)
    executor.callbacks.task_succeeded(job_id, [2], timings={"run_ms": 1})
    timings = wire(plane, job_id)["timings"]
    assert timings["environment_ms"] > 0 and timings["cold"] is True
    done = wire(plane, job_id)
    assert timings["queued_ms"] <= done["started_ms"] - done["creation_ms"] - timings["environment_ms"] + 1
    assert open_fds(cache) == []  # closed when the job ended
    # The next job finds it in the cache: queued at once, no wait.
    second = admit(plane, "double", version, [{"x": 2}])
    assert executor.tasks[-1].job_id == second and executor.tasks[-1].venv is not None
    executor.callbacks.task_started(second, devices=executor.tasks[-1].devices, node=None)
    executor.callbacks.task_succeeded(second, [4])
    assert wire(plane, second)["timings"]["environment_ms"] == 0
    assert cache.builds == ["k-tabulate"]


def test_one_build_per_key_for_every_job_and_version_that_needs_it(setup):
    plane, executor, cache = setup
    one = version_with(plane, "one", packages=("tabulate",))
    two = version_with(plane, "two", packages=("tabulate",))
    jobs = [admit(plane, "one", one, [{"x": i}]) for i in range(3)] + [admit(plane, "two", two, [{"x": 9}])]
    wait_for(lambda: cache.builds, "the build to start")
    cache.release("k-tabulate")
    wait_for(lambda: len(executor.tasks) == 2, "two jobs placed on the two GPUs")
    assert cache.builds == ["k-tabulate"]
    assert [t.job_id for t in executor.tasks] == jobs[:2]  # FIFO among themselves
    assert [wire(plane, j)["placement"]["queue_position"] for j in jobs[2:]] == [1, 2]
    assert len(open_fds(cache)) == 1  # one lease for all of the plane's jobs of that environment
    for task in executor.tasks[:2]:
        executor.callbacks.task_started(task.job_id, devices=task.devices, node=None)
        executor.callbacks.task_succeeded(task.job_id, [0])
    wait_for(lambda: len(executor.tasks) == 4, "the other two placed")
    for task in executor.tasks[2:]:
        assert open_fds(cache)
        executor.callbacks.task_started(task.job_id, devices=task.devices, node=None)
        executor.callbacks.task_succeeded(task.job_id, [0])
    assert open_fds(cache) == []  # closed with the last of them
    # A job of it now (cached): leased again, queued at once.
    later = admit(plane, "two", two, [{"x": 1}])
    assert executor.tasks[-1].job_id == later and len(open_fds(cache)) == 1
    for job_id in jobs[1:]:  # a job that joined the build later still gets its output
        assert "[env] Installed tabulate==0.9.0" in logs(plane, job_id)


def test_a_failed_build_fails_every_waiting_job_and_the_next_job_builds_again(setup):
    plane, executor, cache = setup
    version = version_with(plane, packages=("nosuchpkg",))
    cache.failing.add("k-nosuchpkg")
    first, second = (admit(plane, "double", version, [{"x": i}]) for i in range(2))
    cache.release("k-nosuchpkg")
    for job_id in (first, second):
        job = wait_for(lambda j=job_id: wire(plane, j)["job_state"] == "FAILED" and wire(plane, j), "failed")
        assert job["failure"]["phase"] == "environment"
        assert "nosuchpkg was not found" in job["failure"]["message"]
        assert "timings" not in job
    assert executor.tasks == []
    third = admit(plane, "double", version, [{"x": 3}])
    assert wire(plane, third)["job_state"] == "PENDING"
    wait_for(lambda: len(cache.builds) == 2, "a second build")
    cache.release("k-nosuchpkg")
    wait_for(lambda: executor.tasks, "the third job launched")


def test_a_refused_environment_fails_the_job_at_once_and_warns_at_registration(setup):
    plane, executor, cache = setup
    version = version_with(plane, packages=("tabulate",), image="repo/img:1")
    assert plane.last_warnings == ["image='repo/img:1': no containers here"]
    job = wire(plane, admit(plane, "double", version, [{"x": 1}]))
    assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "environment"
    assert job["failure"]["message"] == "image='repo/img:1': no containers here"
    assert cache.builds == [] and executor.tasks == []
    version_with(plane, "plain")
    assert plane.last_warnings == []


def test_a_version_without_packages_is_queued_at_once_without_an_environment(setup):
    plane, executor, cache = setup
    version = version_with(plane)
    job_id = admit(plane, "double", version, [{"x": 1}])
    (task,) = executor.tasks
    assert task.job_id == job_id and task.venv is None
    assert task.environment is not None and task.environment.packages == ()
    assert cache.builds == [] and cache.leases == []


def test_cancelling_a_job_while_its_environment_builds(setup):
    plane, executor, cache = setup
    version = version_with(plane, packages=("tabulate",))
    cancelled, kept = (admit(plane, "double", version, [{"x": i}]) for i in range(2))
    assert plane.machine.cancel(cancelled) == {"job_id": cancelled, "cancelled": True}
    assert wire(plane, cancelled)["job_state"] == "CANCELLED"
    assert executor.cancelled == []  # it had no worker
    cache.release("k-tabulate")
    wait_for(lambda: executor.tasks, "the other job launched")
    assert [t.job_id for t in executor.tasks] == [kept]
    assert len(open_fds(cache)) == 1  # only the job that goes on holds a lease


def test_a_restart_stages_pending_jobs_again(tmp_path):
    cache = FakeCache(tmp_path)
    plane = in_process_plane(tmp_path, Recording(cache), environments=cache)
    version = version_with(plane, packages=("tabulate",))
    job_id = admit(plane, "double", version, [{"x": 1}])
    wait_for(lambda: cache.builds, "the build started")
    plane.shutdown()
    cache.release("k-tabulate")  # the stopped plane's build ends: it reports nothing
    wait_for(lambda: "k-tabulate" in cache.built, "the first build's end")
    cache.built.clear()  # as if the build had been killed with the server
    executor = Recording(cache)
    again = in_process_plane(tmp_path, executor, environments=cache)
    try:
        assert wire(again, job_id)["placement"]["pending_reason"].startswith("building environment")
        wait_for(lambda: len(cache.builds) == 2, "built again")
        cache.release("k-tabulate")
        (task,) = wait_for(lambda: executor.tasks, "the job launched after the restart")
        assert task.job_id == job_id and task.venv is not None
    finally:
        again.shutdown()


def test_a_long_build_refreshes_its_jobs_pending_reason_in_events(setup, monkeypatch):
    import json

    from lancefn_jupyter.server.control import environments

    monkeypatch.setattr(environments, "REFRESH_S", 0.05)
    plane, executor, cache = setup
    version = version_with(plane, packages=("tabulate",))
    job_id = admit(plane, "double", version, [{"x": 1}])

    def reasons() -> list[str]:
        found = []
        for _, data in plane.store.events_after(0, limit=10_000):
            job = json.loads(data)
            if job.get("job_id") == job_id and job["placement"].get("pending_reason"):
                found.append(job["placement"]["pending_reason"])
        return found

    wait_for(lambda: len(reasons()) >= 3, "refreshed job events while building")
    cache.release("k-tabulate")
    wait_for(lambda: executor.tasks, "launched")
    assert all(reason.startswith("building environment (1 package, ") for reason in reasons())


def test_each_namespace_builds_its_own_environment_and_direct_references_follow_the_servers_rule(tmp_path):
    cache = FakeCache(tmp_path)
    executor = PerNamespace(cache)
    plane = in_process_plane(tmp_path, executor, environments=cache, allow_direct_references=False)
    try:
        for namespace in ("a", "b"):
            job_id, _ = plane.catalog.register(registration_body(packages=("tabulate",)), namespace)
            version = plane.jobs.record(job_id).result["version"]  # type: ignore[union-attr]
            admit(plane, "double", version, [{"x": 1}], namespace=namespace)
        wait_for(lambda: len(cache.builds) == 2, "a build per namespace")
        assert sorted(cache.builds) == ["k-tabulate-u61001", "k-tabulate-u61002"]
        for key in cache.builds:
            cache.release(key)
        tasks = wait_for(lambda: len(executor.tasks) == 2 and executor.tasks, "both jobs placed")
        assert {(task.namespace, task.venv.key if task.venv else None) for task in tasks} == {
            ("a", "k-tabulate-u61001"),
            ("b", "k-tabulate-u61002"),
        }
        with pytest.raises(ApiError) as refused:  # a server of several namespaces, no --allow-direct-references
            plane.catalog.register(registration_body("evil", packages=("evil @ file:///tmp/evil",)), "a")
        assert refused.value.status == 400 and "--allow-direct-references" in str(refused.value)
    finally:
        plane.shutdown()
        plane.store.close()
