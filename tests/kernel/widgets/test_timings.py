"""Cold and warm are visible (issue 24): the words for `Job.timings` and where they show — the job widget,
`%gpu_jobs` (table and dashboard), a `Job` handle's repr.

Pure: jobs are wire `Job` models (as the control plane sends them once a job ended on a worker); widgets
get a listener that is never started, so nothing here needs a server.
"""

from __future__ import annotations

import json
from pathlib import Path

import ipywidgets
import pytest

import lancefn_jupyter.kernel.listings as listings
import lancefn_jupyter.kernel.session as session_module
from lancefn_jupyter.kernel.client import LancefnError
from lancefn_jupyter.kernel.client.events import Event
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display.jobs import JOBS_COLUMNS, job_card, jobs_table
from lancefn_jupyter.kernel.display.timings import format_ms, job_timings_text, timings_breakdown, timings_text
from lancefn_jupyter.kernel.handles.job import Job as JobHandle
from lancefn_jupyter.kernel.widgets import JobsDashboard, JobWidget, stop_listener
from lancefn_jupyter.wire.models import Job, JobTimings

pytestmark = pytest.mark.unit

COLD = {"queued_ms": 15.0, "start_ms": 1234.0, "setup_ms": 1000.0, "run_ms": 12.3, "cold": True}
WARM = {"queued_ms": 2.0, "run_ms": 12.3}  # zeros and `cold: false` are omitted on the wire


def wire_job(job_id="j-1", state="DONE", timings=None, **extra) -> Job:
    data = {
        "job_id": job_id,
        "job_type": "run_function",
        "job_state": state,
        "creation_ms": 1_000,
        "started_ms": 1_100 if state != "PENDING" else None,
        "finished_ms": 1_500 if state in ("DONE", "FAILED") else None,
        "spec": {"name": "score", "version": "5c1e2f3a4b5c"},
        "placement": {"gpu_class": "default", "num_gpus": 1, "devices": ["sim0"]},
        "progress": {"rows_done": 1, "rows_total": 1},
        **extra,
    }
    if timings is not None:
        data["timings"] = timings
    return Job.from_wire(data)


@pytest.fixture
def quiet_listener():
    """A listener that is never started: what widgets subscribe to here. No kernel listener survives."""
    stop_listener()
    session_module._listener = None
    yield EventListener(lambda: None)
    stop_listener()
    session_module._listener = None
    ipywidgets.Widget.close_all()


# ------------------------------------------------------------------------------ words


# Shared with the panel's formatter (labextension/src/__tests__/timings.spec.ts): both must say the same.
CASES = json.loads((Path(__file__).parents[3] / "labextension/src/__tests__/timings-cases.json").read_text())


@pytest.mark.parametrize(("ms", "text"), [*CASES["format_ms"], (float("nan"), "0 ms"), (float("inf"), "0 ms")])
def test_durations_use_ms_under_a_second_then_s_min_h_with_one_decimal(ms, text):
    # Rounded half up (12.5 → "13 ms"); never "1000 ms", "60.0 s" or "60.0 min".
    assert format_ms(ms) == text


@pytest.mark.parametrize(("timings", "text", "with_run"), CASES["timings"])
def test_timings_say_cold_with_the_parts_paid_or_warm(timings, text, with_run):
    model = JobTimings.from_wire(timings)
    assert timings_text(model) == text
    assert timings_text(model, run=True) == with_run
    assert job_timings_text(wire_job(timings=timings)) == text


@pytest.mark.parametrize(("timings", "text"), CASES["breakdown"])
def test_breakdown_names_every_phase_for_tooltips(timings, text):
    assert timings_breakdown(JobTimings.from_wire(timings)) == text


def test_no_timings_show_nothing():
    assert timings_text(None) == timings_text(None, run=True) == timings_breakdown(None) == ""
    assert job_timings_text(wire_job(state="IN_PROGRESS")) == ""
    assert job_timings_text(object()) == ""  # a model from before timings


# ------------------------------------------------------------------------------ where they show


def test_job_widget_shows_cold_or_warm_once_the_job_ended(quiet_listener):
    cold = JobWidget("j-1", client=object(), snapshot=wire_job(timings=COLD), listener=quiet_listener, start=False)
    assert "cold start 1.2 s, setup 1.0 s, ran 12 ms" in cold.timings.value
    assert "queued 15 ms · start 1.2 s" in cold.timings.value  # the tooltip
    assert cold.timings.layout.display is None
    assert cold.timings in cold.children
    assert "cold start 1.2 s, setup 1.0 s, ran 12 ms" in repr(cold)  # the text fallback too

    warm = JobWidget(
        "j-2", client=object(), snapshot=wire_job("j-2", timings=WARM), listener=quiet_listener, start=False
    )
    assert ">warm, ran 12 ms<" in warm.timings.value


