"""A version's environment on the Ray executor (docs/ARCHITECTURE.md, "Environments"; docs/ray.md): declared pip
packages the control plane lacks go to Ray's ``uv`` as the pinned set resolved over the control plane's packages
(``--no-deps``), ``image`` to ``image_uri``; a failed resolution fails the job at once in phase ``environment``.

The unit tests build runtime_env fields and drive an unstarted executor; the ``ray`` tests run a real
``lancefn-server --executor ray`` (its own local Ray, ``LANCEFN_RAY_PIP=auto``) with a package the base lacks.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import register, registration_body, remove_tree
from helpers import absent_packages, let_workers_reach_this_python, reporting_project

from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.server.executors.base import TaskSpec
from lancefn_jupyter.server.executors.ray.cluster import environment_runtime_env, needs_resolution

ABSENT = "definitely-not-installed-lancefn-pkg"
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


def _plan(request: EnvironmentRequest) -> tuple[str, ...]:
    return tuple(f"{text.split('>')[0]}==1.0" for text in request.pip)


def _task(job_id: str = "j1", *, packages: tuple[str, ...] = (), **environment) -> TaskSpec:
    request = EnvironmentRequest(packages=packages, **environment) if (packages or environment) else None
    return TaskSpec(
        job_id, "f", "v", b"def f():\n    return 1\n", "f", [{}], (), True, "small", 1, {}, packages, None,
        environment=request,
    )  # fmt: skip


# ------------------------------------------------------------------------------ runtime_env fields (unit)


@pytest.mark.unit
def test_packages_the_control_plane_lacks_go_to_rays_uv_as_the_resolved_set_with_no_deps():
    request = EnvironmentRequest(packages=("numpy", f"{ABSENT}>=1"))
    fields = environment_runtime_env(request, request.packages, "auto", plan=_plan, uv_args=lambda: ["--offline"])
    assert fields == {
        "uv": {"packages": ["numpy==1.0", f"{ABSENT}==1.0"], "uv_pip_install_options": ["--no-deps", "--offline"]}
    }
    assert "pip" not in fields
    assert needs_resolution(request, request.packages, "auto")


@pytest.mark.unit
def test_nothing_is_installed_when_the_control_plane_has_every_package_or_the_mode_says_never():
    def plan(request):
        raise AssertionError("no resolution needed")

    have = EnvironmentRequest(packages=("numpy",))
    assert environment_runtime_env(have, have.packages, "auto", plan=plan) == {}
    assert not needs_resolution(have, have.packages, "auto")
    absent = EnvironmentRequest(packages=(ABSENT,))
    assert environment_runtime_env(absent, absent.packages, "never", plan=plan) == {}
    assert environment_runtime_env(None, (), "auto", plan=plan) == {}
    # conda specs are never installed per task (docs/ray.md): the image must have them
    conda = EnvironmentRequest(kind="conda", packages=(ABSENT,))
    assert environment_runtime_env(conda, conda.packages, "auto", plan=plan) == {}
    # a resolution that keeps the control plane's versions after all: nothing to install
    assert environment_runtime_env(absent, absent.packages, "auto", plan=lambda request: ()) == {}


@pytest.mark.unit
def test_always_sends_every_requirement_for_rays_uv_to_resolve_on_the_node():
    request = EnvironmentRequest(packages=("numpy", ABSENT))
    fields = environment_runtime_env(
        request, request.packages, "always", plan=lambda r: pytest.fail("no plan"), uv_args=lambda: ["--index-url", "x"]
    )
    assert fields == {"uv": {"packages": ["numpy", ABSENT], "uv_pip_install_options": ["--index-url", "x"]}}
    assert not needs_resolution(request, request.packages, "always")


@pytest.mark.unit
def test_an_image_becomes_image_uri_alone_since_ray_refuses_it_beside_uv():
    request = EnvironmentRequest(packages=(ABSENT,), image="registry.example.com/team/cuda:12")
    fields = environment_runtime_env(request, request.packages, "auto", plan=lambda r: pytest.fail("no plan"))
    assert fields == {"image_uri": "registry.example.com/team/cuda:12"}
    assert not needs_resolution(request, request.packages, "auto")


@pytest.mark.unit
def test_ray_accepts_the_uv_field_we_build():
    pytest.importorskip("ray")
    from ray._private.runtime_env.validation import parse_and_validate_uv

    fields = environment_runtime_env(EnvironmentRequest(packages=(ABSENT,)), (ABSENT,), "auto", plan=_plan)
    assert parse_and_validate_uv(fields["uv"])["uv_pip_install_options"] == ["--no-deps"]


# ------------------------------------------------------------------------------ the executor (unit, not started)


class _Callbacks:
    def __init__(self) -> None:
        self.failed: dict[str, object] = {}
        self.logs: list[tuple[str, list[str]]] = []
        self.event = threading.Event()

    def task_log(self, job_id, stream, lines, rows=None):
        self.logs.append((job_id, lines))

    def task_failed(self, job_id, failure, *, timings=None):
        self.failed[job_id] = failure
        self.event.set()


class _Cache:
    """An EnvironmentCache stand-in: ``plan`` waits for ``release`` (a slow ``uv pip compile``) and may fail."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls = 0
        self.release = threading.Event()

    def plan(self, request, builder=None):
        self.calls += 1
        self.release.wait(10)
        if self.error is not None:
            raise self.error
        return _plan(request)

    def uv_args(self):
        return []


