"""A job never shares a process with another version or namespace, and cannot read the control
plane's secrets or another namespace's env (real server, real workers, one simulated GPU so every
job lands on the same device set)."""

from __future__ import annotations

import os
import sys

import httpx
import numpy as np
import pytest
from conftest import register, registration_body
from helpers import ONE_GPU, act_body, let_workers_reach_this_python, submit, two_teams, wait_until

from lancefn_jupyter.worker.reap import proc_state

A_KEY, B_KEY = "team-a-key-00000001", "team-b-key-00000002"
KEYS = two_teams(A_KEY, B_KEY)

PATCHER = """
import builtins
import json
import os

import numpy

SEEN = []


def patch(x: int) -> str:
    real_open = builtins.open

    def spying_open(file, *args, **kwargs):
        SEEN.append(str(file))
        return real_open(file, *args, **kwargs)

    builtins.open = spying_open
    numpy.sum = lambda *args, **kwargs: 42
    json.LEFT_BY_A = "a"
    return str(os.getpid())
"""

CHECKER = """
import builtins
import json
import os

import numpy


def check(x: int) -> str:
    clean = (
        type(builtins.open).__name__ == "builtin_function_or_method"
        and int(numpy.sum([1, 2])) == 3
        and not hasattr(json, "LEFT_BY_A")
    )
    return f"{os.getpid()} {'clean' if clean else 'dirty'}"
"""


def client(cp, key: str) -> httpx.Client:
    return cp.http(key, timeout=60.0)


def run(http: httpx.Client, name: str, version: str, rows: list[dict]) -> list:
    job = submit(http, name, version, rows)
    reply = http.post("/v1/jobs/wait", json={"job_id": job, "timeout_s": 60}).json()
    assert reply["job_state"] == "DONE", reply
    return reply["result"]


def test_state_set_by_one_version_reaches_no_other_version_or_namespace(control_plane_factory):
    cp = control_plane_factory(ONE_GPU, api_keys=KEYS)
    with client(cp, A_KEY) as a, client(cp, B_KEY) as b:
        va = register(a, registration_body("patch", source=PATCHER, entrypoint="patch", output_type="utf8"))["version"]
        vb = register(a, registration_body("check", source=CHECKER, entrypoint="check", output_type="utf8"))["version"]
        vc = register(b, registration_body("check", source=CHECKER, entrypoint="check", output_type="utf8"))["version"]
        (pid_a,) = run(a, "patch", va, [{"x": 1}])
        (same_version,) = run(a, "patch", va, [{"x": 2}])
        assert same_version == pid_a  # a version's own worker stays warm for it
        (other_version,) = run(a, "check", vb, [{"x": 1}])
        (other_team,) = run(b, "check", vc, [{"x": 1}])
        (pid_a_again,) = run(a, "patch", va, [{"x": 3}])
    pid_b, verdict_b = other_version.split()
    pid_c, verdict_c = other_team.split()
    assert verdict_b == "clean" and verdict_c == "clean"
    assert len({pid_a, pid_b, pid_c}) == 3  # three processes on the same device set
    assert pid_a_again == pid_a  # and A's worker is still A's


# ------------------------------------------------------------ secrets and the worker user

SECRET = "s3cr3t-value-of-team-a-9f2c"
SNOOPER = """
import os


def snoop(home: str) -> str:
    verdicts = []
    for name in ("api_key", "server.json", "server.lock", "lancefn.sqlite3"):
        try:
            with open(os.path.join(home, name), "rb") as f:
                f.read(1)
            verdicts.append(name + ":read")
        except PermissionError:
            verdicts.append(name + ":denied")
        except OSError as error:
            verdicts.append(name + ":" + type(error).__name__)
    found = []
    needle = WANTED.encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if needle in f.read():
                        found.append(f"{pid}/{part}")
            except OSError:
                pass
    return " ".join(verdicts) + " found=" + ",".join(found)
"""
USER = """
import os


def whoami(x: int) -> str:
    return f"{os.geteuid()} {os.environ.get('TEAM_SECRET') == WANTED}"
"""


@pytest.fixture
def root_server(control_plane_factory):
    """A server running as root with the default worker user (CI runs as root).  Test setup: the
    unprivileged worker user must be able to reach this interpreter (e.g. under /root/.pyenv), so
    directories on the way get o+x (traverse, not list) — the fix the server's refusal names."""
    if os.geteuid() != 0:
        pytest.skip("the worker-user switch needs a root server; CI runs these as root")
    let_workers_reach_this_python()
    return control_plane_factory(ONE_GPU, api_keys=KEYS, env={"LANCEFN_WORKER_USER": ""})


