"""Expected start time of pending jobs (pure; the core feeds it its queues and recent run times).

The estimate replays the scheduler's own rule, strict FIFO per GPU class, over predicted run times:

* a job holding GPUs ends at ``started_ms + expected run time`` (a job already past its expected run
  time is taken to end now; one placed but not yet started counts from now);
* each pending job, in queue order, starts once the GPUs it needs are free and every job ahead of it
  has started;
* a run time is the median of the last ``KEEP`` successful runs of that function version on that class,
  else the median of the class's last ``KEEP`` runs (a new version), else unknown.

When a run time the replay needs is unknown, the job's estimate (and every one behind it) is ``None``:
the placement says "unknown" rather than guess. Benchmarked in ``benchmarks/bench_expected_wait.py``.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["KEEP", "RunTimes", "Holding", "Waiting", "expected_starts", "queue_estimates"]

KEEP = 20  # recent runs per version (and per class) that the median is taken over


class RunTimes:
    """Recent successful run times (ms) per (name, version, class) and per class; bounded memory."""

    def __init__(self, keep: int = KEEP, max_versions: int = 4096):
        self._keep = keep
        self._max_versions = max_versions
        self._by_version: dict[tuple[str, str, str], deque[float]] = {}
        self._by_class: dict[str, deque[float]] = {}

    def record(self, name: str, version: str, gpu_class: str, duration_ms: float) -> None:
        if duration_ms < 0:
            return
        key = (name, version, gpu_class)
        if key not in self._by_version and len(self._by_version) >= self._max_versions:
            self._by_version.pop(next(iter(self._by_version)))  # the oldest-seen version goes first
        self._by_version.setdefault(key, deque(maxlen=self._keep)).append(duration_ms)
        self._by_class.setdefault(gpu_class, deque(maxlen=self._keep)).append(duration_ms)

    def expected_ms(self, name: str, version: str, gpu_class: str) -> Optional[float]:
        """The version's median run time on the class, else the class median, else None."""
        runs = self._by_version.get((name, version, gpu_class)) or self._by_class.get(gpu_class)
        return statistics.median(runs) if runs else None


@dataclass(frozen=True)
class Holding:
    """A job holding GPUs of the class (running, or placed and starting)."""

    job_id: str
    num_gpus: int
    started_ms: Optional[int]  # None: placed, worker not started yet
    expected_ms: Optional[float]


@dataclass(frozen=True)
class Waiting:
    """A pending job in queue order."""

    job_id: str
    num_gpus: int
    expected_ms: Optional[float]


def expected_starts(
    now_ms: int, total_gpus: int, holding: Sequence[Holding], waiting: Sequence[Waiting]
) -> dict[str, Optional[int]]:
    """``{job_id: expected start (epoch ms) or None}`` for every waiting job of one class."""
    free = total_gpus - sum(h.num_gpus for h in holding)
    releases: list[tuple[float, int]] = []  # (time GPUs come free, how many)
    for h in holding:  # a job with an unknown end never frees its GPUs in the replay
        if h.expected_ms is not None:
            heapq.heappush(releases, (max(now_ms, (now_ms if h.started_ms is None else h.started_ms) + h.expected_ms), h.num_gpus))
    result: dict[str, Optional[int]] = {}
    clock = float(now_ms)
    blocked = False
    for job in waiting:
        while not blocked and free < job.num_gpus:
            if not releases:
                blocked = True  # only GPUs with an unknown end (or none) could let it start
                break
            at, gpus = heapq.heappop(releases)
            clock = max(clock, at)
            free += gpus
        if blocked:
            result[job.job_id] = None
            continue
        result[job.job_id] = round(clock)
        free -= job.num_gpus
        if job.expected_ms is not None:
            heapq.heappush(releases, (clock + job.expected_ms, job.num_gpus))
    return result


def queue_estimates(now_ms: int, pools: Sequence, jobs: dict, run_times: RunTimes) -> dict[str, Optional[int]]:
    """`expected_starts` for every GPU class of the scheduler: ``pools`` are its ``ClassPool``s (devices,
    ``held``, FIFO ``queue``), ``jobs`` the core's active ``JobRecord``s by id."""

    def expected(job_id: str, gpu_class: str) -> Optional[float]:
        spec = jobs[job_id].spec if job_id in jobs else {}
        return run_times.expected_ms(spec.get("name", ""), spec.get("version", ""), gpu_class)

    result: dict[str, Optional[int]] = {}
    for pool in pools:
        if not pool.queue:
            continue
        holding = [
            Holding(job_id, len(devices), getattr(jobs.get(job_id), "started_ms", None), expected(job_id, pool.name))
            for job_id, devices in pool.held.items()
        ]
        waiting = [Waiting(job_id, num_gpus, expected(job_id, pool.name)) for job_id, num_gpus in pool.queue.items()]
        result.update(expected_starts(now_ms, len(pool.devices), holding, waiting))
    return result
