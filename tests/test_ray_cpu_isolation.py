"""CPU jobs on the Ray executor run in warm actors kept per (function version, namespace), queued
by the control plane's Ray driver: a process that ran one version never runs another version or
another namespace's job; cancelling a job on a warm actor kills the actor and frees its slot for
the next queued job; an idle actor retires.

One server (its own local Ray, one CPU slot: ``LANCEFN_RAY_CPU_ACTORS=1``) for the module; every
wait is bounded; nothing is timed."""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Iterator

import httpx
import psutil
import pytest
from conftest import ControlPlaneProcess, make_env, register, registration_body
from test_isolation import A_KEY, B_KEY, CHECKER, KEYS, PATCHER

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SLOW = 120.0
IDLE_S = 20  # LANCEFN_RAY_ACTOR_IDLE_S for this server
TERMINAL = ("DONE", "FAILED", "CANCELLED", "TIMED_OUT")
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
    base = tmp_path_factory.mktemp("cpu")
    (base / "keys.toml").write_text(KEYS)
    temp_dir = tempfile.mkdtemp(prefix="lfi", dir="/tmp")  # short: Ray's unix sockets live below
    server = ControlPlaneProcess(
        base / "home",
        args=["--executor", "ray", "--api-keys", str(base / "keys.toml")],
        env=make_env(
            {
                "RAY_AUTH_MODE": "disabled",
                "LANCEFN_RAY_TEMP_DIR": temp_dir,
                "LANCEFN_RAY_PIP": "never",
                "LANCEFN_RAY_ACTOR_IDLE_S": str(IDLE_S),
                "LANCEFN_RAY_CPU_ACTORS": "1",
            }
        ),
        log_dir=base,
    )
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except Exception:
            server.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _client(cp: ControlPlaneProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=cp.url, headers={"x-api-key": key}, timeout=60.0)


def _cpu_version(http: httpx.Client, name: str, source: str, *, input_type: str = "int64") -> str:
    arg = "path" if input_type == "utf8" else "x"
    body = registration_body(
        name, source=source, entrypoint=name, inputs=((arg, input_type, False),), output_type="utf8", num_gpus=None
    )
    return register(http, body)["version"]


def _run(http: httpx.Client, name: str, version: str, row: dict) -> str:
    reply = http.post("/v1/functions/run", json={"name": name, "version": version, "rows": [row]})
    assert reply.status_code == 202, reply.text
    return reply.json()["job_id"]


def _until(what: str, condition, timeout: float = SLOW):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)
    return value


def _finished(http: httpx.Client, job_id: str) -> dict:
    return _until(
        f"job {job_id} to end",
        lambda: (
            (job := http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 5}).json())["job_state"] in TERMINAL
            and job
        ),
    )


def _result(http: httpx.Client, name: str, version: str, row: dict) -> str:
    job = _finished(http, _run(http, name, version, row))
    assert job["job_state"] == "DONE", job
    assert job["placement"]["devices"] == [], job["placement"]  # a CPU job
    return job["result"][0]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_state_set_by_one_cpu_version_reaches_no_other_version_or_namespace(cp):
    with _client(cp, A_KEY) as a, _client(cp, B_KEY) as b:
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
    with _client(cp, A_KEY) as http:
        version = _cpu_version(http, "gated", GATED, input_type="utf8")
        warm = int(_result(http, "gated", version, {"path": ""}))
        running = _run(http, "gated", version, {"path": str(gate)})
        _until("the job to run", lambda: (tmp_path / "gate.pid").exists())
        assert int((tmp_path / "gate.pid").read_text()) == warm  # on the warm actor
        other = _cpu_version(http, "check", CHECKER + "# waits for the slot\n")
        queued = _run(http, "check", other, {"x": 1})
        # One slot, and it is taken: the other job waits in the control plane's Ray driver.
        assert http.post("/v1/jobs/describe", json={"job_id": queued}).json()["job_state"] == "PENDING"
        assert http.post("/v1/jobs/cancel", json={"job_id": running}).json()["cancelled"] is True
        _until("the warm actor to be killed", lambda: _gone(warm))
        job = _finished(http, queued)
        assert job["job_state"] == "DONE" and job["result"][0].split()[1] == "clean", job
        assert _finished(http, running)["job_state"] == "CANCELLED"
        assert int(_result(http, "gated", version, {"path": ""})) != warm  # a new actor for the version


def test_an_idle_cpu_actor_retires(cp):
    with _client(cp, A_KEY) as http:
        version = _cpu_version(http, "gated", GATED + "# retire me\n", input_type="utf8")
        warm = int(_result(http, "gated", version, {"path": ""}))
        _until("the idle actor to retire", lambda: _gone(warm), timeout=IDLE_S + 60)
        assert int(_result(http, "gated", version, {"path": ""})) != warm
