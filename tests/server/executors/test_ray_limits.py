"""Limits on the Ray executor, one server for the module: the server's maximum job run time (docs/ARCHITECTURE.md,
"Scheduling": a job without ``timeout_s`` gets ``--max-job-run-s``, enforced by the Ray bridge's deadline as
``timeout_s`` is, its TIMED_OUT message naming the flag; a batch's chunks too) and a namespace's daily budget
("Budgets": past it, its new jobs are held back from Ray's queue saying why; another namespace's run on)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ControlPlaneProcess
from helpers import api_keys_toml, describe, hold_version, module_ray_server, submit, wait_done, wait_until

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

KEY_A, KEY_B = "team-a-key-0001-aaaa", "team-b-key-0001-bbbb"
# 0.18 GPU-seconds a day: a's first job (its actor's start counts: "Cost") uses it up
KEYS = api_keys_toml(
    {"name": "a", "key": KEY_A, "privileges": ["functions", "jobs"], "max_gpu_hours_per_day": 0.00005},
    {"name": "b", "key": KEY_B, "privileges": ["functions", "jobs"]},
)


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    keys = tmp_path_factory.mktemp("keys") / "api_keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    with module_ray_server(tmp_path_factory, "--max-job-run-s", "2", "--api-keys", str(keys)) as server:
        yield server


def test_a_ray_job_without_timeout_ends_timed_out_at_the_servers_maximum_run_time(cp, tmp_path):
    never = str(tmp_path / "never")  # the hold waits for it for ever
    with cp.http(timeout=60.0) as http:
        version = hold_version(http, gpu_class="small")
        # Ray's own start (a busy machine: a minute or more) comes first: the job waits for it, PENDING.
        job = wait_done(http, submit(http, "hold", version, [{"path": never}]), timeout=180)
        assert job["job_state"] == "TIMED_OUT" and job["failure"]["phase"] == "timeout", job
        assert "maximum job run time of 2 s (--max-job-run-s)" in job["failure"]["message"]
        create = {"name": "hold", "version": version, "chunks": [[{"path": never}]], "fresh": True}
        batch_id = http.post("/v1/batches/create", json=create).json()["batch_id"]
        batch = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=90).json()
        assert batch["batch_state"] == "FAILED", batch
        assert "maximum job run time of 2 s (--max-job-run-s)" in batch["failure"]["message"]


def test_past_its_budget_a_namespaces_new_ray_jobs_are_held_back_saying_why(cp, tmp_path):
    there = tmp_path / "there"
    there.touch()  # the hold returns at once
    with cp.http(KEY_A, timeout=60.0) as a, cp.http(KEY_B, timeout=60.0) as b:
        version_a, version_b = hold_version(a, gpu_class="small"), hold_version(b, gpu_class="small")
        spent = wait_done(a, submit(a, "hold", version_a, [{"path": str(there)}]), timeout=180)
        assert spent["job_state"] == "DONE" and spent["usage"]["gpu_seconds"] > 0.18, spent
        waiting = submit(a, "hold", version_a, [{"path": str(there)}])
        placement = wait_until(
            lambda: (p := describe(a, waiting)["placement"]).get("pending_reason") and p, "the budget's reason"
        )
        other = wait_done(b, submit(b, "hold", version_b, [{"path": str(there)}]), timeout=180)
        still = describe(a, waiting)
        cancelled = a.post("/v1/jobs/cancel", json={"job_id": waiting}).json()
    reason = placement["pending_reason"]
    assert reason.startswith("over budget: namespace 'a' used "), reason
    assert "GPU-hours today (max_gpu_hours_per_day); new jobs wait until it resets at 00:00 UTC (in " in reason
    assert other["job_state"] == "DONE"  # another namespace is not held up
    assert still["job_state"] == "PENDING"  # held back while b's job ran: never handed to Ray
    assert cancelled["cancelled"] is True
