"""CPU jobs on the Ray executor run in warm actors kept per (function version, namespace), queued
by the control plane's Ray driver: a process that ran one version never runs another version or
another namespace's job; cancelling a job on a warm actor kills the actor and frees its slot for
the next queued job; an idle actor retires.

One server (its own local Ray, one CPU slot: ``LANCEFN_RAY_CPU_ACTORS=1``) for the module; every
wait is bounded; nothing is timed."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import psutil
import pytest
from conftest import ControlPlaneProcess, register, registration_body
from helpers import describe, ray_server, submit, text_body, wait_done, wait_until
from test_isolation import A_KEY, B_KEY, CHECKER, KEYS, PATCHER, client

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SLOW = 120.0
IDLE_S = 20  # LANCEFN_RAY_ACTOR_IDLE_S for this server
ANY_CLASS = "[[gpu_classes]]\nname = 'default'\nsimulated = 1\n"  # the jobs here need no GPU
GATED = """
import os
import time


def gated(path: str) -> str:
    if path:
        with open(path + ".pid", "w") as out:
            out.write(str(os.getpid()))
        while not os.path.exists(path):
            time.sleep(0.02)
    return str(os.getpid())
"""


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)  # the server refuses a key file others can read
    env = {"LANCEFN_RAY_ACTOR_IDLE_S": str(IDLE_S), "LANCEFN_RAY_CPU_ACTORS": "1"}
    with ray_server(tmp_path_factory, ANY_CLASS, "--api-keys", str(keys), **env) as server:
        yield server


def _cpu_version(http: httpx.Client, name: str, source: str) -> str:
    body = registration_body(name, source=source, entrypoint=name, output_type="utf8", num_gpus=None)
    return register(http, body)["version"]


def _gated_version(http: httpx.Client, comment: str = "") -> str:
    return register(http, text_body("gated", GATED + comment, num_gpus=None))["version"]


def _result(http: httpx.Client, name: str, version: str, row: dict) -> str:
    job = wait_done(http, submit(http, name, version, [row]), SLOW)
    assert job["job_state"] == "DONE", job
    assert job["placement"]["devices"] == [], job["placement"]  # a CPU job
    return job["result"][0]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_state_set_by_one_cpu_version_reaches_no_other_version_or_namespace(cp):
    with client(cp, A_KEY) as a, client(cp, B_KEY) as b:
        va = _cpu_version(a, "patch", PATCHER)
        vb = _cpu_version(a, "check", CHECKER)
        vc = _cpu_version(b, "check", CHECKER)
        pid_a = _result(a, "patch", va, {"x": 1})
        assert _result(a, "patch", va, {"x": 2}) == pid_a  # a version's own actor stays warm for it
        pid_b, verdict_b = _result(a, "check", vb, {"x": 1}).split()
        pid_c, verdict_c = _result(b, "check", vc, {"x": 1}).split()
    assert verdict_b == "clean" and verdict_c == "clean"  # open, numpy.sum and json untouched
    assert len({pid_a, pid_b, pid_c}) == 3


def test_cancelling_a_cpu_job_on_a_warm_actor_kills_it_and_frees_the_slot(cp, tmp_path):
    gate = tmp_path / "gate"
    with client(cp, A_KEY) as http:
        version = _gated_version(http)
        warm = int(_result(http, "gated", version, {"path": ""}))
        running = submit(http, "gated", version, [{"path": str(gate)}])
        wait_until(lambda: (tmp_path / "gate.pid").exists(), "the job to run", SLOW)
        assert int((tmp_path / "gate.pid").read_text()) == warm  # on the warm actor
        other = _cpu_version(http, "check", CHECKER + "# waits for the slot\n")
        queued = submit(http, "check", other, [{"x": 1}])
        # One slot, and it is taken: the other job waits in the control plane's Ray driver.
        assert describe(http, queued)["job_state"] == "PENDING"
        assert http.post("/v1/jobs/cancel", json={"job_id": running}).json()["cancelled"] is True
        wait_until(lambda: _gone(warm), "the warm actor to be killed", SLOW)
        job = wait_done(http, queued, SLOW)
        assert job["job_state"] == "DONE" and job["result"][0].split()[1] == "clean", job
        assert wait_done(http, running, SLOW)["job_state"] == "CANCELLED"
        assert int(_result(http, "gated", version, {"path": ""})) != warm  # a new actor for the version


def test_an_idle_cpu_actor_retires(cp):
    with client(cp, A_KEY) as http:
        version = _gated_version(http, "# retire me\n")
        warm = int(_result(http, "gated", version, {"path": ""}))
        wait_until(lambda: _gone(warm), "the idle actor to retire", IDLE_S + 60)
        assert int(_result(http, "gated", version, {"path": ""})) != warm
