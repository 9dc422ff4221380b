"""A job's GPU use on a real GPU, through NVML (docs/ARCHITECTURE.md, "Cost"): skipped where NVML or a GPU is absent."""

from __future__ import annotations

import os

import pytest

from lancefn_jupyter.kernel.display.timings import job_timings_text
from lancefn_jupyter.wire.models import Job
from lancefn_jupyter.worker.gpustats import GpuSampler


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def test_the_sampler_reads_a_real_gpus_memory_and_utilisation():
    if not _nvml_gpus():
        pytest.skip("no NVML GPU here")
    sampler = GpuSampler(os.getpid(), ["0"])
    assert sampler.start()
    stats = sampler.stop()
    assert set(stats) == {"gpu_memory_peak_bytes", "gpu_util_mean_pct"}
    assert stats["gpu_memory_peak_bytes"] >= 0 and 0 <= stats["gpu_util_mean_pct"] <= 100


def test_without_nvml_or_a_device_nothing_is_sampled():
    sampler = GpuSampler(os.getpid(), ["no-such-gpu-uuid"])
    assert sampler.start() is False
    assert sampler.stop() == {}


@pytest.mark.unit
def test_a_jobs_gpu_use_is_shown_beside_its_cost():
    job = Job.from_wire(
        {
            "job_id": "j",
            "job_type": "run_function",
            "job_state": "DONE",
            "creation_ms": 0,
            "placement": {},
            "progress": {},
            "timings": {"run_ms": 41000, "cold": False},
            "usage": {"held_s": 41, "cost": 0.02, "gpu_memory_peak_bytes": 12 * 2**30, "gpu_util_mean_pct": 85.0},
        }
    )
    assert job_timings_text(job, run=True) == "warm, ran 41.0 s · $0.02 · GPU peak 12.0 GiB, 85 % busy"
