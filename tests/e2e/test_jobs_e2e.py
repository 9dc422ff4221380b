"""Jobs end to end: a real ``lancefn-server`` (simulated class of 2 GPUs), the local executor, real workers.

Functions that must stay running wait for a file the test creates ("gates"), so there are no
timing races; waits poll the REST API until a condition holds (generous deadline, never an
assert on elapsed time).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
from conftest import register, registration_body
from helpers import CUDA_CELL, DEADLINE_S, describe, submit, wait_done, wait_state, wait_until

from lancefn_jupyter.kernel.handles.local_run import run_local

GATE = """from __future__ import annotations

import os
import time


def gate(path: str) -> str:
    print("pid", os.getpid(), flush=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    print("released", path)
    return os.environ["NUMBA_ENABLE_CUDASIM"]
"""

MISBEHAVE = """from __future__ import annotations

import os
import time


def check(mode):
    if mode == "raise":
        raise ValueError("bad mode: " + mode)


def misbehave(mode: str) -> int:
    print("mode", mode, flush=True)
    if mode == "sleep":
        time.sleep(60)
    if mode == "exit":
        os._exit(1)
    check(mode)
    return 1
"""


# ------------------------------------------------------------------------- helpers


def register_gate(http: httpx.Client, name: str = "gate", num_gpus: int = 1) -> str:
    body = registration_body(
        name, source=GATE, entrypoint="gate", inputs=(("path", "utf8", False),), output_type="utf8", num_gpus=num_gpus
    )
    return register(http, body)["version"]


def logs(http: httpx.Client, job_id: str) -> list[str]:
    return http.post("/v1/jobs/logs", json={"job_id": job_id}).json()["lines"]


def worker_pid(http: httpx.Client, job_id: str) -> int:
    """The pid a gate function printed first thing (waits for the line to reach the logs)."""
    line = wait_until(lambda: next((ln for ln in logs(http, job_id) if ln.startswith("pid ")), None), f"{job_id}'s pid")
    return int(line.split()[1])


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited; a zombie of an init that does not reap still holds no device


def usage(http: httpx.Client) -> dict:
    """The default class's usage, less when its idle warm workers retire (tests/server/executors/test_idle_workers.py)."""
    reply = http.get("/v1/gpu/usage")
    assert reply.status_code == 200, reply.text
    (default,) = [c for c in reply.json()["classes"] if c["name"] == "default"]
    default.pop("warm_retire_ms", None)
    return default


def read_events(cp, until, *, last_event_id: int | None = None, connected: threading.Event | None = None) -> list[dict]:
    """Job events from ``/v1/jobs/events`` as {"id", "job"}, until ``until(events)`` holds."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    events: list[dict] = []
    with (
        cp.http(timeout=httpx.Timeout(DEADLINE_S)) as http,
        http.stream("GET", "/v1/jobs/events", headers=headers) as reply,
    ):
        assert reply.status_code == 200
        block: dict[str, str] = {}
        for line in reply.iter_lines():
            if line.startswith(":"):
                continue  # keepalive comment
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
                continue
            if block.get("event") == "usage" and connected is not None:
                connected.set()  # the first block comes once the server has subscribed us
            if block.get("event") == "job":
                events.append({"id": int(block["id"]), "job": json.loads(block["data"])})
                if until(events):
                    return events
            block = {}
    raise AssertionError("event stream ended early")


def states_of(events: list[dict], job_id: str) -> list[str]:
    """The job's states in event order, repeats (progress, placement changes) collapsed."""
    states: list[str] = []
    for event in events:
        if event["job"]["job_id"] == job_id and (not states or states[-1] != event["job"]["job_state"]):
            states.append(event["job"]["job_state"])
    return states


def terminal(events: list[dict], job_id: str) -> bool:
    return any(
        e["job"]["job_id"] == job_id and e["job"]["job_state"] in ("DONE", "FAILED", "CANCELLED", "TIMED_OUT")
        for e in events
    )


# --------------------------------------------------------------------------- tests


def test_capacity_queue_fifo_logs_and_the_event_stream(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        one = register_gate(http, "gate")
        two = register_gate(http, "gate2", num_gpus=2)

        live: list[dict] = []
        connected = threading.Event()
        ids: dict[str, str] = {}
        reader = threading.Thread(
            target=lambda: live.extend(
                read_events(cp, lambda ev: "j4" in ids and terminal(ev, ids["j4"]), connected=connected)
            ),
            daemon=True,
        )
        reader.start()
        assert connected.wait(DEADLINE_S)

        gates = {name: tmp_path / name for name in ("j1", "j2", "j3", "j4")}
        for name in ("j1", "j2", "j3"):
            ids[name] = submit(http, "gate", one, [{"path": str(gates[name])}])
        ids["j4"] = submit(http, "gate2", two, [{"path": str(gates["j4"])}])

        j1, j2 = (wait_state(http, ids[n], "IN_PROGRESS") for n in ("j1", "j2"))
        assert sorted(j1["placement"]["devices"] + j2["placement"]["devices"]) == ["sim0", "sim1"]
        j3, j4 = describe(http, ids["j3"]), describe(http, ids["j4"])
        assert j3["job_state"] == "PENDING"
        assert j3["placement"]["waiting_on_capacity"] is True and j3["placement"]["queue_position"] == 1
        assert j4["job_state"] == "PENDING" and j4["placement"]["queue_position"] == 2
        assert usage(http) == {"name": "default", "gpus_total": 2, "gpus_busy": 2, "jobs_running": 2, "jobs_pending": 2}

        gates["j1"].touch()
        done = wait_done(http, ids["j1"])
        assert (done["job_state"], done["result"]) == ("DONE", ["1"])  # ran on the simulator
        assert logs(http, ids["j1"])[-1] == f"released {gates['j1']}"
        j3 = wait_state(http, ids["j3"], "IN_PROGRESS")
        assert j3["placement"]["devices"] == j1["placement"]["devices"]  # the freed GPU

        gates["j2"].touch()
        wait_done(http, ids["j2"])
        j4 = describe(http, ids["j4"])  # one GPU free is not enough for a 2-GPU job
        assert j4["job_state"] == "PENDING" and j4["placement"]["queue_position"] == 1

        gates["j3"].touch()
        j4 = wait_state(http, ids["j4"], "IN_PROGRESS")
        assert sorted(j4["placement"]["devices"]) == ["sim0", "sim1"]
        gates["j4"].touch()
        assert wait_done(http, ids["j4"])["job_state"] == "DONE"
        assert usage(http)["gpus_busy"] == 0

    reader.join(DEADLINE_S)
    assert not reader.is_alive()
    assert [e["id"] for e in live] == sorted({e["id"] for e in live})  # strictly increasing ids
    for name in ("j1", "j2", "j3", "j4"):
        assert states_of(live, ids[name]) == ["PENDING", "IN_PROGRESS", "DONE"], name
    first_j3 = next(e["job"] for e in live if e["job"]["job_id"] == ids["j3"])
    assert first_j3["placement"]["waiting_on_capacity"] is True

    # Resuming from any event id replays exactly what followed it.
    middle = next(e["id"] for e in live if e["job"]["job_id"] == ids["j3"] and e["job"]["job_state"] == "IN_PROGRESS")
    resumed = read_events(cp, lambda ev: terminal(ev, ids["j4"]), last_event_id=middle)
    assert resumed == [e for e in live if e["id"] > middle]


def test_cancel_pending_and_running_jobs_frees_their_gpus(control_plane, tmp_path):
    with control_plane.http() as http:
        version = register_gate(http)
        running = [submit(http, "gate", version, [{"path": str(tmp_path / f"r{i}")}]) for i in range(2)]
        pending = submit(http, "gate", version, [{"path": str(tmp_path / "p")}])
        pids = [worker_pid(http, job_id) for job_id in running]
        assert describe(http, pending)["job_state"] == "PENDING"

        assert http.post("/v1/jobs/cancel", json={"job_id": pending}).json() == {"job_id": pending, "cancelled": True}
        assert describe(http, pending)["job_state"] == "CANCELLED"
        assert usage(http) == {"name": "default", "gpus_total": 2, "gpus_busy": 2, "jobs_running": 2, "jobs_pending": 0}

        assert http.post("/v1/jobs/cancel", json={"job_id": running[0]}).json()["cancelled"] is True
        assert describe(http, running[0])["job_state"] == "CANCELLED"
        assert usage(http)["gpus_busy"] == 1
        wait_until(lambda: process_gone(pids[0]), "the cancelled job's worker to be killed")

        after = submit(http, "gate", version, [{"path": str(tmp_path / "after")}])
        assert (
            wait_state(http, after, "IN_PROGRESS")["placement"]["devices"]
            == describe(http, running[0])["placement"]["devices"]
        )
        (tmp_path / "after").touch()
        assert wait_done(http, after)["job_state"] == "DONE"

        http.post("/v1/jobs/cancel", json={"job_id": running[1]})
        wait_until(lambda: process_gone(pids[1]), "the second cancelled job's worker to be killed")
        assert usage(http) == {"name": "default", "gpus_total": 2, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 0}
        assert http.post("/v1/jobs/cancel", json={"job_id": running[1]}).json()["cancelled"] is False
        assert [describe(http, j)["job_state"] for j in running] == ["CANCELLED", "CANCELLED"]


def test_timeout_crash_and_exception_end_jobs_with_readable_failures(control_plane):
    with control_plane.http() as http:
        body = registration_body(
            "misbehave", source=MISBEHAVE, entrypoint="misbehave", inputs=(("mode", "utf8", False),)
        )
        version = register(http, body)["version"]
        slow = submit(http, "misbehave", version, [{"mode": "sleep"}], timeout_s=1)
        crash = submit(http, "misbehave", version, [{"mode": "exit"}])
        bad = submit(http, "misbehave", version, [{"mode": "raise"}])

        slow, crash, bad = (wait_done(http, job_id) for job_id in (slow, crash, bad))
        assert slow["job_state"] == "TIMED_OUT" and slow["failure"]["phase"] == "timeout"
        assert "timeout of 1 s" in slow["failure"]["message"]

        assert crash["job_state"] == "FAILED" and crash["failure"]["phase"] == "worker"
        assert crash["failure"]["message"].startswith("worker process exited with code 1")

        failure = bad["failure"]
        assert bad["job_state"] == "FAILED" and failure["phase"] == "run"
        assert failure["message"] == "ValueError: bad mode: raise"
        filename = f"<gpu_function misbehave@{version}>"
        assert f'File "{filename}", line 18, in misbehave' in failure["traceback"]
        assert f'File "{filename}", line 9, in check' in failure["traceback"]
        assert "lancefn_jupyter" not in failure["traceback"]
        assert logs(http, bad["job_id"]) == ["mode raise"]

        assert usage(http)["gpus_busy"] == 0
        ok = submit(http, "misbehave", version, [{"mode": "fine"}])  # the class still works
        assert wait_done(http, ok)["result"] == [1]


def test_server_killed_and_restarted_accounts_for_every_job(control_plane_factory, tmp_path):
    cp = control_plane_factory()
    with cp.http() as http:
        version = register_gate(http)
        jobs = [submit(http, "gate", version, [{"path": str(tmp_path / f"g{i}")}]) for i in range(3)]
        old_pids = [worker_pid(http, job_id) for job_id in jobs[:2]]
        assert describe(http, jobs[2])["job_state"] == "PENDING"

    cp.kill()
    cp.start()
    with cp.http() as http:
        for job_id in jobs:
            assert describe(http, job_id)["job_state"] in ("PENDING", "IN_PROGRESS")
        for job_id in jobs[:2]:
            assert any("job re-queued" in line for line in logs(http, job_id))
        for pid in old_pids:  # workers orphaned by the kill stop on their own
            wait_until(lambda pid=pid: process_gone(pid), f"orphaned worker {pid} to exit")
        for i in range(3):
            (tmp_path / f"g{i}").touch()
        assert [wait_done(http, job_id)["job_state"] for job_id in jobs] == ["DONE"] * 3
        assert usage(http) == {"name": "default", "gpus_total": 2, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 0}


def test_cuda_cell_gives_the_same_results_locally_and_as_a_job(control_plane):
    rows = [{"values": [1.0, 2.5]}, {"values": [i / 4 for i in range(100)]}]
    with control_plane.http() as http:
        body = registration_body(
            "double_all",
            source=CUDA_CELL.decode(),
            entrypoint="double_all",
            inputs=(("values", "list<float64>", False),),
            output_type="list<float64>",
        )
        version = register(http, body)["version"]
        job = wait_done(http, submit(http, "double_all", version, rows))
        assert job["job_state"] == "DONE", job.get("failure")
        assert logs(http, job["job_id"]) == ["doubled 2 values", "doubled 100 values"]
    local = run_local(CUDA_CELL, "double_all", f"<gpu_function double_all@{version}>", rows, mode="auto")
    assert job["result"] == local.results == [[2.0, 5.0], [i / 2 for i in range(100)]]
