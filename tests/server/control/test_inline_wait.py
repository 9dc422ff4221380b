"""`functions/run` with `wait_s` (the inline wait) on a real server with the real local executor:
a job that ends within the wait comes back finished in the run reply, durably; one that does not
comes back as it stands; a job queued behind busy GPUs is answered at once; old clients (no
`wait_s`) get the reply they always got; the client's `run_job` and the notebook API's
`submit` → `result()` use it."""

from __future__ import annotations

import threading

import httpx
import pytest
from conftest import register, registration_body
from helpers import DEADLINE_S, describe, hold_version, submit, text_body, wait_done, wait_state, wait_until

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client import Client
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.wire.models import Job, JobState


def run_waiting(http: httpx.Client, name: str, version: str, rows: list[dict], wait_s: float) -> dict:
    reply = http.post(
        "/v1/functions/run", json={"name": name, "version": version, "rows": rows, "wait_s": wait_s}, timeout=DEADLINE_S
    )
    assert reply.status_code == 202, reply.text
    body = reply.json()
    Job.from_wire(body["job"])  # the inline job decodes as the wire model
    assert body["job"]["job_id"] == body["job_id"]
    return body


def test_a_job_that_ends_within_the_wait_comes_back_finished_and_is_on_disk(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body("double"))["version"]
        body = run_waiting(http, "double", version, [{"x": 4}, {"x": 5}], wait_s=DEADLINE_S)
        job = body["job"]
        assert job["job_state"] == "DONE" and job["result"] == [8, 10]
        assert job["progress"] == {"rows_done": 2, "rows_total": 2}
        assert describe(http, body["job_id"]) == job
    # Acknowledged DONE means saved: a SIGKILL right after loses nothing and re-runs nothing.
    control_plane.kill()
    control_plane.start()
    with control_plane.http() as http:
        again = describe(http, body["job_id"])
        assert again["job_state"] == "DONE" and again["result"] == [8, 10]
        assert again["finished_ms"] == job["finished_ms"]


def test_a_job_still_running_when_the_wait_ends_comes_back_as_it_stands(control_plane, tmp_path):
    gate = tmp_path / "go"
    with control_plane.http() as http:
        version = hold_version(http)
        body = run_waiting(http, "hold", version, [{"path": str(gate)}], wait_s=0.2)
        assert body["job"]["job_state"] in ("PENDING", "IN_PROGRESS")
        gate.touch()
        assert wait_done(http, body["job_id"])["result"] == [str(gate)]


def test_a_job_queued_behind_busy_gpus_is_answered_at_once(control_plane, tmp_path):
    with control_plane.http() as http:
        blocker_version = hold_version(http, "hold_both", num_gpus=2)  # the default class has 2 GPUs
        blocker = submit(http, "hold_both", blocker_version, [{"path": str(tmp_path / "release")}])
        wait_state(http, blocker, "IN_PROGRESS")
        version = register(http, registration_body("double"))["version"]
        # Were the reply held for wait_s, the client's shorter timeout would fail this request.
        reply = http.post(
            "/v1/functions/run",
            json={"name": "double", "version": version, "rows": [{"x": 1}], "wait_s": 60},
            timeout=DEADLINE_S / 2,
        )
        assert reply.status_code == 202, reply.text
        job = reply.json()["job"]
        assert job["job_state"] == "PENDING"
        assert job["placement"]["waiting_on_capacity"] is True and job["placement"]["queue_position"] == 1
        (tmp_path / "release").touch()
        assert wait_done(http, job["job_id"])["result"] == [2]


def test_without_wait_s_the_reply_is_the_job_id_alone(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body("double"))["version"]
        reply = http.post("/v1/functions/run", json={"name": "double", "version": version, "rows": [{"x": 1}]})
        assert reply.status_code == 202 and set(reply.json()) == {"job_id"}
        assert wait_done(http, reply.json()["job_id"])["result"] == [2]