def test_job_widget_shows_nothing_until_timings_arrive_then_the_event_shows_them(quiet_listener):
    running = wire_job("j-3", state="IN_PROGRESS")
    widget = JobWidget("j-3", client=object(), snapshot=running, listener=quiet_listener, start=False)
    assert widget.timings.value == "" and widget.timings.layout.display == "none"
    done = wire_job("j-3", timings={"setup_ms": 40.0, "run_ms": 2.0, "cold": True}).to_wire()
    quiet_listener._dispatch(Event(event="job", data=done, id=1))  # the control plane's event once it ended
    assert widget.state == "finished"
    assert ">setup 40 ms, ran 2 ms<" in widget.timings.value and widget.timings.layout.display is None


def test_failed_job_shows_what_it_paid_before_failing(quiet_listener):
    failure = {"phase": "setup", "message": "ValueError: no weights", "retryable": False}
    job = wire_job("j-4", state="FAILED", failure=failure, timings={"start_ms": 900.0, "setup_ms": 5.0, "cold": True})
    widget = JobWidget("j-4", client=object(), snapshot=job, listener=quiet_listener, start=False)
    assert ">cold start 900 ms, setup 5 ms<" in widget.timings.value
    assert "no weights" in widget.error.value


def test_gpu_jobs_table_has_a_start_column(monkeypatch):
    jobs = [
        wire_job("j-cold", timings=COLD),
        wire_job("j-warm", timings=WARM),
        wire_job("j-running", state="IN_PROGRESS"),
    ]
    text, markup = jobs_table(jobs)
    lines = text.splitlines()
    assert lines[0] == "GPU jobs" and "start" in lines[1].split()
    start = lines[1].index("start")
    by_id = {line.split()[0]: line for line in lines[2:]}
    assert by_id["j-cold"][start:].startswith("cold start 1.2 s, setup 1.0 s")
    assert by_id["j-warm"][start:].split("  ")[0] == "warm"
    assert by_id["j-running"][start : start + 5].strip() == ""  # nothing shown without timings
    assert "<td style='padding:2px 8px'>cold start 1.2 s, setup 1.0 s</td>" in markup
    assert len(JOBS_COLUMNS) == markup.count("<th ")

    class Jobs:
        def list(self, **_kwargs):
            return jobs

    class Batches:
        def list(self, **_kwargs):
            raise LancefnError("no batches here")

    class Client:
        jobs, batches = Jobs(), Batches()

    monkeypatch.setattr(listings, "current_client", lambda: Client())
    listed = listings.list_jobs()
    assert repr(listed) == text  # what %gpu_jobs shows without widgets


def test_jobs_dashboard_rows_say_cold_or_warm(quiet_listener):
    jobs = [wire_job("j-cold", timings=COLD), wire_job("j-warm", timings=WARM), wire_job("j-new", state="PENDING")]
    dashboard = JobsDashboard(jobs=jobs, client=object(), listener=quiet_listener, start=False)
    cold, warm, new = (dashboard.rows[j].detail_cell.value for j in ("j-cold", "j-warm", "j-new"))
    assert "· cold start 1.2 s, setup 1.0 s</span>" in cold and "title='queued 15 ms · start 1.2 s" in cold
    assert "· warm</span>" in warm
    assert "cold" not in new and "warm" not in new and "title=" not in new
    assert "cold start 1.2 s, setup 1.0 s" in dashboard._fallback()[0]


def test_job_handle_timings_and_repr(quiet_listener):
    done = JobHandle("j-cold", client=object(), snapshot=wire_job("j-cold", timings=COLD))
    assert done.timings == JobTimings.from_wire(COLD) and done.timings.cold
    assert repr(done).endswith(" · cold start 1.2 s, setup 1.0 s, ran 12 ms")
    legacy = JobHandle("j-old", client=object(), snapshot=wire_job("j-old"))  # a server before timings
    assert legacy.timings is None and "cold" not in repr(legacy) and "warm" not in repr(legacy)
    text, markup = job_card(wire_job("j-warm", timings=WARM))
    assert text.endswith(" · warm, ran 12 ms") and "lancefn-job-timings'>warm, ran 12 ms<" in markup
