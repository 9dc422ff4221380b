"""Words every front end shares. A pending job's queue wording: one function (`cards.queue_text`) for the widget,
`%gpu_jobs` and the dashboards, mirrored by the side panel's `queueText` (labextension/src/format.ts) on the same
cases. A simulated class's model, marked once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lancefn_jupyter.kernel.display import cards
from lancefn_jupyter.kernel.display.jobs import jobs_table
from lancefn_jupyter.wire.models import GpuClass, Job, JobPlacement, JobProgress

pytestmark = pytest.mark.unit

CASES = json.loads((Path(__file__).parents[3] / "labextension/src/__tests__/queue-cases.json").read_text())["cases"]


@pytest.mark.parametrize(("placement", "now_ms", "text"), CASES)
def test_queue_text_words_a_pending_job_as_the_panel_does(placement, now_ms, text):
    assert cards.queue_text(JobPlacement(**placement), now_ms) == text


def pending_job(**placement) -> Job:
    return Job(
        job_id="j1",
        job_type="run_function",
        job_state="PENDING",
        creation_ms=0,
        progress=JobProgress(),
        placement=JobPlacement(**placement),
    )


def test_the_widget_and_gpu_jobs_use_that_wording():
    job = pending_job(queue_position=2, num_gpus=1, expected_start_ms=None, waiting_on_capacity=True)
    assert (
        cards.job_summary(job) == "pending: waiting for GPU capacity in class default, position 2, start time unknown"
    )
    text, _ = jobs_table([job])
    assert "position 2, start time unknown" in text


@pytest.mark.parametrize(
    ("model", "simulated", "text"),
    [
        ("Simulated GPU (numba CUDA simulator)", True, "Simulated GPU (numba CUDA simulator)"),
        ("A100", True, "A100 (simulated)"),
        ("A100", False, "A100"),
    ],
)
def test_a_simulated_class_is_marked_once(model, simulated, text):
    gpu = GpuClass(
        name="default",
        resource_name="nvidia.com/gpu",
        gpu_model=model,
        gpu_memory_bytes=0,
        max_gpu_count_per_worker=1,
        simulated=simulated,
    )
    assert cards.model_text(gpu) == text
    assert cards.gpu_classes_table([gpu])[0].count("imulat") == text.count("imulat")


def test_a_batch_says_about_how_long_and_how_much_is_left_and_what_it_spent():
    """Time left from the rows' rate so far (the expected start's words), cost left from the cost per row so far; a
    batch without prices, or without a chunk ended yet, says what it knows."""
    from helpers import batch_record

    from lancefn_jupyter.kernel.display.batch import batch_summary
    from lancefn_jupyter.wire.batch_models import BatchUsage

    running = {"batch_state": "IN_PROGRESS", "started_ms": 0, "rows_total": 100, "rows_done": 10, "chunks_total": 10}
    counts = {"chunk_counts": {"DONE": 1, "PENDING": 9}}
    now = 40_000  # 10 rows in 40 s: 90 rows left take 6 min
    usage = BatchUsage(held_s=40, gpu_seconds=40, cost=0.05, currency="USD", rows=10)
    assert batch_summary(batch_record(**running, **counts, usage=usage), now).endswith(
        "of 10 chunks · 0.2 rows/s · about 6 min and $0.45 left · $0.05 spent"
    )
    unpriced = usage.model_copy(update={"cost": None, "currency": None})
    assert batch_summary(batch_record(**running, **counts, usage=unpriced), now).endswith("· about 6 min left")
    assert batch_summary(batch_record(**running, **counts), now).endswith("· about 6 min left")
    ended = {**running, "batch_state": "DONE", "finished_ms": 400_000, "rows_done": 100}
    summary = batch_summary(
        batch_record(**ended, chunk_counts={"DONE": 10}, usage=usage.model_copy(update={"cost": 1.5}))
    )
    assert summary == "10 finished of 10 chunks · 0.2 rows/s · $1.50 spent", summary
