"""A shared server's limits over real HTTP (docs/ARCHITECTURE.md, "Scheduling", "Batches"): the longest a job may
run (``--max-job-run-s``: a job without ``timeout_s`` gets it and ends TIMED_OUT naming it, a longer ``timeout_s``
is refused), and each namespace's quotas on unfinished jobs, batches and their chunks (429 naming the count and the
flag; nothing of the refused request kept; the other namespace unaffected; room again once work finishes).

Jobs that must keep running wait for a file the test creates (or never creates), so nothing depends on timing."""

from __future__ import annotations

import inspect
import subprocess

import httpx
import pytest
from conftest import register, registration_body
from helpers import DEADLINE_S, gated, hold_version, submit, two_teams, wait_done

A_KEY, B_KEY = "limits-team-a-key-0001", "limits-team-b-key-0002"
KEYS = two_teams(A_KEY, B_KEY)


def _gate_version(http: httpx.Client) -> str:
    body = registration_body(
        "gate",
        source=inspect.getsource(gated),
        entrypoint="gated",
        inputs=(("path", "utf8", False), ("value", "int64", False)),
        num_gpus=1,
    )
    return register(http, body)["version"]


def _chunks(gate: str, sizes: list[int]) -> list[list[dict]]:
    return [[{"path": gate, "value": v} for v in range(size)] for size in sizes]


def _create(http: httpx.Client, version: str, chunks: list, **options) -> httpx.Response:
    """A new batch (``fresh``: the same chunks twice are two batches, not a resume)."""
    body = {"name": "gate", "version": version, "chunks": chunks, "fresh": True, **options}
    return http.post("/v1/batches/create", json=body)


def _batch_ended(http: httpx.Client, batch_id: str) -> dict:
    reply = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": DEADLINE_S}, timeout=DEADLINE_S + 10)
    batch = reply.json()
    assert batch["batch_state"] in ("DONE", "FAILED", "CANCELLED"), batch
    return batch


def _refused(reply: httpx.Response, status: int, *parts: str) -> None:
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    if status == 429:  # a namespace's quota, not a client's cap ("REST details")
        assert reply.json()["error"]["code"] == "quota_exceeded", reply.text
    for part in parts:
        assert part in message, message


def test_a_job_without_timeout_ends_timed_out_at_the_servers_maximum_run_time_naming_it(
    control_plane_factory, tmp_path
):
    cp = control_plane_factory(api_keys=KEYS, args=["--max-job-run-s", "2"])
    never = str(tmp_path / "never")  # the hold and the gate wait for it for ever
    with cp.http(A_KEY) as a:
        hold, gate = hold_version(a), _gate_version(a)
        endless = submit(a, "hold", hold, [{"path": never}])
        batch = _create(a, gate, _chunks(never, [1])).json()["batch_id"]
        job = wait_done(a, endless)
        assert job["job_state"] == "TIMED_OUT" and job["failure"]["phase"] == "timeout", job
        assert "maximum job run time of 2 s (--max-job-run-s)" in job["failure"]["message"]
        chunk = _batch_ended(a, batch)
        assert chunk["batch_state"] == "FAILED" and chunk["chunk_counts"] == {"FAILED": 1}, chunk
        assert "maximum job run time of 2 s (--max-job-run-s)" in chunk["failure"]["message"]
        # A timeout_s within the limit is the job's own, as before.
        own = wait_done(a, submit(a, "hold", hold, [{"path": never}], timeout_s=1))
        assert own["job_state"] == "TIMED_OUT" and "its timeout of 1 s" in own["failure"]["message"], own
        # A longer one is refused at submit, naming the limit and its flag; nothing of it is kept.
        jobs = len(a.post("/v1/jobs/list", json={}).json()["jobs"])
        too_long = ("timeout_s=3 is longer than this server's maximum job run time of 2 s", "(--max-job-run-s)")
        run = {"name": "hold", "version": hold, "rows": [{"path": never}], "timeout_s": 3}
        _refused(a.post("/v1/functions/run", json=run), 400, *too_long)
        _refused(_create(a, gate, _chunks(never, [1]), timeout_s=3), 400, *too_long)
        assert len(a.post("/v1/jobs/list", json={}).json()["jobs"]) == jobs
        assert len(a.post("/v1/batches/list", json={}).json()["batches"]) == 1


