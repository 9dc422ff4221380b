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