def _executor(cache, worker_user=None):
    pytest.importorskip("ray")
    from lancefn_jupyter.server.executors.ray import RayExecutor

    # not started: launches wait in its buffer
    executor = RayExecutor(environments=cache, pip_mode="auto", worker_user=worker_user)
    callbacks = _Callbacks()
    executor._callbacks = callbacks
    return executor, callbacks


def _wait(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


@pytest.mark.unit
def test_an_environment_is_resolved_once_off_the_launch_path_and_its_jobs_then_go_to_the_driver():
    cache = _Cache()
    executor, callbacks = _executor(cache)
    started = time.monotonic()
    executor.launch(_task("a", packages=(ABSENT,)))
    executor.launch(_task("b", packages=(ABSENT,)))
    executor.launch(_task("plain"))  # no environment: straight on
    assert time.monotonic() - started < 1.0  # launch never waits for uv
    assert [task.job_id for task in executor._buffer] == ["plain"]
    cache.release.set()
    _wait(lambda: len(executor._buffer) == 3)
    assert cache.calls == 1
    assert executor._fields_of(executor._buffer[1])["uv"]["packages"] == [f"{ABSENT}==1.0"]
    assert any("Ray's uv installs" in line for _, lines in callbacks.logs for line in lines)
    executor.launch(_task("c", packages=(ABSENT,)))  # resolved already: no second compile
    assert cache.calls == 1 and executor._buffer[-1].job_id == "c"


@pytest.mark.unit
def test_a_failed_resolution_fails_the_waiting_jobs_at_once_in_phase_environment_and_a_cancelled_one_not():
    error = RuntimeError(f"  × No solution found when resolving dependencies:\n  ╰─▶ Because {ABSENT} was not found")
    cache = _Cache(error)
    executor, callbacks = _executor(cache)
    executor.launch(_task("a", packages=(ABSENT,)))
    executor.launch(_task("gone", packages=(ABSENT,)))
    executor.cancel("gone")
    cache.release.set()
    assert callbacks.event.wait(5)
    _wait(lambda: not executor._resolving)
    assert list(callbacks.failed) == ["a"]
    failure = callbacks.failed["a"]
    assert failure.phase == "environment" and ABSENT in failure.message
    assert not executor._buffer  # never sent to Ray, never silently PENDING
    cache.error = None  # nothing cached on failure: the next job of the environment resolves again
    executor.launch(_task("b", packages=(ABSENT,)))
    _wait(lambda: len(executor._buffer) == 1)
    assert cache.calls == 2


@pytest.mark.unit
def test_the_driver_gets_the_environments_runtime_env_fields_and_python_version_with_the_job():
    import json
    import os

    from lancefn_jupyter.server.executors.ray import executor as ray_executor

    read_fd, write_fd = os.pipe()
    outbox = ray_executor._Outbox(write_fd)
    fields = {"uv": {"packages": [f"{ABSENT}==1.0"], "uv_pip_install_options": ["--no-deps"]}}
    outbox.launch(_task("a", packages=(ABSENT,), python_version=HERE), fields)
    outbox.launch(_task("b"))
    outbox.close()
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        jobs = [json.loads(line)["job"] for line in pipe]
    assert jobs[0]["runtime_env"] == fields and jobs[0]["python_version"] == HERE
    assert "runtime_env" not in jobs[1] and jobs[1]["python_version"] is None


@pytest.mark.unit
def test_ray_refuses_another_python_without_an_image_and_conda_packages_it_lacks():
    executor, _ = _executor(_Cache())
    problem = executor.environment_problem(EnvironmentRequest(python_version="3.99"))
    assert problem is not None and "3.99" in problem and HERE in problem and "image" in problem
    assert executor.environment_problem(EnvironmentRequest(python_version=HERE)) is None
    assert executor.environment_problem(EnvironmentRequest(python_version="3.99", image="img:1")) is None
    conda = executor.environment_problem(EnvironmentRequest(kind="conda", packages=(ABSENT,)))
    assert conda is not None and ABSENT in conda
    assert executor.environment_problem(EnvironmentRequest(kind="conda", packages=("numpy",))) is None
    assert executor.environment_problem(EnvironmentRequest(packages=(ABSENT,))) is None  # pip: installed by uv


@pytest.mark.ray
@pytest.mark.skipif(os.geteuid() != 0, reason="a root control plane resolves as another user")
def test_a_root_control_planes_resolution_runs_build_backends_as_the_worker_user_and_refuses_option_lines(tmp_path):
    """The plan resolution (``uv pip compile``, which runs PEP 517 backends) of a Ray executor on a root server runs
    as the worker user (nobody), in a cache that user reaches; an option line never reaches uv."""
    from lancefn_jupyter.environments.cache import EnvironmentCache, EnvironmentFailure
    from lancefn_jupyter.server.executors.isolation import resolve_worker_user

    let_workers_reach_this_python()
    nobody = resolve_worker_user(None)  # the CLI's rule for a root server: --worker-user, default nobody
    assert nobody is not None
    secret = tmp_path / "api_key"  # as the home's: the server's alone
    secret.write_text("ray-admin-key-0001\n")
    secret.chmod(0o600)
    cache_dir = Path(tempfile.mkdtemp(prefix="lancefn-rayenv-", dir="/tmp"))
    try:
        cache_dir.chmod(0o755)
        cache = EnvironmentCache(cache_dir / "envs", shared=True)
        executor, _ = _executor(cache, nobody)
        with reporting_project(secret) as reference, pytest.raises(EnvironmentFailure) as caught:
            executor._runtime_fields(_task(packages=(reference,)))
        assert f"evilpkg backend: uid {nobody.uid}, api_key PermissionError" in str(caught.value)
        assert "ray-admin-key" not in str(caught.value)
        option = (f"-r {secret}",)
        assert executor._runtime_fields(_task(packages=option)) == {}  # not a requirement: nothing goes to uv
        with pytest.raises(EnvironmentFailure, match="is a pip option") as caught:
            cache.plan(EnvironmentRequest(packages=option), builder=executor._builder)
        assert caught.value.refused and "ray-admin-key" not in str(caught.value)
    finally:
        remove_tree(cache_dir)


# ------------------------------------------------------------------------------ on a real local Ray

USES_PACKAGE = """
import importlib
import importlib.metadata
import sys


def uses(name: str) -> str:
    module = importlib.import_module(name.replace("-", "_"))
    return name + "==" + importlib.metadata.version(name) + " from " + module.__file__ + " on " + sys.executable
"""


@pytest.fixture(scope="module")
def ray_uv_cp(tmp_path_factory):
    """A Ray-backed server that installs missing packages (``LANCEFN_RAY_PIP=auto``), on its own local Ray."""
    pytest.importorskip("ray")
    from helpers import RAY_CLASSES, ray_driver, ray_server, session_processes

    sessions: list[int] = []
    try:
        with ray_server(tmp_path_factory, RAY_CLASSES, LANCEFN_RAY_PIP="auto") as cp:
            sessions.append(ray_driver(cp).pid)
            yield cp
    finally:
        for sid in sessions:
            for proc in session_processes(sid):
                try:
                    proc.kill()
                except Exception:
                    pass


def _run(http, name: str, packages: tuple[str, ...], arg: str, timeout: float = 240.0) -> tuple[dict, list[str]]:
    from helpers import submit, wait_done

    body = registration_body(
        name,
        source=USES_PACKAGE,
        entrypoint="uses",
        inputs=(("name", "utf8", False),),
        output_type="utf8",
        packages=packages,
        num_gpus=None,
    )
    version = register(http, body)["version"]
    job_id = submit(http, name, version, [{"name": arg}])
    job = wait_done(http, job_id, timeout=timeout)
    return job, http.post("/v1/jobs/logs", json={"job_id": job_id}).json()["lines"]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_package_the_control_plane_lacks_is_installed_by_rays_uv_and_the_job_imports_it(ray_uv_cp):
    (package,) = absent_packages(1)
    with ray_uv_cp.http() as http:
        job, lines = _run(http, "uses_pkg", (package,), package)
    assert job["job_state"] == "DONE", job
    result = job["result"][0]
    assert result.startswith(f"{package}==") and "/runtime_resources/uv/" in result, result
    assert any(f"Ray's uv installs {package}==" in line for line in lines), lines  # the uv field, not pip


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_package_that_does_not_exist_fails_promptly_in_phase_environment_naming_it(ray_uv_cp):
    with ray_uv_cp.http() as http:
        started = time.monotonic()
        job, _ = _run(http, "needs_absent", (ABSENT,), "x", timeout=120)
        took = time.monotonic() - started
    assert job["job_state"] == "FAILED", job
    assert job["failure"]["phase"] == "environment", job
    assert ABSENT in job["failure"]["message"], job
    assert took < 60, took


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_an_image_goes_to_ray_as_image_uri_and_without_podman_fails_promptly_in_phase_environment(ray_uv_cp):
    import shutil

    from helpers import submit, wait_done

    if shutil.which("podman"):
        pytest.skip("podman is installed: Ray would pull and run the image")
    body = registration_body("in_image", source=USES_PACKAGE, entrypoint="uses", inputs=(("name", "utf8", False),),
                             output_type="utf8", num_gpus=None)  # fmt: skip
    body["runtime"]["environment"]["image"] = "registry.invalid/lancefn/py:3"
    with ray_uv_cp.http() as http:
        version = register(http, body)["version"]
        started = time.monotonic()
        job = wait_done(http, submit(http, "in_image", version, [{"name": "sys"}]), timeout=120)
        took = time.monotonic() - started
    assert job["job_state"] == "FAILED", job
    failure = job["failure"]
    assert failure["phase"] == "environment", (failure, took)
    assert "podman" in failure["message"] or "image" in failure["message"], failure
    assert took < 60, took


@pytest.mark.unit
def test_the_driver_adds_the_environment_to_the_simulator_switch():
    pytest.importorskip("ray")
    from lancefn_jupyter.server.executors.ray.bridge import _Driver

    image = {"simulated": True, "runtime_env": {"image_uri": "img:1"}}
    assert _Driver._runtime_env(None, image) == {"env_vars": {"NUMBA_ENABLE_CUDASIM": "1"}, "image_uri": "img:1"}  # type: ignore[arg-type]
    uv = {"simulated": False, "packages": [ABSENT], "runtime_env": {"uv": {"packages": [ABSENT]}}}
    assert _Driver._runtime_env(None, uv) == {"uv": {"packages": [ABSENT]}}  # type: ignore[arg-type]
    assert _Driver._runtime_env(None, {"packages": [ABSENT]}) == {}  # type: ignore[arg-type]  # never pip
