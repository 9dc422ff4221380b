"""A job's GPU use on a real GPU (docs/ARCHITECTURE.md, "Cost"): its worker's peak GPU memory and the GPUs' mean
utilisation while it ran, sampled through NVML (``nvidia-ml-py``, imported lazily) on a thread of the parent's. No
NVML, no real GPU (a simulated class): nothing sampled. Standard library only at top level."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["INTERVAL_S", "GpuSampler"]

INTERVAL_S = 0.5  # a sample every half second: a quick job gets its first at its start


class GpuSampler:
    """Samples the GPUs ``devices`` (CUDA indices or UUIDs) for the worker ``pid`` from :meth:`start` to :meth:`stop`."""

    def __init__(self, pid: int, devices: Sequence[str]) -> None:
        self.pid, self.devices = pid, tuple(devices)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.peak_bytes = 0
        self._util_sum = 0.0
        self._samples = 0

    def start(self) -> bool:
        """Begin sampling; False (nothing sampled) where NVML or the devices cannot be opened."""
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(d)
                for d in self.devices
            ]
        except Exception:  # no library, no driver, a device gone: no figures, the job runs on
            return False
        self._nvml = pynvml
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="lancefn-gpu-stats", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
        nvml, used = self._nvml, 0
        try:
            for handle in self._handles:
                for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid == self.pid and process.usedGpuMemory:
                        used += int(process.usedGpuMemory)
                self._util_sum += float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                self._samples += 1
        except Exception:  # a sample that fails is left out
            return
        self.peak_bytes = max(self.peak_bytes, used)

    def stop(self) -> dict[str, float]:
        """Stop sampling; ``{"gpu_memory_peak_bytes", "gpu_util_mean_pct"}`` (empty when nothing was sampled)."""
        if self._nvml is None:
            return {}
        self._sample()  # the last look, at the job's end
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        if not self._samples:
            return {}
        return {"gpu_memory_peak_bytes": self.peak_bytes, "gpu_util_mean_pct": round(self._util_sum / self._samples, 1)}
