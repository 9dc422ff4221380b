"""The Ray executor's queue of GPU jobs, on a local Ray with one simulated GPU: jobs of one
version queued behind the busy GPU run one after another on the version's ONE warm actor (no
new Ray worker per job), and a job of another version waiting behind them gets its own actor.
Queued jobs stay PENDING until their actor runs them.

One server (and its local Ray) for the module; every wait is bounded; nothing is timed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ControlPlaneProcess, register
from helpers import describe, ray_server, submit, text_body, wait_done, wait_until
from test_ray_cpu_isolation import ANY_CLASS, GATED, SLOW  # a class of one simulated GPU; gated(path) -> its pid

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    with ray_server(tmp_path_factory, ANY_CLASS) as server:
        yield server


def _version(http, comment: str = "") -> str:
    return register(http, text_body("gated", GATED + comment, num_gpus=1, gpu_class="default"))["version"]


def test_queued_jobs_of_one_version_reuse_its_one_actor_and_another_version_gets_its_own(cp, tmp_path):
    gate = tmp_path / "gate"
    with cp.http() as http:
        v1, v2 = _version(http), _version(http, "OTHER = 1  # another version, of another setup part\n")
        first = submit(http, "gated", v1, [{"path": str(gate)}])
        wait_until((tmp_path / "gate.pid").exists, "the first job to hold the GPU", SLOW)
        queued = [submit(http, "gated", v1, [{"path": ""}]) for _ in range(3)]
        other = submit(http, "gated", v2, [{"path": ""}])
        for job_id in (*queued, other):  # behind the busy GPU, not started
            assert describe(http, job_id)["job_state"] == "PENDING"
        gate.touch()
        jobs = [wait_done(http, job_id, SLOW) for job_id in (first, *queued, other)]
        assert [job["job_state"] for job in jobs] == ["DONE"] * 5, jobs
        pids = [job["result"][0] for job in jobs]
        assert pids[0] == (tmp_path / "gate.pid").read_text()
        assert pids[:4] == [pids[0]] * 4  # one actor process ran the version's 4 jobs
        assert pids[4] != pids[0]  # the other version never runs in it
