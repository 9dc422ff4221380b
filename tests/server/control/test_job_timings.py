"""Job timings (docs/ARCHITECTURE.md, "Warm state"): every job that ran carries ``timings`` in its
replies (describe, wait, list, events), they survive a restart, a job that never started has none,
and a home from before timings opens with its jobs intact."""

from __future__ import annotations

import json
import sqlite3

import httpx
from conftest import register, registration_body
from helpers import DEADLINE_S, describe, hold_version, submit, wait_done, wait_state

from lancefn_jupyter.server.control.callbacks import job_timings
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.wire.models import Job, JobTimings

KEYS = {"queued_ms", "start_ms", "environment_ms", "setup_ms", "run_ms", "cold"}


def _record(**kwargs) -> JobRecord:
    return JobRecord(job_id="j", job_type="run_function", state="DONE", creation_ms=1_000, **kwargs)


def test_timings_take_the_executors_times_and_subtract_the_start_from_the_queue_time():
    rec = _record(started_ms=1_500)
    timings = job_timings(rec, {"start_ms": 120.5, "setup_ms": 300, "run_ms": 42})
    assert timings == {
        "queued_ms": 379.5,
        "start_ms": 120.5,
        "environment_ms": 0.0,
        "setup_ms": 300.0,
        "run_ms": 42.0,
        "cold": True,
    }
    assert JobTimings.from_wire(timings).queued_ms == 379.5


def test_a_warm_job_is_not_cold_and_missing_or_bad_times_count_zero():
    rec = _record(started_ms=1_010)
    assert job_timings(rec, {"run_ms": 5, "setup_ms": float("nan"), "start_ms": -3}) == {
        "queued_ms": 10.0,
        "start_ms": 0.0,
        "environment_ms": 0.0,
        "setup_ms": 0.0,
        "run_ms": 5.0,
        "cold": False,
    }
    assert job_timings(rec, None)["queued_ms"] == 10.0
    # A start longer than the whole wait (clocks of different processes) never goes negative.
    assert job_timings(rec, {"start_ms": 50})["queued_ms"] == 0.0


def test_a_job_that_never_started_has_no_timings():
    assert job_timings(_record(), {"run_ms": 5}) is None


def done_event(cp, job_id: str) -> dict:
    """The job's DONE event, read from the event stream from its start."""
    headers = {**cp.client_headers, "Last-Event-ID": "0"}
    with httpx.stream("GET", cp.url + "/v1/jobs/events", headers=headers, timeout=DEADLINE_S) as reply:
        kind = None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "job":
                data = json.loads(line[6:])
                if data["job_id"] == job_id and data["job_state"] == "DONE":
                    return data
    raise AssertionError("event stream ended early")


def test_finished_jobs_report_timings_everywhere_and_keep_them_across_a_restart(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        version = register(http, registration_body())["version"]
        job_id = submit(http, "double", version, [{"x": 3}])
        done = wait_done(http, job_id)
        assert done["job_state"] == "DONE" and done["result"] == [6]
        timings = done["timings"]
        assert set(timings) == KEYS
        assert timings["environment_ms"] == 0
        expected_queue = max(0, done["started_ms"] - done["creation_ms"] - timings["start_ms"])
        assert timings["queued_ms"] == expected_queue
        assert timings["cold"] == (timings["start_ms"] > 0 or timings["setup_ms"] > 0)
        assert Job.from_wire(done).timings == JobTimings.from_wire(timings)
        assert describe(http, job_id)["timings"] == timings
        listed = http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"]
        assert [j["timings"] for j in listed if j["job_id"] == job_id] == [timings]
        assert done_event(cp, job_id)["timings"] == timings
    cp.restart()
    with cp.http() as http:
        assert describe(http, job_id)["timings"] == timings


def test_a_job_cancelled_while_queued_has_no_timings(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        hold = hold_version(http, "wide", num_gpus=2)
        blocker = submit(http, "wide", hold, [{"path": str(tmp_path / "gate")}])
        wait_state(http, blocker, "IN_PROGRESS")
        queued = submit(http, "wide", hold, [{"path": str(tmp_path / "never")}])
        assert http.post("/v1/jobs/cancel", json={"job_id": queued}).json()["cancelled"] is True
        assert "timings" not in describe(http, queued)
        (tmp_path / "gate").touch()
        assert wait_done(http, blocker)["timings"]["run_ms"] >= 0


def test_a_home_from_before_timings_opens_and_keeps_its_jobs(tmp_path):
    path = tmp_path / "old.sqlite3"
    store = Store(path)
    store.insert_job(_record(started_ms=1_200, finished_ms=1_300))
    store.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE jobs DROP COLUMN timings")  # the jobs table as it was before timings
    db.commit()
    db.close()
    store = Store(path)
    old = store.get_job("j")
    assert old is not None and old.timings is None and old.finished_ms == 1_300
    old.timings = {"queued_ms": 200.0, "cold": False}
    store.update_job(old)
    assert store.get_job("j").timings == {"queued_ms": 200.0, "cold": False}
    store.close()
