"""Nothing a job starts outlives it, and a stopped worker never holds a job (docs/ARCHITECTURE.md, "Job
processes"): a real server, real workers, processes checked in ``/proc``."""

from __future__ import annotations

import json
import os
import platform
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

#: Starts a child with ``clone(CLONE_PARENT | SIGCHLD)`` (x86_64's raw syscall 56: a fork whose parent is the worker's
#: parent, the server, so no sweep of the worker sees it), which leaves the worker's session, writes its parent's pid
#: to ``path`` and sleeps (ends at once when ``path`` ends with ".exit"); returns "<child pid> <worker pid>".
CLONE = """
import ctypes
import os
import time


def clone(path: str) -> str:
    pid = ctypes.CDLL(None, use_errno=True).syscall(56, 0x00008000 | 17, 0, 0, 0, 0)
    if pid == 0:
        os.setsid()
        with open(path, "w") as out:
            out.write(str(os.getppid()))
        if not path.endswith(".exit"):
            time.sleep(600)
        os._exit(0)
    while not os.path.exists(path) or not open(path).read():
        time.sleep(0.01)
    return f"{pid} {os.getpid()}"
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


def test_a_clone_parent_child_of_a_job_ends_with_it_the_warm_worker_stays_and_no_zombie_is_left(
    control_plane, tmp_path: Path
):
    """A child made with ``CLONE_PARENT`` is the server's, not the worker's, and leaves the worker's session: only
    the worker's cgroup still holds it. It dies when its job ends, the warm worker serves on, and the server reaps
    it (before: it lived as long as the warm worker)."""
    if not may_create_cgroups():
        pytest.skip("no cgroup v2 this user may create cgroups in here: the subreaper's sweep alone")
    if platform.machine() != "x86_64":
        pytest.skip("the test's raw clone syscall is x86_64's")
    with control_plane.http() as http:
        version = register(http, text_body("clone", CLONE, num_gpus=None))["version"]
        first = tmp_path / "first"
        (result,) = run_one(http, "clone", version, str(first))["result"]
        child, worker = (int(pid) for pid in result.split())
        children = [child]
        try:
            assert int(first.read_text()) == control_plane.proc.pid  # the server's child, as the worker's parent
            assert proc_state(child) in (None, "Z"), f"the job's CLONE_PARENT child {child} outlived it"
            wait_until(lambda: gone(child), f"the server to reap its zombie child {child}")
            (again,) = run_one(http, "clone", version, str(tmp_path / "second"))["result"]
            second, same = (int(pid) for pid in again.split())
            children.append(second)
            assert same == worker, "the warm worker was replaced"
            assert proc_state(second) in (None, "Z")
            wait_until(lambda: gone(second), f"the server to reap its zombie child {second}")
            (ended,) = run_one(http, "clone", version, str(tmp_path / "third.exit"))["result"]
            third = int(ended.split()[0])  # it ended by itself: a zombie of the server's, which the server reaps
            children.append(third)
            wait_until(lambda: gone(third), f"the server to reap its zombie child {third}")
        finally:
            kill_quietly(children)
