"""The Ray executor end to end: a real ``lancefn-server --executor ray`` that starts its own
local Ray (one start for the module) with two simulated GPU classes as logical Ray GPUs and
class resources, driven over HTTP like every other server test.

Ray is slow to start (~8 s, more on a busy machine), so one server serves the whole module and
the tests that end it (lost cluster, SIGKILL + restart, stop) come last, in file order.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ControlPlaneProcess, register, registration_body
from helpers import (
    describe,
    ray_driver,
    ray_server,
    session_processes,
    submit,
    task_spec,
    text_body,
    wait_done,
    wait_state,
    wait_until,
)

from lancefn_jupyter.server.control.journal import DEFER_COMMIT_S

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROBE = """
import json
import os
import sys

import ray


def probe(tag: str) -> str:
    print(f"hello from {tag}")
    print("to stderr", file=sys.stderr)
    context = ray.get_runtime_context()
    return json.dumps({
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "sim": os.environ.get("NUMBA_ENABLE_CUDASIM"),
        "greeting": os.environ.get("GREETING"),
        "resources": context.get_assigned_resources(),
        "node": context.get_node_id(),
    })
"""

WAIT = """
import os
import time


def wait_for(path: str) -> str:
    with open(path + ".pid." + str(os.getpid()), "w"):
        pass
    while not os.path.exists(path):
        time.sleep(0.05)
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")
"""

FAILING = """
def _check(x):
    if x < 0:
        raise ValueError(f"x must be >= 0, got {x}")
    return x


def checked(x: int) -> int:
    return _check(x)
