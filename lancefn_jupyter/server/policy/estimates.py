"""Expected start time of pending jobs (pure; the reports feed it its queues and recent run times).

The estimate replays the scheduler's own rule, strict FIFO per GPU class, over predicted run times:

* a job holding GPUs ends at ``started_ms + expected run time`` (a job already past its expected run
  time is taken to end now; one placed but not yet started counts from now);
* each pending job, in queue order, starts once the GPUs it needs are free and every job ahead of it
  has started;
* a run time is the median of the last ``KEEP`` successful runs of that function version on that class,
  else the median of the class's last ``KEEP`` runs (a new version), else unknown;
* a run is recorded warm (``warm_run_ms``): its duration less the worker start and setup it paid, so one
  cold job does not push back the expected start of the warm jobs behind it (docs/ARCHITECTURE.md, "Warm state").

When a run time the replay needs is unknown, the job's estimate (and every one behind it) is ``None``:
the placement says "unknown" rather than guess. Benchmarked in ``benchmarks/bench_expected_wait.py``.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

__all__ = [
    "KEEP",
    "ClassReplay",
    "Holding",
    "QueueEstimator",
    "RunTimes",
    "Waiting",
    "expected_starts",
    "warm_run_ms",
]

KEEP = 20  # recent runs per version (and per class) that the median is taken over


def warm_run_ms(started_ms: int, finished_ms: int, timings: Mapping[str, Any] | None) -> float:
    """A finished job's run time as a warm worker would take it: started → finished less the
    ``start_ms`` and ``setup_ms`` of its ``timings`` (a job without timings: its whole duration)."""
    paid = 0.0
    if timings:
        paid = float(timings.get("start_ms") or 0.0) + float(timings.get("setup_ms") or 0.0)
    return max(0.0, finished_ms - started_ms - paid)


class RunTimes:
    """Recent successful run times (ms) per (name, version, class) and per class; bounded memory."""

    def __init__(self, keep: int = KEEP, max_versions: int = 4096):
        self._keep = keep
        self._max_versions = max_versions
        self._by_version: dict[tuple[str, str, str], deque[float]] = {}
        self._by_class: dict[str, deque[float]] = {}
        # Medians are kept up to date on record: the replay reads them for every queued job.
        self._version_median: dict[tuple[str, str, str], float] = {}
        self._class_median: dict[str, float] = {}

    def record(self, name: str, version: str, gpu_class: str, duration_ms: float) -> None:
        if duration_ms < 0:
            return
        key = (name, version, gpu_class)
        if key not in self._by_version and len(self._by_version) >= self._max_versions:
            oldest = next(iter(self._by_version))  # the oldest-seen version goes first
            del self._by_version[oldest], self._version_median[oldest]
        runs = self._by_version.setdefault(key, deque(maxlen=self._keep))
        runs.append(duration_ms)
        self._version_median[key] = statistics.median(runs)
        class_runs = self._by_class.setdefault(gpu_class, deque(maxlen=self._keep))
        class_runs.append(duration_ms)
        self._class_median[gpu_class] = statistics.median(class_runs)

    def expected_ms(self, name: str, version: str, gpu_class: str) -> float | None:
        """The version's median run time on the class, else the class median, else None."""
        median = self._version_median.get((name, version, gpu_class))
        return median if median is not None else self._class_median.get(gpu_class)


@dataclass(frozen=True)
class Holding:
    """A job holding GPUs of the class (running, or placed and starting)."""

    job_id: str
    num_gpus: int
    started_ms: int | None  # None: placed, worker not started yet
    expected_ms: float | None


@dataclass(frozen=True)
class Waiting:
    """A pending job in queue order."""

    job_id: str
    num_gpus: int
    expected_ms: float | None


class ClassReplay:
    """The replay of one class, extended job by job in queue order (a job appended to the queue costs
    O(log GPUs), not a replay of everything ahead of it)."""

    def __init__(self, now_ms: int, total_gpus: int, holding: Sequence[Holding]):
        self.created_ms = now_ms
        self.free = total_gpus - sum(h.num_gpus for h in holding)
        self.releases: list[tuple[float, int]] = []  # (time GPUs come free, how many)
        for h in holding:  # a job with an unknown end never frees its GPUs in the replay
            if h.expected_ms is not None:
                start = now_ms if h.started_ms is None else h.started_ms
                heapq.heappush(self.releases, (max(now_ms, start + h.expected_ms), h.num_gpus))
        self.clock = float(now_ms)
        self.blocked = False  # only GPUs with an unknown end are left: everyone from here is unknown
        self.starts: dict[str, int | None] = {}

    def extend(self, job_id: str, num_gpus: int, expected_ms: float | None) -> None:
        """The next queued job (plain arguments: this runs for every queued job the reports show)."""
        while not self.blocked and self.free < num_gpus:
            if not self.releases:
                self.blocked = True
                break
            at, gpus = heapq.heappop(self.releases)
            self.clock = max(self.clock, at)
            self.free += gpus
        if self.blocked:
            self.starts[job_id] = None
            return
        self.starts[job_id] = round(self.clock)
        self.free -= num_gpus
        if expected_ms is not None:
            heapq.heappush(self.releases, (self.clock + expected_ms, num_gpus))


def expected_starts(
    now_ms: int, total_gpus: int, holding: Sequence[Holding], waiting: Sequence[Waiting]
) -> dict[str, int | None]:
    """``{job_id: expected start (epoch ms) or None}`` for every waiting job of one class."""
    replay = ClassReplay(now_ms, total_gpus, holding)
    for job in waiting:
        replay.extend(job.job_id, job.num_gpus, job.expected_ms)
    return replay.starts


class QueueEstimator:
    """The control plane's expected starts: one replay per class, kept while only jobs join the queue's tail.

    ``invalidate()`` is due whenever jobs start, finish, are cancelled or placed (the machine calls it);
    a replay older than ``refresh_ms`` is rebuilt anyway, as running jobs overrun their expected time.
    """

    def __init__(self, refresh_ms: int = 1000):
        self.run_times = RunTimes()
        self._refresh_ms = refresh_ms
        self._replays: dict[str, ClassReplay] = {}

    def invalidate(self) -> None:
        self._replays.clear()

    def expected_start(self, now_ms: int, pool: Any, job_id: str, jobs: dict) -> int | None:
        """When queued ``job_id`` of scheduler ``pool`` (devices, ``held``, FIFO ``queue``) should start,
        never before ``now_ms``; ``jobs`` are the job table's active ``JobRecord``s by id."""

        def expected(other: str) -> float | None:
            spec = jobs[other].spec if other in jobs else {}
            return self.run_times.expected_ms(spec.get("name", ""), spec.get("version", ""), pool.name)

        replay = self._replays.get(pool.name)
        if replay is None or now_ms - replay.created_ms >= self._refresh_ms:
            holding = [
                Holding(other, len(devices), getattr(jobs.get(other), "started_ms", None), expected(other))
                for other, devices in pool.held.items()
            ]
            replay = self._replays[pool.name] = ClassReplay(now_ms, len(pool.devices), holding)
        if job_id not in replay.starts:
            for other, num_gpus in islice(pool.queue.items(), len(replay.starts), None):
                replay.extend(other, num_gpus, expected(other))
                if other == job_id:
                    break
        value = replay.starts.get(job_id)
        return None if value is None else max(value, now_ms)