def test_quotas_refuse_a_namespaces_jobs_batches_and_chunks_past_them_and_accept_again_once_work_finishes(
    control_plane_factory, tmp_path
):
    cp = control_plane_factory(
        api_keys=KEYS,
        args=[
            "--max-queued-jobs-per-namespace",
            "2",
            "--max-batches-per-namespace",
            "2",
            "--max-queued-chunks-per-namespace",
            "3",
        ],
    )
    jobs_gate, batches_gate = str(tmp_path / "jobs"), str(tmp_path / "batches")
    with cp.http(A_KEY) as a, cp.http(B_KEY) as b, cp.http() as admin:
        hold, gate = hold_version(a), _gate_version(a)
        held = [submit(a, "hold", hold, [{"path": jobs_gate}]) for _ in range(2)]
        run = {"name": "hold", "version": hold, "rows": [{"path": jobs_gate}]}
        full = ("namespace 'a' has 2 unfinished jobs", "(--max-queued-jobs-per-namespace 2)")
        _refused(a.post("/v1/functions/run", json=run), 429, *full)
        _refused(a.post("/v1/functions/run", json={**run, "wait_s": 1}), 429, *full)
        _refused(admin.post("/v1/functions/run", json={**run, "namespace": "a"}), 429, *full)  # the admin too
        # A batch's chunks are its batch's: the jobs quota does not stop them.
        first = _create(a, gate, _chunks(batches_gate, [1, 1]))
        assert first.status_code == 202, first.text
        _refused(
            _create(a, gate, _chunks(batches_gate, [1, 1])),
            429,
            "namespace 'a' has 2 chunks in unfinished batches and backfills; 2 more would pass the limit of 3",
            "(--max-queued-chunks-per-namespace)",
        )
        second = _create(a, gate, _chunks(batches_gate, [1]))
        assert second.status_code == 202, second.text
        _refused(
            _create(a, gate, _chunks(batches_gate, [1])),
            429,
            "namespace 'a' has 2 unfinished batches and backfills",
            "(--max-batches-per-namespace 2)",
        )
        assert len(a.post("/v1/batches/list", json={}).json()["batches"]) == 2  # nothing of the refused kept
        assert len(a.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"]) == 2 + 3
        # The other namespace is not held by a's quotas.
        other_hold, other_gate = hold_version(b), _gate_version(b)
        theirs = [submit(b, "hold", other_hold, [{"path": jobs_gate}]) for _ in range(2)]
        assert _create(b, other_gate, _chunks(batches_gate, [1, 1, 1])).status_code == 202
        # Once a's work finishes, it has room again.
        (tmp_path / "jobs").touch()
        (tmp_path / "batches").touch()
        for job_id in held:
            assert wait_done(a, job_id)["job_state"] == "DONE"
        for job_id in theirs:
            assert wait_done(b, job_id)["job_state"] == "DONE"
        for reply in (first, second):
            assert _batch_ended(a, reply.json()["batch_id"])["batch_state"] == "DONE"
        assert wait_done(a, submit(a, "hold", hold, [{"path": jobs_gate}]))["job_state"] == "DONE"
        again = _create(a, gate, _chunks(batches_gate, [3]))
        assert again.status_code == 202, again.text
        assert _batch_ended(a, again.json()["batch_id"])["batch_state"] == "DONE"


def test_a_retry_that_makes_a_finished_batch_unfinished_again_counts_in_the_quota(control_plane_factory, tmp_path):
    cp = control_plane_factory(api_keys=KEYS, args=["--max-batches-per-namespace", "1"])
    failing, waiting = tmp_path / "failing", tmp_path / "waiting"
    failing.touch()  # its row (-1) fails at once until failing.fixed exists
    with cp.http(A_KEY) as a:
        gate = _gate_version(a)
        failed = _create(a, gate, [[{"path": str(failing), "value": -1}]]).json()["batch_id"]
        assert _batch_ended(a, failed)["batch_state"] == "FAILED"
        running = _create(a, gate, _chunks(str(waiting), [1]))
        assert running.status_code == 202, running.text
        retry = a.post("/v1/batches/retry", json={"batch_id": failed})
        _refused(retry, 429, "namespace 'a' has 1 unfinished batches and backfills", "(--max-batches-per-namespace 1)")
        assert a.post("/v1/batches/describe", json={"batch_id": failed}).json()["batch_state"] == "FAILED"
        waiting.touch()
        assert _batch_ended(a, running.json()["batch_id"])["batch_state"] == "DONE"
        (tmp_path / "failing.fixed").touch()
        assert a.post("/v1/batches/retry", json={"batch_id": failed}).status_code == 200
        assert _batch_ended(a, failed)["batch_state"] == "DONE"


def test_a_shared_server_limits_run_time_to_a_day_by_default_and_keeps_timeouts_within_it(control_plane_factory):
    cp = control_plane_factory(api_keys=KEYS)
    with cp.http(A_KEY) as a:
        version = register(a, registration_body())["version"]
        run = {"name": "double", "version": version, "rows": [{"x": 2}]}
        _refused(
            a.post("/v1/functions/run", json={**run, "timeout_s": 86401}),
            400,
            "maximum job run time of 86400 s (--max-job-run-s)",
        )
        ok = a.post("/v1/functions/run", json={**run, "timeout_s": 86400})
        assert ok.status_code == 202, ok.text
        assert wait_done(a, ok.json()["job_id"])["result"] == [4]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-job-run-s", "-1"], {}, "--max-job-run-s must be a number of seconds >= 0, 0 for no limit (got '-1')"),
        (["--max-job-run-s", "nan"], {}, "--max-job-run-s must be a number of seconds >= 0"),
        (["--max-queued-chunks-per-namespace", "1.5"], {}, "--max-queued-chunks-per-namespace must be a whole number"),
        ([], {"LANCEFN_MAX_BATCHES_PER_NAMESPACE": "many"}, "LANCEFN_MAX_BATCHES_PER_NAMESPACE must be a whole number"),
    ],
)
def test_a_bad_limit_refuses_to_start_saying_what_it_must_be(control_plane_factory, args, env, message):
    cp = control_plane_factory(args=args, env=env, start=False)
    done = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