@pytest.mark.parametrize("wait_s", [-1, 61, "soon"])
def test_a_bad_wait_s_is_refused_naming_the_field(control_plane, wait_s):
    with control_plane.http() as http:
        version = register(http, registration_body("double"))["version"]
        reply = http.post(
            "/v1/functions/run", json={"name": "double", "version": version, "rows": [{"x": 1}], "wait_s": wait_s}
        )
        assert reply.status_code == 400, reply.text
        assert "wait_s" in reply.json()["error"]["message"]
        assert http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"] == []  # nothing started


def test_the_client_run_job_returns_the_finished_job(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body("double"))["version"]
    client = Client(control_plane.url, control_plane.api_key)
    job = client.functions.run_job("double", version, [{"x": 21}], wait_s=DEADLINE_S)
    assert job.job_state == JobState.DONE and job.result == [42]
    pending = client.functions.run_job("double", version, [{"x": 1}], wait_s=0)
    assert pending.job_id and client.jobs.wait(pending.job_id, timeout=DEADLINE_S).result == [2]


def test_submit_and_result_through_the_notebook_api(control_plane):
    kernel_session.registered.clear()
    api.connect(control_plane.url, control_plane.api_key)

    def triple(x: int) -> int:
        return 3 * x

    fn = api.gpu_function(num_gpus=1, name="triple")(triple)
    results: list = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(fn.submit(i).result(timeout=DEADLINE_S))) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert sorted(results) == [0, 3, 6, 9]
    assert fn.remote(7) == 21


def test_a_warm_job_run_by_the_request_keeps_every_state_and_is_saved_with_its_outcome(control_plane):
    """On an idle warm worker the request's own core thread runs the job (docs/ARCHITECTURE.md, "REST details"),
    and the job is first saved with its outcome: still every state is an event, in order, and it survives a kill."""
    from test_server_jobs import read_events

    with control_plane.http() as http:
        version = register(http, registration_body("double"))["version"]
        run_waiting(http, "double", version, [{"x": 1}], wait_s=DEADLINE_S)  # its worker is warm now
        body = run_waiting(http, "double", version, [{"x": 21}], wait_s=DEADLINE_S)
        assert body["job"]["job_state"] == "DONE" and body["job"]["result"] == [42]
        listed = http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"]
        assert body["job_id"] in [job["job_id"] for job in listed]
    seen = read_events(
        control_plane,
        last_event_id="0",
        until=lambda events: any(body["job_id"] in str(e[2]) and "DONE" in str(e[2]) for e in events),
    )
    states = [data["job_state"] for kind, _, data in seen if kind == "job" and data["job_id"] == body["job_id"]]
    assert states == ["PENDING", "IN_PROGRESS", "DONE"]
    placed = next(data for kind, _, data in seen if kind == "job" and data["job_id"] == body["job_id"])
    assert placed["placement"]["devices"] and placed["placement"]["waiting_on_capacity"] is False
    control_plane.kill()
    control_plane.start()
    with control_plane.http() as http:
        assert describe(http, body["job_id"]) == body["job"]


def test_a_warm_job_still_running_at_the_end_of_the_wait_is_saved_before_its_id_is_answered(control_plane, tmp_path):
    """The request's thread hands a job that outlives the wait to a task thread; its id is answered only once the
    job is saved, so a SIGKILL right after the reply re-queues it instead of losing it."""
    warm, gate = tmp_path / "warm", tmp_path / "go"
    warm.touch()
    with control_plane.http() as http:
        version = hold_version(http)
        assert (
            run_waiting(http, "hold", version, [{"path": str(warm)}], wait_s=DEADLINE_S)["job"]["job_state"] == "DONE"
        )
        body = run_waiting(http, "hold", version, [{"path": str(gate)}], wait_s=0.3)
        assert body["job"]["job_state"] == "IN_PROGRESS"
    control_plane.kill()
    control_plane.start()
    with control_plane.http() as http:
        assert describe(http, body["job_id"])["job_state"] in ("PENDING", "IN_PROGRESS")  # re-queued, not lost
        gate.touch()
        assert wait_done(http, body["job_id"])["result"] == [str(gate)]


CRASH_SOURCE = """from __future__ import annotations

import os


def crash(path: str) -> str:
    if os.path.exists(path):
        os._exit(3)
    return path
"""


