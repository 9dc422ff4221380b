"""The server's maximum job run time on the Ray executor (docs/ARCHITECTURE.md, "Scheduling"): a job without
``timeout_s`` gets ``--max-job-run-s``, enforced by the Ray bridge's deadline as ``timeout_s`` is, its TIMED_OUT
message naming the flag; a batch's chunks too."""

from __future__ import annotations

import pytest
from helpers import hold_version, module_ray_server, submit, wait_done

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_a_ray_job_without_timeout_ends_timed_out_at_the_servers_maximum_run_time(tmp_path_factory, tmp_path):
    never = str(tmp_path / "never")  # the hold waits for it for ever
    with module_ray_server(tmp_path_factory, "--max-job-run-s", "2") as cp, cp.http(timeout=60.0) as http:
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
