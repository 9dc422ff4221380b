"""Warm placement over real HTTP with the real local executor (docs/ARCHITECTURE.md, "Warm state"):
a job goes to the devices whose idle worker already holds its version, not the lowest free ones."""

from __future__ import annotations

from conftest import register, registration_body
from helpers import hold_version, submit, wait_done, wait_state


def test_a_job_runs_on_the_devices_whose_idle_worker_holds_its_version(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        hold = hold_version(http, "blocker")
        double = register(http, registration_body())["version"]
        blocker = submit(http, "blocker", hold, [{"path": str(tmp_path / "gate")}])
        lowest = wait_state(http, blocker, "IN_PROGRESS")["placement"]["devices"]
        first = wait_done(http, submit(http, "double", double, [{"x": 1}]))
        warm_devices = first["placement"]["devices"]
        assert first["result"] == [2] and warm_devices != lowest
        (tmp_path / "gate").touch()
        assert wait_done(http, blocker)["job_state"] == "DONE"
        # Both devices are free now; the lowest is the blocker's, the other holds double's worker.
        again = wait_done(http, submit(http, "double", double, [{"x": 2}]))
        assert again["result"] == [4]
        assert again["placement"]["devices"] == warm_devices
        assert again["timings"]["start_ms"] == 0 and again["timings"]["setup_ms"] == 0
        assert again["timings"]["cold"] is False
