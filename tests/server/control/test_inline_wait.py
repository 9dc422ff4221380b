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
from helpers import DEADLINE_S, describe, hold_version, submit, wait_done, wait_state

from lancefn_jupyter import api
from lancefn_jupyter.client import Client
from lancefn_jupyter.session import _session as kernel_session  # tests reset the kernel's state
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
