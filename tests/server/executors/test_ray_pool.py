"""Warm real-GPU workers on Ray: a pool of Ray actors per (class, GPU count, function version,
namespace), on a local Ray whose two logical GPUs stand in for real ones (a non-simulated
class with ``devices = [0, 1]``).  A version's later jobs reuse its warm actor; another version
never does; a crashed actor is replaced; cancelling a job on a warm actor kills the actor and
frees its GPUs; a job of another version waiting for the GPUs gets them when the running actor's
job ends (the actor is not kept idle on them); an idle actor retires, and the usage says when until it does.

One server (and its local Ray) for the module; every wait is bounded; nothing is timed."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
from conftest import ControlPlaneProcess, register
from helpers import describe, ray_server, submit, text_body, wait_done, wait_state, wait_until

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SLOW = 120.0
IDLE_S = 30  # LANCEFN_RAY_ACTOR_IDLE_S for this server
CLASSES = """
[[gpu_classes]]
name = "real"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
devices = [0, 1]
"""
PID = """
import os
import time


def pid_of(path: str) -> str:
    if path == "crash":
        os._exit(3)
    if path:
        with open(path + ".pid", "w") as out:
            out.write(str(os.getpid()))
        while not os.path.exists(path):
            time.sleep(0.02)
    return f"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES')}"
"""


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    with ray_server(tmp_path_factory, CLASSES, LANCEFN_RAY_ACTOR_IDLE_S=str(IDLE_S)) as server:
        yield server


def _version(http, *, comment: str = "", num_gpus: int = 1) -> str:
    return register(http, text_body("pid_of", PID + comment, num_gpus=num_gpus, gpu_class="real"))["version"]


def _run(http, version: str, path: str = "") -> str:
    return submit(http, "pid_of", version, [{"path": path}])


def _gone(pid: int) -> Callable[[], bool]:
    """A condition: the process has exited (or is a zombie)."""
    return lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _pid(http, version: str) -> int:
    job = wait_done(http, _run(http, version), SLOW)
    assert job["job_state"] == "DONE", job
    pid, devices = job["result"][0].split()
    assert devices == ",".join(job["placement"]["devices"]) and len(job["placement"]["devices"]) == 1
    return int(pid)


def test_a_version_reuses_its_warm_actor_and_another_version_never_does(cp):
    with cp.http() as http:
        # another version whose setup part differs (a comment alone would share the warm actor: "Setup reuse")
        v1, v2 = _version(http), _version(http, comment="ANOTHER = 2\n")
        first = _pid(http, v1)
        assert _pid(http, v1) == first  # warm: the same actor process ran it
        other = _pid(http, v2)
        assert other != first
        assert _pid(http, v2) == other


def test_a_crashed_actor_fails_its_job_and_is_replaced(cp):
    with cp.http() as http:
        v1 = _version(http)
        warm = _pid(http, v1)
        job = wait_done(http, _run(http, v1, "crash"), SLOW)
        assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "worker", job["failure"]
        wait_until(_gone(warm), "the crashed actor to be gone", SLOW)
        fresh = _pid(http, v1)
        assert fresh != warm
        assert _pid(http, v1) == fresh


def test_cancelling_a_job_on_a_warm_actor_kills_it_and_frees_its_gpus(cp, tmp_path):
    gate = tmp_path / "gate"
    with cp.http() as http:
        v1 = _version(http)
        warm = _pid(http, v1)
        running = _run(http, v1, str(gate))
        wait_until((tmp_path / "gate.pid").exists, "the job to run", SLOW)
        assert int((tmp_path / "gate.pid").read_text()) == warm  # on the warm actor
        assert http.post("/v1/jobs/cancel", json={"job_id": running}).json()["cancelled"] is True
        wait_until(_gone(warm), "the actor to be killed", SLOW)
        # Both GPUs are free again: a 2-GPU job starts and finishes.
        both = _version(http, comment="# two GPUs\n", num_gpus=2)
        job = wait_done(http, _run(http, both), SLOW)
        assert job["job_state"] == "DONE" and len(job["placement"]["devices"]) == 2, job
        assert _pid(http, v1) != warm


def test_a_job_of_another_version_waiting_for_the_gpus_gets_them_when_the_running_job_ends(cp, tmp_path):
    gate = tmp_path / "gate"
    with cp.http() as http:
        both = _version(http, comment="# holds both GPUs\n", num_gpus=2)
        holder = _run(http, both, str(gate))
        wait_until((tmp_path / "gate.pid").exists, "the 2-GPU job to run", SLOW)
        holder_pid = int((tmp_path / "gate.pid").read_text())
        other = _version(http, comment="# waits for a GPU\n")
        waiting = _run(http, other)
        assert describe(http, waiting)["job_state"] == "PENDING"
        gate.touch()
        assert wait_done(http, holder, SLOW)["job_state"] == "DONE"
        # Well before the idle timeout: the holder's actor was not kept idle on both GPUs.
        job = wait_state(http, waiting, "DONE", timeout=IDLE_S * 2 / 3)
        assert int(job["result"][0].split()[0]) != holder_pid
        wait_until(_gone(holder_pid), "the holder's actor to be gone", SLOW)


def _warm_usage_event(cp: ControlPlaneProcess, opened: threading.Event, after_ms: int) -> list[int]:
    """From the event stream: the first ``usage`` event whose ``real`` class has an idle actor that retires after
    ``after_ms`` (epoch ms), its ``warm_retire_ms``."""
    with cp.http(timeout=SLOW) as http, http.stream("GET", "/v1/jobs/events") as reply:
        event = ""
        for line in reply.iter_lines():
            opened.set()
            if line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:") and event == "usage":
                usage = {entry["name"]: entry for entry in json.loads(line.removeprefix("data:"))["classes"]}
                warm = usage["real"].get("warm_retire_ms", [])
                if any(at > after_ms for at in warm):
                    return warm
    raise AssertionError("the event stream ended")


def test_an_idle_actor_retires_and_the_usage_says_when(cp):
    """The usage's ``warm_retire_ms`` (the side panel's warm line) counts the idle actor from when its job ends until
    it retires, and a ``usage`` event says so (the bridge reports it just after the job's own events)."""
    with cp.http() as http, concurrent.futures.ThreadPoolExecutor(1) as pool:
        v1 = _version(http, comment="# retire me\n")
        opened = threading.Event()
        submitted_ms = int(time.time() * 1000)
        # Actors idle before this job retire before submitted_ms + IDLE_S; this job's one after.
        seen = pool.submit(_warm_usage_event, cp, opened, submitted_ms + IDLE_S * 1000)
        assert opened.wait(SLOW)
        warm = _pid(http, v1)
        done_ms = int(time.time() * 1000)
        events_warm = seen.result(timeout=SLOW)
        assert max(events_warm) <= done_ms + IDLE_S * 1000 + 2000, (events_warm, done_ms)
        assert any(at > submitted_ms + IDLE_S * 1000 for at in _real_usage(http).get("warm_retire_ms", []))
        wait_until(_gone(warm), "the idle actor to retire", IDLE_S + 60)
        wait_until(lambda: not _real_usage(http).get("warm_retire_ms"), "the usage to show no warm actor", SLOW)
        assert _pid(http, v1) != warm


def _real_usage(http) -> dict:
    return next(entry for entry in http.get("/v1/gpu/usage").json()["classes"] if entry["name"] == "real")
