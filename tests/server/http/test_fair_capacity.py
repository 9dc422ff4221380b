"""Fair capacity on a real server: two teams on two simulated GPUs, one with `max_gpus` in the key file.

vision fills both GPUs and queues six more jobs; nlp's one job is then next in line (queue_position 1, not 7)
and starts on the first GPU that frees, before vision's queued ones. A team whose key says `max_gpus = 1` holds
one GPU at most, leaving the other to the other team, and a job that asks for more than its cap is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import api_keys_toml, describe, hold_version, submit, wait_done, wait_state

VISION, NLP, CAPPED = "vision-key-00000001", "nlp-key-0000000002", "capped-key-0000003"
ALL = ["functions", "jobs", "system_usage"]
TWO_GPUS = "[[gpu_classes]]\nname = 'default'\nsimulated = 2\nmax_gpu_count_per_worker = 2\n"


@pytest.fixture
def server(control_plane_factory):
    keys = api_keys_toml(
        {"name": "vision", "key": VISION, "namespace": "vision", "privileges": ALL},
        {"name": "nlp", "key": NLP, "namespace": "nlp", "privileges": ALL},
        {"name": "capped", "key": CAPPED, "namespace": "capped", "privileges": ALL, "max_gpus": 1},
    )
    return control_plane_factory(gpu_classes=TWO_GPUS, api_keys=keys)


def test_another_teams_job_is_next_not_behind_a_long_queue(server, tmp_path: Path):
    gate = lambda name: str(tmp_path / name)  # noqa: E731
    with server.http(VISION, timeout=60.0) as vision, server.http(NLP, timeout=60.0) as nlp:
        hv = hold_version(vision)
        hn = hold_version(nlp)
        running = [submit(vision, "hold", hv, [{"path": gate(f"v{i}")}]) for i in range(2)]
        for job in running:
            wait_state(vision, job, "IN_PROGRESS")
        queued = [submit(vision, "hold", hv, [{"path": gate(f"q{i}")}]) for i in range(6)]
        theirs = submit(nlp, "hold", hn, [{"path": gate("n0")}])
        assert describe(nlp, theirs)["placement"]["queue_position"] == 1
        assert [describe(vision, j)["placement"]["queue_position"] for j in queued] == [2, 3, 4, 5, 6, 7]

        Path(gate("v0")).touch()  # one GPU frees: nlp's job takes it, vision's queue waits
        wait_done(vision, running[0])
        started = wait_state(nlp, theirs, "IN_PROGRESS")
        assert len(started["placement"]["devices"]) == 1
        assert describe(vision, queued[0])["job_state"] == "PENDING"
        assert describe(vision, queued[0])["placement"]["queue_position"] == 1

        for path in ["v1", "n0", *(f"q{i}" for i in range(6))]:
            Path(gate(path)).touch()
        for job in [running[1], *queued]:
            assert wait_done(vision, job)["job_state"] == "DONE"
        assert wait_done(nlp, theirs)["job_state"] == "DONE"


def test_max_gpus_caps_what_a_team_holds_and_refuses_more(server, tmp_path: Path):
    with server.http(CAPPED, timeout=60.0) as capped, server.http(NLP, timeout=60.0) as nlp:
        hc = hold_version(capped)
        first, second = (submit(capped, "hold", hc, [{"path": str(tmp_path / f"c{i}")}]) for i in range(2))
        wait_state(capped, first, "IN_PROGRESS")
        waiting = describe(capped, second)
        assert waiting["job_state"] == "PENDING"  # a GPU is free, but the team is at its cap
        hn = hold_version(nlp)
        theirs = submit(nlp, "hold", hn, [{"path": str(tmp_path / "n")}])
        wait_state(nlp, theirs, "IN_PROGRESS")  # the other GPU is the other team's

        two = hold_version(capped, name="hold2", num_gpus=2)
        reply = capped.post("/v1/functions/run", json={"name": "hold2", "version": two, "rows": [{"path": "x"}]})
        assert reply.status_code == 400
        assert "max_gpus = 1" in reply.json()["error"]["message"]

        (tmp_path / "c0").touch()
        wait_done(capped, first)
        wait_state(capped, second, "IN_PROGRESS")
        for name in ("c1", "n"):
            (tmp_path / name).touch()
        assert wait_done(capped, second)["job_state"] == "DONE"
        assert wait_done(nlp, theirs)["job_state"] == "DONE"
