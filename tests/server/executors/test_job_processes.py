"""Nothing a job starts outlives it, and a stopped worker never holds a job (docs/ARCHITECTURE.md, "Job
processes"): a real server, real workers, processes checked in ``/proc``."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import register
from helpers import submit, text_body, wait_done, wait_until

from lancefn_jupyter.worker.reap import proc_state

pytestmark = pytest.mark.timeout(180)

#: Starts ``sleep 600`` detached (its own session, its parent gone: a double fork) and returns its pid.
DETACH = """
import subprocess


def detach(path: str) -> str:
    started = subprocess.run(
        ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return started.stdout.strip()
"""

#: Starts 200 ``sleep 600`` children and returns their pids (JSON), without waiting for them.
MANY = """
import json
import subprocess


def many(path: str) -> str:
    children = [subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL) for _ in range(200)]
    return json.dumps([child.pid for child in children])
"""

#: The worker's pid; with a path, it is written to ``path + ".pid"`` (and a detached sleep's pid to
#: ``path + ".sleep"``) and the job holds until ``path`` exists.
PID = """
import os
import subprocess
import time


def pid(path: str) -> str:
    if path:
        started = subprocess.run(
            ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        )
        with open(path + ".sleep", "w") as out:
            out.write(started.stdout.strip())
        with open(path + ".pid", "w") as out:
            out.write(str(os.getpid()))
        while not os.path.exists(path):
            time.sleep(0.05)
    return str(os.getpid())
"""


#: Detaches a ``sleep 600`` (its pid to ``path``), then the worker dies by itself, before any sweep.
CRASH = """
import os
import subprocess


def crash(path: str) -> str:
    started = subprocess.run(
        ["setsid", "sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    with open(path, "w") as out:
        out.write(started.stdout.strip())
    os._exit(3)
"""


def may_create_cgroups() -> bool:
    """Whether this process (so a server started by it) may create a cgroup v2 under its own."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    mount = next((line.split()[1] for line in mounts if line.split()[2:3] == ["cgroup2"]), None)
    own = next(
        (line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::")), None
    )
    if mount is None or own is None:
        return False
    probe = Path(mount) / own.lstrip("/") / f"lancefn-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


def gone(pid: int) -> bool:
    """No such process (a zombie still counts as there: nobody reaped it)."""
    return not os.path.exists(f"/proc/{pid}")


def kill_quietly(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_one(http, name: str, version: str, path: str = "") -> dict:
    job = wait_done(http, submit(http, name, version, [{"path": path}]))
    assert job["job_state"] == "DONE", job
    return job


def test_a_detached_double_forked_process_ends_with_its_job(control_plane):
    with control_plane.http() as http:
        version = register(http, text_body("detach", DETACH, num_gpus=None))["version"]
        (sleeper,) = run_one(http, "detach", version)["result"]
        try:
            assert sleeper.isdigit()
            assert gone(int(sleeper)), f"the job's detached sleep {sleeper} outlived it"
            (again,) = run_one(http, "detach", version)["result"]  # the warm worker goes on serving
            assert gone(int(again))
        finally:
            kill_quietly([int(sleeper)])


def test_two_hundred_children_of_a_finished_job_are_all_gone(control_plane):
    with control_plane.http() as http:
        version = register(http, text_body("many", MANY, num_gpus=None))["version"]
        (listed,) = run_one(http, "many", version)["result"]
        pids = json.loads(listed)
        try:
            assert len(pids) == 200
            assert [pid for pid in pids if not gone(pid)] == []
        finally:
            kill_quietly(pids)


def test_a_stopped_idle_worker_is_replaced_and_the_next_job_runs(control_plane):
    with control_plane.http() as http:
        version = register(http, text_body("pid", PID, num_gpus=None))["version"]
        (first,) = run_one(http, "pid", version)["result"]
        os.kill(int(first), signal.SIGSTOP)  # as another process of the workers' user could
        try:
            wait_until(
                lambda: proc_state(int(first)) == "T", f"worker {first} to stop"
            )  # the signal lands asynchronously
            (second,) = run_one(http, "pid", version)["result"]
            assert second != first
            wait_until(lambda: gone(int(first)), f"the stopped worker {first} to be killed")
        finally:
            kill_quietly([int(first)])


def test_a_job_whose_worker_is_stopped_fails_and_the_next_runs(control_plane, tmp_path: Path):
    gate = str(tmp_path / "gate")
    with control_plane.http() as http:
        version = register(http, text_body("pid", PID, num_gpus=None))["version"]
        job = submit(http, "pid", version, [{"path": gate}])
        worker = int(wait_until(lambda: Path(gate + ".pid").exists() and Path(gate + ".pid").read_text(), "the job"))
        os.kill(worker, signal.SIGSTOP)
        try:
            ended = wait_done(http, job)
            assert ended["job_state"] == "FAILED", ended
            assert ended["failure"]["phase"] == "worker" and "was stopped" in ended["failure"]["message"], ended
            wait_until(lambda: gone(worker), f"the stopped worker {worker} to be killed")
            sleeper = int(Path(gate + ".sleep").read_text())
            wait_until(lambda: gone(sleeper), f"the stopped job's detached sleep {sleeper} to end")
            (after,) = run_one(http, "pid", version)["result"]
            assert int(after) != worker
        finally:
            kill_quietly([worker])


def test_a_graceful_server_stop_leaves_no_process_of_a_running_job(control_plane, tmp_path: Path):
    gate = str(tmp_path / "gate")
    with control_plane.http() as http:
        version = register(http, text_body("pid", PID, num_gpus=None))["version"]
        submit(http, "pid", version, [{"path": gate}])
        wait_until(lambda: Path(gate + ".pid").exists() and Path(gate + ".pid").read_text(), "the job")
    worker, sleeper = int(Path(gate + ".pid").read_text()), int(Path(gate + ".sleep").read_text())
    try:
        assert control_plane.stop() == 0
        assert gone(worker)
        assert gone(sleeper), f"the running job's detached sleep {sleeper} outlived the server"
    finally:
        kill_quietly([worker, sleeper])


def test_a_crashed_workers_detached_process_ends_with_its_cgroup(control_plane, tmp_path: Path):
    """Where the server may make cgroups (v2), a worker that dies by itself leaves nothing behind either."""
    if not may_create_cgroups():
        pytest.skip("no cgroup v2 this user may create cgroups in here: the subreaper's sweep alone")
    path = str(tmp_path / "sleeper")
    with control_plane.http() as http:
        version = register(http, text_body("crash", CRASH, num_gpus=None))["version"]
        job = wait_done(http, submit(http, "crash", version, [{"path": path}]))
    assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "worker", job
    sleeper = int(Path(path).read_text())
    try:
        wait_until(lambda: proc_state(sleeper) in (None, "Z"), f"the crashed job's detached sleep {sleeper} to end")
    finally:
        kill_quietly([sleeper])