def _warm_hold(http: httpx.Client, tmp_path, name: str = "hold", **options) -> str:
    """A hold version whose worker has run one job and is idle (so the next run is the request's own)."""
    warm = tmp_path / f"{name}-warm"
    warm.touch()
    version = hold_version(http, name, **options)
    assert run_waiting(http, name, version, [{"path": str(warm)}], wait_s=DEADLINE_S)["job"]["job_state"] == "DONE"
    return version


def test_a_job_the_request_runs_can_be_cancelled_and_the_request_answers_at_once(control_plane, tmp_path):
    with control_plane.http() as http:
        version = _warm_hold(http, tmp_path)
        replies: list[dict] = []
        waiting = threading.Thread(
            target=lambda: replies.append(
                run_waiting(http, "hold", version, [{"path": str(tmp_path / "never")}], wait_s=DEADLINE_S)
            )
        )
        waiting.start()
        job = wait_until(lambda: _running(http), "the held job to run")
        assert http.post("/v1/jobs/cancel", json={"job_id": job["job_id"]}).json()["cancelled"] is True
        waiting.join(DEADLINE_S / 2)  # not held for the whole wait
        assert not waiting.is_alive() and replies[0]["job"]["job_state"] == "CANCELLED"
        again = tmp_path / "again"
        again.touch()
        assert run_waiting(http, "hold", version, [{"path": str(again)}], wait_s=DEADLINE_S)["job"]["result"] == [
            str(again)
        ]


def test_a_job_the_request_runs_times_out_on_time(control_plane, tmp_path):
    with control_plane.http() as http:
        version = _warm_hold(http, tmp_path)
        reply = http.post(
            "/v1/functions/run",
            json={
                "name": "hold",
                "version": version,
                "rows": [{"path": str(tmp_path / "never")}],
                "timeout_s": 0.5,
                "wait_s": DEADLINE_S,
            },
            timeout=DEADLINE_S,
        ).json()
        assert reply["job"]["job_state"] == "TIMED_OUT" and reply["job"]["failure"]["phase"] == "timeout"


def test_a_worker_that_dies_under_the_requests_job_fails_it_and_is_replaced(control_plane, tmp_path):
    with control_plane.http() as http:
        version = register(http, text_body("crash", CRASH_SOURCE))["version"]
        assert (
            run_waiting(http, "crash", version, [{"path": str(tmp_path / "no")}], wait_s=DEADLINE_S)["job"]["job_state"]
            == "DONE"
        )
        (tmp_path / "die").touch()
        failed = run_waiting(http, "crash", version, [{"path": str(tmp_path / "die")}], wait_s=DEADLINE_S)["job"]
        assert failed["job_state"] == "FAILED" and failed["failure"]["phase"] == "worker"
        assert "exited with code 3" in failed["failure"]["message"]
        ok = run_waiting(http, "crash", version, [{"path": str(tmp_path / "no")}], wait_s=DEADLINE_S)["job"]
        assert ok["job_state"] == "DONE"


def _running(http: httpx.Client) -> dict | None:
    jobs = http.post("/v1/jobs/list", json={"state": "IN_PROGRESS"}).json()["jobs"]
    return jobs[0] if jobs else None


def test_a_warm_job_longer_than_the_requests_own_follow_is_answered_finished(control_plane, tmp_path):
    """The request's thread follows a job for INLINE_FOLLOW_S at most; the rest of the wait is on the event loop, and
    a job that ends within it still comes back finished in the run reply."""
    from lancefn_jupyter.server.control.intake import INLINE_FOLLOW_S

    gate = tmp_path / "later"
    with control_plane.http() as http:
        version = _warm_hold(http, tmp_path)
        opener = threading.Timer(10 * INLINE_FOLLOW_S, gate.touch)
        opener.start()
        body = run_waiting(http, "hold", version, [{"path": str(gate)}], wait_s=DEADLINE_S)
        opener.join()
        assert body["job"]["job_state"] == "DONE" and body["job"]["result"] == [str(gate)]