def test_a_job_cannot_read_the_control_planes_files_nor_another_namespaces_env(root_server):
    cp = root_server
    with client(cp, A_KEY) as a, client(cp, B_KEY) as b:
        body = registration_body(
            "whoami",
            source=USER.replace("WANTED", repr(SECRET)),
            entrypoint="whoami",
            output_type="utf8",
            env={"TEAM_SECRET": SECRET},
        )
        va = register(a, body)["version"]
        (who,) = run(a, "whoami", va, [{"x": 1}])  # A's warm worker now holds A's env
        uid, env_ok = who.split()
        assert env_ok == "True"  # A's env reaches A's function
        assert uid != "0"
        vb = register(
            b,
            registration_body(
                "snoop",
                source=SNOOPER.replace("WANTED", repr(SECRET)),
                entrypoint="snoop",
                inputs=(("home", "utf8", False),),
                output_type="utf8",
            ),
        )["version"]
        (report,) = run(b, "snoop", vb, [{"home": str(cp.home)}])
    verdicts, found = report.split(" found=")
    assert verdicts.split() == ["api_key:denied", "server.json:denied", "server.lock:denied", "lancefn.sqlite3:denied"]
    assert found == "", found


def test_a_root_servers_jobs_leave_no_process_and_a_stopped_worker_is_replaced(root_server):
    """docs/ARCHITECTURE.md, "Job processes", with workers as another user and two namespaces."""
    cp = root_server
    body = act_body()
    with client(cp, A_KEY) as a, client(cp, B_KEY) as b:
        va, vb = register(a, body)["version"], register(b, body)["version"]
        (first,) = run(a, "act", va, [{"target": "detach"}])
        worker, sleeper = (int(pid) for pid in first.split()[2::2])  # "uid gid pid umask sleeper-pid"
        try:
            assert not os.path.exists(f"/proc/{sleeper}"), "a's detached sleep outlived its job"
            (verdict,) = run(b, "act", vb, [{"target": f"stop:{worker}"}])  # b's job signals a's idle worker
            assert verdict in ("stopped", "denied")
            if verdict == "stopped":  # the signal lands asynchronously
                wait_until(lambda: proc_state(worker) == "T", f"worker {worker} to stop")
            (second,) = run(a, "act", va, [{"target": ""}])  # a's next job runs all the same
            if verdict == "stopped":
                assert int(second.split()[2]) != worker
        finally:
            for pid in (worker, sleeper):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


def test_an_unknown_worker_user_refuses_to_start_and_says_what_to_fix(control_plane_factory):
    import subprocess

    cp = control_plane_factory(env={"LANCEFN_WORKER_USER": "no-such-user-lancefn"}, start=False)
    result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--worker-user 'no-such-user-lancefn': no such user" in result.stderr and "useradd" in result.stderr


def test_the_refusal_names_the_directories_the_worker_user_cannot_traverse(tmp_path):
    from lancefn_jupyter.server.executors.isolation import _closed_dirs

    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    os.chmod(closed, 0o700)
    os.chmod(closed / "inner", 0o755)
    assert str(closed) in _closed_dirs([closed / "inner" / "python"])
    os.chmod(closed, 0o711)
    assert str(closed) not in _closed_dirs([closed / "inner" / "python"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to probe as another user")
def test_an_interpreter_the_worker_user_cannot_reach_gets_the_designed_message(tmp_path, monkeypatch):
    from lancefn_jupyter.server.executors.isolation import check_worker_user, resolve_worker_user

    closed = tmp_path / "closed"  # like a Python under root's 0700 home
    closed.mkdir(mode=0o700)
    (closed / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(closed / "python"))  # the interpreter the probe starts
    user = resolve_worker_user("nobody")
    assert user is not None
    message = check_worker_user(user, {"PATH": "/usr/bin:/bin"})
    assert message is not None and "cannot start Python" in message and "--worker-user" in message, message
    assert "chmod o+x" in message and f" {closed}`" in message, message


ARRAYS = """
import numpy as np


def ramp(n: int):
    return np.arange(n, dtype=np.float64)
"""


def test_a_root_servers_arrow_results_travel_on_the_pipes_and_are_staged(root_server):
    """Workers of another user cannot open the home's files: their Arrow results come as frames, which the server
    streams into the staging directory (docs/ARCHITECTURE.md, "Result staging") and later into the home."""
    from lancefn_jupyter.wire import dataplane

    cp = root_server
    with client(cp, A_KEY) as a:
        body = registration_body(
            "ramp", source=ARRAYS, entrypoint="ramp", inputs=(("n", "int64", False),), output_type="tensor<float64>"
        )
        version = register(a, body)["version"]
        jobs = [submit(a, "ramp", version, [{"n": n}]) for n in (1_000_000, 7)]
        for job_id, n in zip(jobs, (1_000_000, 7), strict=True):
            assert a.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()["job_state"] == "DONE"
            reply = a.get("/v1/jobs/result", params={"job_id": job_id})
            assert reply.status_code == 200, reply.text
            (value,) = dataplane.decode_results(dataplane.read_ipc(reply.content))
            assert value.dtype == np.float64 and value.shape == (n,) and float(value[-1]) == n - 1
    assert (cp.home / "data" / "staged").resolve().parent.name == "shm"
    cp.stop()
    assert sorted(p.stem for p in (cp.home / "data" / "results").glob("*.arrow")) == sorted(jobs)