"""

SLOW = 120.0  # generous: a first task on a busy 2-core CI box waits for a Ray worker to start


# ------------------------------------------------------------------------------ helpers


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie); a process may vanish between any two checks."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_no_session(sid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = []
    for proc in session_processes(sid):
        try:
            left.append((proc.pid, proc.name()))
        except psutil.NoSuchProcess:  # ended between the listing and the name
            continue
    assert not left, f"Ray processes left behind: {left}"


def _version(http, body: dict) -> str:
    return register(http, body)["version"]


def _waiter(http, gpu_class: str) -> str:
    """``wait_for(path)`` on ``gpu_class``: runs until the test creates ``path``, returns its devices."""
    return _version(http, text_body("wait_for", WAIT, gpu_class=gpu_class))


def _wait_job(http, version: str, flag: Path, **extra) -> str:
    """Starts a ``wait_for`` job that runs until ``flag`` exists; returns its id."""
    return submit(http, "wait_for", version, [{"path": str(flag)}], **extra)


def _finished(http, job_id: str, timeout: float = SLOW) -> dict:
    return wait_done(http, job_id, timeout)


def _running(http, job_id: str) -> dict:
    return wait_state(http, job_id, "IN_PROGRESS", timeout=SLOW)


def _usage(http) -> dict:
    return {row["name"]: row for row in http.get("/v1/gpu/usage").json()["classes"]}


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def flag(tmp_path) -> Path:
    """A path the waiting function polls for; create it to let the jobs finish."""
    return tmp_path / "go"


# ------------------------------------------------------------------------------ pure parts


def test_local_cluster_plan_gives_every_device_a_logical_gpu_and_each_class_its_resource():
    from lancefn_jupyter.server.executors.ray import local_cluster_plan
    from lancefn_jupyter.server.policy.gpu_classes import parse_gpu_classes

    classes = parse_gpu_classes(
        '[[gpu_classes]]\nname = "a100"\ngpu_model = "A100"\ngpu_memory_bytes = 1\ndevices = [2, 3]\n'
        '[[gpu_classes]]\nname = "sim"\nsimulated = 2\n'
        '[[gpu_classes]]\nname = "sim1"\nsimulated = 1\n'
    )
    assert local_cluster_plan(classes) == {
        "gpu_ids": ["2", "3", "sim0", "sim1", "sim2"],  # real ids kept; simulated numbered across classes
        "resources": {"lancefn_gpu_class:a100": 2, "lancefn_gpu_class:sim": 2, "lancefn_gpu_class:sim1": 1},
    }


def test_pip_requirements_only_sends_what_is_missing_here():
    from lancefn_jupyter.server.executors.ray import pip_requirements

    packages = ["numpy", "definitely-not-installed-lancefn-pkg>=1", "conda-forge::numpy=1.26"]
    assert pip_requirements(packages, "auto") == ["definitely-not-installed-lancefn-pkg>=1"]
    assert pip_requirements(packages, "always") == ["numpy", "definitely-not-installed-lancefn-pkg>=1"]
    assert pip_requirements(packages, "never") == []
    assert pip_requirements([], "auto") == []


def test_the_driver_gets_a_versions_artifact_with_its_first_job_and_again_once_told_to_drop_it(monkeypatch):
    from lancefn_jupyter.server.executors.base import TaskSpec
    from lancefn_jupyter.server.executors.ray import executor as ray_executor

    monkeypatch.setattr(ray_executor, "_BRIDGE_ARTIFACTS", 2)  # the driver holds two versions' artifacts
    read_fd, write_fd = os.pipe()
    outbox = ray_executor._Outbox(write_fd)
    for job_id, version in [("1", "a"), ("2", "a"), ("3", "b"), ("4", "c"), ("5", "a"), ("6", "c")]:
        source = f"def f():\n    return {version!r}\n".encode()
        outbox.launch(
            TaskSpec(job_id, "f", version, source, "f", [{}], (), True, "small", 1, {}, (), None, namespace="ns")
        )
    outbox.send({"op": "cancel", "job_id": "6"})
    outbox.close()
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        messages = [json.loads(line) for line in pipe]
    seen = [
        (m["op"], m["job"]["job_id"], "artifact_b64" in m["job"]) if m["op"] == "launch" else (m["op"], m.get("key"))
        for m in messages
    ]
    assert seen == [
        ("launch", "1", True),
        ("launch", "2", False),  # the driver holds version a
        ("launch", "3", True),
        ("launch", "4", True),
        ("forget", ["f", "a", "ns"]),  # the least recently launched version goes
        ("launch", "5", True),  # so a's next job brings its artifact again
        ("forget", ["f", "b", "ns"]),
        ("launch", "6", False),
        ("cancel", None),
    ]
    assert base64.b64decode(messages[0]["job"]["artifact_b64"]) == b"def f():\n    return 'a'\n"


@pytest.mark.timeout(30)  # a writer thread that died leaves the read waiting
def test_a_large_artifact_is_encoded_by_the_pipes_writer_thread_in_its_place_in_the_line_order(monkeypatch):
    """Whoever launches (the event loop, a core thread holding the job table's lock) never spends milliseconds
    encoding an artifact: one over ``_INLINE_ARTIFACT_BYTES`` is encoded by the writer thread, and the lines sent
    after it still reach the driver after it."""
    import threading

    from lancefn_jupyter.server.executors.base import TaskSpec
    from lancefn_jupyter.server.executors.ray import executor as ray_executor

    encoders: list[tuple[int, str]] = []
    encode = ray_executor._b64

    def recorded(artifact: bytes) -> str:
        encoders.append((len(artifact), threading.current_thread().name))
        return encode(artifact)

    monkeypatch.setattr(ray_executor, "_b64", recorded)
    big = b"#" + b"x" * (ray_executor._INLINE_ARTIFACT_BYTES * 4) + b"\ndef f():\n    return 1\n"  # > the pipe's 64 KiB
    small = b"def f():\n    return 2\n"
    read_fd, write_fd = os.pipe()
    outbox = ray_executor._Outbox(write_fd)
    rows = [{"x": "y" * 100_000}]  # a line the pipe does not take at once: the big one queues behind its rest
    outbox.launch(TaskSpec("0", "f", "small", small, "f", rows, (), True, "small", 1, {}, (), None))
    for job_id, version, source in [("1", "big", big), ("2", "big", big), ("3", "small", small)]:
        outbox.launch(TaskSpec(job_id, "f", version, source, "f", [{}], (), True, "small", 1, {}, (), None))
    outbox.send({"op": "cancel", "job_id": "3"})
    messages = []
    with os.fdopen(read_fd, "rb") as pipe:
        while len(messages) < 5:
            messages.append(json.loads(pipe.readline()))
        outbox.close()
        os.close(write_fd)
    messages.pop(0)  # job 0's, whole
    assert [(m["op"], m.get("job", m).get("job_id")) for m in messages] == [
        ("launch", "1"),
        ("launch", "2"),
        ("launch", "3"),
        ("cancel", "3"),
    ]
    assert base64.b64decode(messages[0]["job"]["artifact_b64"]) == big
    assert "artifact_b64" not in messages[1]["job"]  # the driver holds it from job 1
    assert "artifact_b64" not in messages[2]["job"]  # nor from job 0
    assert sorted(encoders) == [(len(small), threading.current_thread().name), (len(big), "lancefn-ray-stdin")]


def test_local_ray_temp_dir_stays_short(tmp_path, monkeypatch):
    from lancefn_jupyter.server.executors.ray import default_temp_dir

    monkeypatch.delenv("LANCEFN_RAY_TEMP_DIR", raising=False)
    assert default_temp_dir("/srv/h") == "/srv/h/ray"
    long_home = "/srv/" + "x" * 80
    assert len(default_temp_dir(long_home)) <= 40 and default_temp_dir(long_home) == default_temp_dir(long_home)
    monkeypatch.setenv("LANCEFN_RAY_TEMP_DIR", str(tmp_path))
    assert default_temp_dir(long_home) == str(tmp_path)


def test_ray_output_quoting_a_jobs_env_is_scrubbed_before_it_reaches_the_server_log():
    """Ray prints a failed task's runtime_env (env_vars included) in its own messages."""
    from lancefn_jupyter.server.executors.ray import RayExecutor

    executor = RayExecutor()  # not started: launches wait in its buffer
    executor.launch(task_spec(gpu_class="small", num_gpus=1, env={"TOKEN": "tok-0123456789", "FLAG": "1"}))
    line = "RuntimeEnvSetupError: runtime_env={'env_vars': {'TOKEN': 'tok-0123456789', 'FLAG': '1'}}"
    assert (
        executor._scrub(line) == "RuntimeEnvSetupError: runtime_env={'env_vars': {'TOKEN': '<redacted>', 'FLAG': '1'}}"
    )


# ------------------------------------------------------------------------------ tests


def test_job_runs_on_the_gpu_ids_ray_assigns_with_env_and_logs(ray_cp):
    with ray_cp.http() as http:
        assert http.get("/v1/health").json()["executor"] == "ray"
        version = _version(http, text_body("probe", PROBE, arg="tag", gpu_class="small", env={"GREETING": "hi"}))
        job_id = submit(http, "probe", version, [{"tag": "a"}])
        job = _finished(http, job_id)
        assert job["job_state"] == "DONE", job
        seen = json.loads(job["result"][0])
        placement = job["placement"]
        # Ray set CUDA_VISIBLE_DEVICES from the logical GPU ids it assigned, and reported them.
        assert seen["cvd"] == ",".join(placement["devices"]) and placement["devices"][0].startswith("sim")
        assert seen["sim"] == "1"  # simulated class → numba CUDA simulator
        assert seen["greeting"] == "hi"  # the function's env came with the task
        assert placement["node"] == seen["node"]
        assert job["started_ms"] <= job["finished_ms"]
        logs = http.post("/v1/jobs/logs", json={"job_id": job_id}).json()["lines"]
        assert "hello from a" in logs and "to stderr" in logs
        usage = _usage(http)
        assert usage["small"]["gpus_total"] == 2 and usage["big"]["gpus_total"] == 1  # Ray's class resources


def test_two_classes_are_routed_to_their_class_resources(ray_cp):
    with ray_cp.http() as http:
        jobs = {}
        for gpu_class in ("small", "big"):
            version = _version(http, text_body("probe", PROBE, arg="tag", gpu_class=gpu_class))
            jobs[gpu_class] = submit(http, "probe", version, [{"tag": gpu_class}])
        for gpu_class, job_id in jobs.items():
            job = _finished(http, job_id)
            assert job["job_state"] == "DONE", job
            assert job["placement"]["gpu_class"] == gpu_class
            resources = json.loads(job["result"][0])["resources"]
            assert resources.get(f"lancefn_gpu_class:{gpu_class}") == 1.0, resources
            assert resources.get("GPU") == 1.0
            other = {"small": "big", "big": "small"}[gpu_class]
            assert f"lancefn_gpu_class:{other}" not in resources


def test_more_jobs_than_gpus_wait_pending_until_gpus_free(ray_cp, flag):
    with ray_cp.http() as http:
        version = _waiter(http, "small")
        job_ids = [_wait_job(http, version, flag) for _ in range(3)]
        wait_until(
            lambda: [describe(http, job_id)["job_state"] for job_id in job_ids].count("IN_PROGRESS") == 2,
            "two jobs running",
            SLOW,
        )
        time.sleep(1.5)  # the third stays queued in Ray while both GPUs are held
        jobs = [describe(http, job_id) for job_id in job_ids]
        pending = [job for job in jobs if job["job_state"] == "PENDING"]
        assert len(pending) == 1, jobs
        assert pending[0]["placement"].get("waiting_on_capacity") is True
        assert not pending[0]["placement"].get("devices")  # Ray has not placed it yet
        busy = [tuple(job["placement"]["devices"]) for job in jobs if job["job_state"] == "IN_PROGRESS"]
        assert len(set(busy)) == 2, busy  # two different GPUs
        usage = _usage(http)["small"]
        assert (usage["gpus_busy"], usage["jobs_running"], usage["jobs_pending"]) == (2, 2, 1), usage

        flag.touch()
        for job_id in job_ids:
            job = _finished(http, job_id)
            assert job["job_state"] == "DONE", job
            assert job["result"] == [",".join(job["placement"]["devices"])]
        assert _usage(http)["small"]["gpus_busy"] == 0


def test_cancel_pending_and_running_jobs_frees_the_gpu(ray_cp, flag):
    with ray_cp.http() as http:
        version = _waiter(http, "big")
        first = _wait_job(http, version, flag)
        _running(http, first)
        second = _wait_job(http, version, flag)
        time.sleep(1.0)
        assert describe(http, second)["job_state"] == "PENDING"  # big has one GPU

        assert http.post("/v1/jobs/cancel", json={"job_id": second}).json()["cancelled"] is True
        assert http.post("/v1/jobs/cancel", json={"job_id": first}).json()["cancelled"] is True
        assert describe(http, first)["job_state"] == "CANCELLED" and describe(http, second)["job_state"] == "CANCELLED"
        # The running task's worker process was killed (ray.cancel force=True) ...
        pids = [int(path.name.rsplit(".", 1)[1]) for path in flag.parent.glob(f"{flag.name}.pid.*")]
        assert len(pids) == 1, pids  # ... and the pending one never started
        wait_until(lambda: not _alive(pids[0]), "the cancelled task's worker to end", 30)
        # ... and the class's only GPU is free for the next job.
        flag.touch()
        third = _wait_job(http, version, flag)
        assert _finished(http, third)["job_state"] == "DONE"


def test_failure_reports_the_remote_traceback_with_user_frames_only(ray_cp):
    with ray_cp.http() as http:
        version = _version(http, registration_body("checked", source=FAILING, entrypoint="checked", gpu_class="small"))
        job = _finished(http, submit(http, "checked", version, [{"x": 1}, {"x": -1}]))
        assert job["job_state"] == "FAILED", job
        failure = job["failure"]
        assert failure["phase"] == "run"
        assert "ValueError: x must be >= 0, got -1" in failure["message"] and "row 1 of 2" in failure["message"]
        traceback = failure["traceback"]
        assert f"<gpu_function checked@{version}>" in traceback
        assert "_check" in traceback and 'raise ValueError(f"x must be >= 0, got {x}")' in traceback
        assert "site-packages" not in traceback and "_run_job" not in traceback  # no Ray or lancefn frames


def test_missing_declared_package_fails_in_phase_environment(ray_cp):
    with ray_cp.http() as http:
        missing = ("definitely-not-installed-lancefn-pkg",)
        body = registration_body("needs_pkg", source=FAILING, entrypoint="checked", gpu_class="small", packages=missing)
        version = _version(http, body)
        job = _finished(http, submit(http, "needs_pkg", version, [{"x": 1}]))
        assert job["job_state"] == "FAILED", job
        failure = job["failure"]
        assert failure["phase"] == "environment"
        assert "definitely-not-installed-lancefn-pkg" in failure["message"] and "Ray node" in failure["message"]


def test_timeout_cancels_the_task(ray_cp, flag):
    with ray_cp.http() as http:
        version = _waiter(http, "big")
        job = _finished(http, _wait_job(http, version, flag, timeout_s=1.5))
        assert job["job_state"] == "TIMED_OUT", job
        assert job["failure"]["phase"] == "timeout" and "1.5 s" in job["failure"]["message"]
        assert job["finished_ms"] - job["started_ms"] >= 1200  # counted from the start on the node (± relay)


LEAKY = """
import builtins
import os

_real_open = builtins.open


def leaky(mode: str) -> str:
    if mode == "patch":  # version A: leaves state behind in its process
        builtins.lancefn_leak = "A"
        builtins.open = lambda *args, **kwargs: _real_open(*args, **kwargs)
    return f"{os.getpid()} {getattr(builtins, 'lancefn_leak', None)} {builtins.open is __import__('io').open}"
"""


def test_a_simulated_class_job_never_runs_in_a_process_another_version_used(ray_cp):
    """Simulated-class jobs run in warm actors kept per (class, GPUs, version, namespace); only a version whose setup
    part is the same may take over an earlier one's idle actor (docs/ARCHITECTURE.md, "Setup reuse")."""
    with ray_cp.http() as http:
        versions = [
            _version(http, text_body("leaky", LEAKY + comment, arg="mode", gpu_class="big"))
            for comment in ("", "VERSION = 'B'\n")  # B's setup part differs: no setup reuse either
        ]
        assert versions[0] != versions[1]
        patched = _finished(http, submit(http, "leaky", versions[0], [{"mode": "patch"}]))
        assert patched["job_state"] == "DONE", patched
        pid_a, leak_a, _ = patched["result"][0].split()
        assert leak_a == "A"
        again = _finished(http, submit(http, "leaky", versions[0], [{"mode": "look"}]))
        assert again["result"][0].split()[:2] == [pid_a, "A"]  # the same version reuses its warm actor
        other = _finished(http, submit(http, "leaky", versions[1], [{"mode": "look"}]))
        assert other["job_state"] == "DONE", other
        pid_b, leak_b, real_open = other["result"][0].split()
        assert pid_b != pid_a and leak_b == "None" and real_open == "True"


BLOB = f"""
import os

BLOB = "{"0123456789" * 20000}"


def blob(tag: str) -> str:
    return f"{{tag}} {{len(BLOB)}} {{os.getpid()}}"
"""


def test_a_version_bigger_than_the_pipe_to_the_driver_runs_its_jobs_in_order_on_warm_actors(ray_cp):
    """A launch (artifact included) that the pipe to the Ray driver cannot take at once: its rest,
    and the messages sent after it (a cancel, more launches), follow in order; each warm actor gets
    the artifact once, when it is made, and runs the version's later jobs without it."""
    with ray_cp.http() as http:
        version = _version(http, text_body("blob", BLOB, arg="tag", gpu_class="small"))
        cancelled = submit(http, "blob", version, [{"tag": "never"}])
        assert http.post("/v1/jobs/cancel", json={"job_id": cancelled}).json()["cancelled"] is True
        jobs = [submit(http, "blob", version, [{"tag": f"t{i}"}]) for i in range(6)]
        done = [_finished(http, job_id) for job_id in jobs]
        assert [job["job_state"] for job in done] == ["DONE"] * 6, done
        seen = [job["result"][0].split() for job in done]
        assert [words[:2] for words in seen] == [[f"t{i}", "200000"] for i in range(6)]
        assert len({words[2] for words in seen}) <= 2  # warm actors: at most one per GPU of the class
        assert describe(http, cancelled)["job_state"] == "CANCELLED"


SLOW_MODULE = """
import os
import time

with open(os.environ["LANCEFN_TEST_LOG"], "a") as out:
    out.write(f"{os.getpid()}\\n")
time.sleep(1.0)  # a model load


def loaded(tag: str) -> str:
    return f"{tag} {os.getpid()}"
"""


def test_a_versions_module_runs_once_per_actor_over_sequential_jobs(ray_cp, tmp_path):
    """Warm state on Ray (ARCHITECTURE.md, "Warm state"): a warm actor keeps its version's module, so
    sequential jobs pay its load once, not per job."""
    log = tmp_path / "executions"
    with ray_cp.http() as http:
        body = text_body("loaded", SLOW_MODULE, arg="tag", gpu_class="small", env={"LANCEFN_TEST_LOG": str(log)})
        version = _version(http, body)
        first = _finished(http, submit(http, "loaded", version, [{"tag": "t0"}]))
        assert first["job_state"] == "DONE", first
        started = time.monotonic()
        later = [_finished(http, submit(http, "loaded", version, [{"tag": f"t{i}"}])) for i in range(1, 6)]
        elapsed = time.monotonic() - started
    assert [job["job_state"] for job in later] == ["DONE"] * 5, later
    pids = {job["result"][0].split()[1] for job in [first, *later]}
    assert len(pids) == 1  # one warm actor ran them all
    assert log.read_text().split() == list(pids)  # … and executed the module once
    print(f"five warm jobs took {elapsed:.2f} s")
    assert elapsed < 5.0, elapsed  # five jobs that re-ran the module would take 5 s at least


FLAKY_SETUP = """
import os

with open(os.environ["LANCEFN_TEST_LOG"], "a") as out:
    out.write(f"{os.getpid()}\\n")
if not os.path.exists(os.environ["LANCEFN_TEST_LOG"] + ".ready"):
    raise RuntimeError("weights not there yet")


def flaky(tag: str) -> str:
    return str(os.getpid())
"""


def test_an_actor_whose_setup_failed_is_not_reused(ray_cp, tmp_path):
    log = tmp_path / "executions"
    with ray_cp.http() as http:
        body = text_body("flaky", FLAKY_SETUP, arg="tag", gpu_class="small", env={"LANCEFN_TEST_LOG": str(log)})
        version = _version(http, body)
        failed = _finished(http, submit(http, "flaky", version, [{"tag": "a"}]))
        assert failed["job_state"] == "FAILED" and failed["failure"]["phase"] == "setup", failed
        assert failed["failure"]["message"].startswith("RuntimeError: weights not there yet (at ")
        Path(f"{log}.ready").touch()
        done = _finished(http, submit(http, "flaky", version, [{"tag": "b"}]))
    assert done["job_state"] == "DONE", done
    failed_pid, new_pid = log.read_text().split()
    assert done["result"] == [new_pid] and new_pid != failed_pid


def test_start_ms_counts_a_new_actors_start_and_nothing_on_a_warm_one():
    from lancefn_jupyter.server.executors.ray.bridge import _add_start, _BridgeJob

    fresh, warm = _BridgeJob("a", None, None, 1), _BridgeJob("b", None, None, 1)
    fresh.created_at = 100.0
    outcomes = [{"event": "result", "timings": {"setup_ms": 5.0, "run_ms": 1.0}} for _ in range(2)]
    _add_start(outcomes[0], fresh, {"ready_at": 102.5})
    _add_start(outcomes[1], warm, {"ready_at": 50.0})
    assert outcomes[0]["timings"] == {"setup_ms": 5.0, "run_ms": 1.0, "start_ms": 2500.0}
    assert outcomes[1]["timings"]["start_ms"] == 0.0


def test_an_actor_is_not_reused_after_a_setup_failure_or_over_the_memory_limit():
    from types import SimpleNamespace

    from lancefn_jupyter.server.executors.ray.bridge import _Driver

    limited, unlimited = SimpleNamespace(max_rss_mb=100), SimpleNamespace(max_rss_mb=None)
    ok = {"event": "result", "rss_mb": 80.0}
    big = {"event": "result", "rss_mb": 130.0}
    setup = {"event": "failed", "phase": "setup", "rss_mb": 20.0}
    run = {"event": "failed", "phase": "run", "rss_mb": 20.0}
    assert [_Driver._reusable(limited, final) for final in (ok, big, setup, run)] == [True, False, False, True]  # type: ignore[arg-type]
    assert _Driver._reusable(unlimited, big) is True  # type: ignore[arg-type]


TORN_DOWN = """
import os


class torn:
    def __call__(self, tag: str) -> str:
        return str(os.getpid())

    def teardown(self):
        with open(os.environ["LANCEFN_TEST_LOG"], "w") as out:
            out.write(f"torn down {os.getpid()}")
"""


def test_an_idle_actor_that_retires_runs_the_class_entry_teardown(ray_cp, tmp_path):
    log = tmp_path / "teardown"
    with ray_cp.http() as http:
        body = text_body("torn", TORN_DOWN, arg="tag", gpu_class="small", env={"LANCEFN_TEST_LOG": str(log)})
        done = _finished(http, submit(http, "torn", _version(http, body), [{"tag": "a"}]))
    assert done["job_state"] == "DONE", done
    # The module server retires idle actors after 15 s (LANCEFN_RAY_ACTOR_IDLE_S).
    wait_until(log.exists, "the idle actor's teardown", 60)
    assert log.read_text() == f"torn down {done['result'][0]}"


SECRET_ENV = """
import os


def secret(x: int) -> str:
    return os.environ.get("LANCEFN_TEST_SECRET", "")
"""


def test_a_jobs_env_reaches_the_function_but_no_ray_workers_proc_environ(ray_cp):
    secret_value = "tok-" + os.urandom(8).hex()
    with ray_cp.http() as http:
        found = []
        for gpu_class in ("small", None):  # a simulated-class job (warm actor) and a CPU task
            kwargs = {"gpu_class": gpu_class} if gpu_class else {"num_gpus": None}
            env = {"LANCEFN_TEST_SECRET": secret_value}
            body = registration_body(
                "secret", source=SECRET_ENV, entrypoint="secret", output_type="utf8", env=env, **kwargs
            )
            version = _version(http, body)
            job = _finished(http, submit(http, "secret", version, [{"x": 1}]))
            assert job["job_state"] == "DONE", job
            assert job["result"] == [secret_value]  # delivered with the task
        for proc in psutil.process_iter():
            try:
                if secret_value in " ".join(proc.cmdline()) or any(
                    secret_value in value for value in proc.environ().values()
                ):
                    found.append((proc.pid, proc.name()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        assert not found, f"the env value is in these processes' environ or cmdline: {found}"


ADDRESS_CLASSES = """
[[gpu_classes]]
name = "big"
gpu_model = "Simulated big GPU"
gpu_memory_bytes = 0
max_gpu_count_per_worker = 1

[[gpu_classes]]
name = "t4"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 1
"""


def _ray_address(cp: ControlPlaneProcess) -> str:
    match = re.search(r"connected to local Ray started by the control plane \(([^)]+)\)", cp.log_text())
    assert match, cp.log_text()
    return match.group(1)


DETACH = """
import subprocess


def detach(path: str) -> str:
    started = subprocess.run(
        ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return started.stdout.strip()
"""


def test_a_jobs_detached_process_ends_with_the_job_on_a_ray_actor(ray_cp):
    """docs/ARCHITECTURE.md, "Job processes": the actor is the subreaper of what its job starts and sweeps it."""
    with ray_cp.http() as http:
        version = _version(http, text_body("detach", DETACH, gpu_class="small"))
        job = _finished(http, submit(http, "detach", version, [{"path": ""}]))
    assert job["job_state"] == "DONE", job
    (sleeper,) = job["result"]
    try:
        assert not os.path.exists(f"/proc/{sleeper}"), f"the job's detached sleep {sleeper} outlived it"
    finally:
        try:
            os.kill(int(sleeper), signal.SIGKILL)
        except ProcessLookupError:
            pass


#: Pushes an event to the hub its job's events go through, as any code in a Ray worker can: ``path`` is a Python
#: expression of (job id, token, event), None for its own job's; then it holds 60 s (only the server can end it).
PUSH = """
import gc
import time


def push(path: str) -> str:
    sender = next(o for o in gc.get_objects() if type(o).__name__ == "_HubSender")
    job_id, token, event = eval(path)
    job_id = job_id or sender._job_id
    try:
        sender._hub.push.remote(job_id, token or getattr(sender, "_token", ""), [[10**6, event]])
    except TypeError:  # the hub's push before job tokens
        sender._hub.push.remote(job_id, [[10**6, event]])
    time.sleep(60)
    return "pushed"
"""


def _push(http, version: str, expression: str, **extra) -> dict:
    return _finished(http, submit(http, "push", version, [{"path": expression}], **extra))


@pytest.mark.parametrize(
    ("event", "invalid"),
    [
        ('{"event": "bogus"}', "the worker sent an invalid bogus event: no such event"),
        ('{"event": "result", "results": ["forged"]}', "the worker sent an invalid result event: no such event"),
        ('{"event": "log", "stream": "stdout", "lines": ["x" * (3 << 20)]}', "longer than 2 MiB"),
    ],
)
def test_an_event_a_ray_job_pushes_that_the_protocol_lacks_fails_it_in_phase_worker(ray_cp, event, invalid):
    with ray_cp.http() as http:
        version = _version(http, text_body("push", PUSH, gpu_class="small"))
        job = _push(http, version, f"(None, None, {event})", timeout_s=50)
        assert job["job_state"] == "FAILED", job
        assert job["failure"]["phase"] == "worker" and invalid in job["failure"]["message"], job["failure"]
        assert "Traceback" not in ray_cp.log_text()


def test_a_ray_job_cannot_push_events_for_another_job(ray_cp, flag):
    """The hub takes pushes from any process of the cluster: only those naming a job's own token count."""
    with ray_cp.http() as http:
        other = _wait_job(http, _waiter(http, "small"), flag)
        _running(http, other)
        version = _version(http, text_body("push", PUSH, gpu_class="small"))
        forged = '{"event": "result", "results": ["forged"]}'
        job = _push(http, version, f"({other!r}, 'a guess', {forged})", timeout_s=3)
        assert job["job_state"] == "TIMED_OUT", job  # its own push went nowhere, and its sleep ran past its timeout
        assert describe(http, other)["job_state"] == "IN_PROGRESS"
        flag.touch()
        done = _finished(http, other)
        assert done["job_state"] == "DONE" and done["result"] != ["forged"], done


HELPED = "import helper\n\n\ndef helped(x: int) -> int:\n    return helper.K * x\n"
PARTS = "def parts(x: int) -> dict:\n    return {'q': x // 3, 'r': x % 3} if x else {'q': 0}\n"
RECORD_BATCH = {
    "input_schema": pa.schema(
        [pa.field("batch", pa.struct([pa.field("x", pa.float64()), pa.field("w", pa.float64())]))]
    ),
    "output_schema": pa.float64(),
}


def weighted(batch: pa.RecordBatch) -> pa.Array:
    import pyarrow.compute as pc

    return pc.add(pc.multiply(batch.column("x"), batch.column("w")), float(batch.num_rows) / 100)


DOUBLED = "import pyarrow as pa\nimport pyarrow.compute as pc\n\n\ndef doubled(x: pa.Array) -> pa.Array:\n    return pc.multiply(x, 2)\n"


def test_lancedb_bundles_batch_udfs_and_named_structs_run_on_ray_actors(ray_cp):
    """LanceDB 0.40's registrations ("LanceDB 0.40 dialect") run on Ray as on the local executor: a bundle's modules
    travel with its artifact, a batch UDF's chunk is one call, a named-struct output's fields are checked there."""
    struct = registration_body("parts", source=PARTS, entrypoint="parts", gpu_class="small")
    fields = [{"name": name, "arrow_type": "int64", "nullable": False} for name in ("q", "r")]
    struct["signature"]["output"] = {"kind": "named_struct", "fields": fields}
    arrow = registration_body(
        "doubled", source=DOUBLED, entrypoint="doubled", inputs=(("x", "float64", True),), output_type="float64"
    )
    with ray_cp.http() as http:
        helped = _version(
            http,
            registration_body(
                "helped", source=HELPED, entrypoint="helped", gpu_class="small", bundle={"helper.py": "K = 7\n"}
            ),
        )
        parts, doubled = _version(http, struct), _version(http, arrow)
        assert _finished(http, submit(http, "helped", helped, [{"x": 2}]))["result"] == [14]
        assert _finished(http, submit(http, "parts", parts, [{"x": 7}, {"x": 3}]))["result"] == [
            {"q": 2, "r": 1},
            {"q": 1, "r": 0},
        ]
        failed = _finished(http, submit(http, "parts", parts, [{"x": 0}]))
        assert failed["failure"]["phase"] == "result" and "lacks field 'r'" in failed["failure"]["message"]
        job = _finished(http, submit(http, "doubled", doubled, [{"x": 1.5}, {"x": 2.0}]))
        assert job["job_state"] == "DONE", job
        table = pa.ipc.open_stream(http.get("/v1/jobs/result", params={"job_id": job["job_id"]}).content).read_all()
        assert table.column(0).to_pylist() == [3.0, 4.0]
        # A RecordBatch UDF registered by the released client: each chunk is one RecordBatch of the struct's fields.
        import lancedb
        from lancedb.functions import udf

        db = lancedb.connect("db://lancefn", api_key=ray_cp.api_key, host_override=ray_cp.url)
        fv = db.create_function(udf(weighted, **RECORD_BATCH))
        rows = [{"batch": {"x": 1.0, "w": 2.0}}, {"batch": {"x": -1.0, "w": 0.5}}]
        job = _finished(http, submit(http, "weighted", fv.metadata["lancefn.version"], rows))
        assert job["job_state"] == "DONE", job
        table = pa.ipc.open_stream(http.get("/v1/jobs/result", params={"job_id": job["job_id"]}).content).read_all()
        assert table.column(0).to_pylist() == [2.02, -0.48]


def test_second_server_joins_the_cluster_by_address_and_leaves_it_running(ray_cp, tmp_path_factory, flag):
    """--ray-address (here: the module server's own Ray, so no second Ray start): capacity comes
    from the cluster's labels, a class no node offers waits PENDING, stopping leaves the cluster."""
    with ray_cp.http() as http:  # the module server's Ray is up once a job has run
        version = _waiter(http, "big")
        flag.touch()
        assert _finished(http, _wait_job(http, version, flag))["job_state"] == "DONE"
    with ray_server(tmp_path_factory, ADDRESS_CLASSES, "--ray-address", _ray_address(ray_cp)) as cp:
        with cp.http() as http:
            version = _version(http, text_body("probe", PROBE, arg="tag", gpu_class="big"))
            job = _finished(http, submit(http, "probe", version, [{"tag": "joined"}]))
            assert job["job_state"] == "DONE", job
            seen = json.loads(job["result"][0])
            assert seen["resources"].get("lancefn_gpu_class:big") == 1.0 and seen["cvd"] == ",".join(
                job["placement"]["devices"]
            )
            usage = _usage(http)
            assert usage["big"]["gpus_total"] == 1 and usage["t4"]["gpus_total"] == 0  # from the cluster's labels
            # No node offers "t4": Ray holds the task (an autoscaler would add a node for it).
            t4 = _waiter(http, "t4")
            waiting = _wait_job(http, t4, flag)
            time.sleep(2.0)
            job = describe(http, waiting)
            assert job["job_state"] == "PENDING" and job["placement"]["waiting_on_capacity"] is True, job
            assert _usage(http)["t4"]["jobs_pending"] == 1
            assert http.post("/v1/jobs/cancel", json={"job_id": waiting}).json()["cancelled"] is True
        bridge = ray_driver(cp)
        assert cp.stop() == 0
        _wait_no_session(bridge.pid, timeout=10)
    with ray_cp.http() as http:  # the cluster it joined is not its to stop
        version = _waiter(http, "big")
        assert _finished(http, _wait_job(http, version, flag))["job_state"] == "DONE"


def test_lost_ray_cluster_fails_running_jobs_as_retryable_then_reconnects(ray_cp, flag):
    with ray_cp.http() as http:
        version = _waiter(http, "big")
        job_id = _wait_job(http, version, flag)
        _running(http, job_id)
        old = ray_driver(ray_cp)
        for proc in session_processes(old.pid):  # the cluster dies under the control plane
            if proc.name() in ("gcs_server", "raylet"):
                proc.send_signal(signal.SIGKILL)
        job = _finished(http, job_id, timeout=60)
        assert job["job_state"] == "FAILED", job
        failure = job["failure"]
        assert failure["phase"] == "executor" and failure["retryable"] is True, failure
        assert "lost the local Ray" in failure["message"] and "run it again" in failure["message"]
        _wait_no_session(old.pid)  # the dead cluster's leftovers were swept

        # The executor starts a fresh local Ray; the same job submitted again runs.
        new = wait_until(lambda: (bridge := ray_driver(ray_cp)).pid != old.pid and bridge, "a new Ray driver", 30)
        ray_cp.sessions.append(new.pid)
        flag.touch()
        again = _finished(http, _wait_job(http, version, flag))
        assert again["job_state"] == "DONE", again


def test_control_plane_sigkill_stops_its_ray_and_restart_requeues_the_job(ray_cp, flag):
    with ray_cp.http() as http:
        version = _waiter(http, "small")
        job_id = _wait_job(http, version, flag)
        _running(http, job_id)
    time.sleep(20 * DEFER_COMMIT_S)  # its start reaches the disk within DEFER_COMMIT_S (before: re-run, not re-queued)
    bridge = ray_driver(ray_cp)
    ray_cp.kill()  # SIGKILL: no cleanup in the server itself
    _wait_no_session(bridge.pid)  # its Ray driver noticed and took the local Ray down with it

    ray_cp.start()
    ray_cp.sessions.append(ray_driver(ray_cp).pid)
    with ray_cp.http() as http:
        logs = http.post("/v1/jobs/logs", json={"job_id": job_id}).json()["lines"]
        assert any("re-queued" in line for line in logs), logs
        _running(http, job_id)  # launched again on the new Ray, nothing lost
        flag.touch()
        job = _finished(http, job_id)
        assert job["job_state"] == "DONE", job


def test_a_batch_fans_out_as_ray_tasks_of_the_class(ray_cp, tmp_path):
    """Each chunk is a Ray task of the class's resource, waiting in Ray for the class's GPUs."""
    with ray_cp.http() as http:
        version = _waiter(http, "small")
        gates = [tmp_path / f"chunk{i}" for i in range(4)]
        for gate in gates[:3]:
            gate.touch()
        chunks = [[{"path": str(gate)}, {"path": str(gate)}] for gate in gates]
        reply = http.post(
            "/v1/batches/create", json={"name": "wait_for", "version": version, "chunks": chunks, "timeout_s": 30}
        )
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        batch = wait_until(
            lambda: (
                (b := http.post("/v1/batches/describe", json={"batch_id": batch_id}).json())["strip"] == "dddr" and b
            ),
            "three chunks done and the fourth running",
            SLOW,
        )
        jobs = [describe(http, chunk["job_id"]) for chunk in batch["chunks"]]
        assert all(job["placement"]["gpu_class"] == "small" and job["spec"]["batch_id"] == batch_id for job in jobs)
        gates[3].touch()
        batch = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=90).json()
        assert batch["batch_state"] == "DONE", batch
        for chunk in batch["chunks"]:
            job = _finished(http, chunk["job_id"])  # `wait_for` returns the devices its task ran on
            assert job["result"] == [",".join(job["placement"]["devices"])] * 2 and (
                chunk["row_start"],
                chunk["row_end"],
            ) == (2 * chunk["index"], 2 * chunk["index"] + 2)


def test_server_stop_leaves_no_ray_processes(ray_cp):
    # Last in this module: it stops the module's Ray-backed server.
    bridge = ray_driver(ray_cp)
    assert len(session_processes(bridge.pid)) > 2  # raylet, GCS, workers … all in the driver's session
    assert ray_cp.stop() == 0
    _wait_no_session(bridge.pid, timeout=10)
