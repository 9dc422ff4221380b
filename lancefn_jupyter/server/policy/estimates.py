"""Expected start time of pending jobs (pure; the reports feed it its queues and recent run times).

The estimate replays the scheduler's own start order per GPU class (FIFO per namespace, round the namespaces)
over predicted run times:

* a job holding GPUs ends at ``started_ms + expected run time`` (a job already past its expected run
  time is taken to end now; one placed but not yet started counts from now);
* each pending job, in queue order, starts once the GPUs it needs are free and every job ahead of it
  has started;
* a run time is the median of the last ``KEEP`` successful runs of that function version on that class,
  else (a version that never ran there) the median over the class's last ``KEEP`` versions of each one's
  median, else unknown.  Each version counts once, however often it ran: a new version is one more draw
  from the versions, and a class's runs are dominated by its busiest version (often its shortest);
* a running job of a version with no history is expected to run as long as the median of those versions'
  medians that are longer than it has already run, and when it has outlived them all, as long again as it
  has run so far (``unseen_run_ms``): never less than what it has already shown;
* a run is recorded warm (``warm_run_ms``): its duration less the worker start and setup it paid, so one
  cold job does not push back the expected start of the warm jobs behind it (docs/ARCHITECTURE.md, "Warm state").

When a run time the replay needs is unknown, the job's estimate (and every one behind it) is ``None``:
the placement says "unknown" rather than guess. An estimate that rests on a version without history is
*uncertain* (and so is every one behind it) when the versions' run times it uses spread wide (90th percentile
over ``WIDE_SPREAD`` × the 10th) or when a running job has outlived them all: the placement says "start time
uncertain". Benchmarked in ``benchmarks/bench_expected_wait.py``.
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KEEP",
    "WIDE_SPREAD",
    "ClassReplay",
    "Holding",
    "QueueEstimator",
    "RunTimes",
    "Waiting",
    "expected_starts",
    "replay_class",
    "spread_is_wide",
    "unseen_run_ms",
    "warm_run_ms",
]

KEEP = 20  # recent runs per version (and per class) that the median is taken over
WIDE_SPREAD = 3.0  # run times whose 90th percentile is over this × their 10th say little about a new version


def spread_is_wide(runs: Sequence[float]) -> bool:
    """Whether run times spread too wide for one of them to stand for a version never seen."""
    if len(runs) < 2:
        return False
    ordered = sorted(runs)
    low, high = ordered[(len(ordered) - 1) // 10], ordered[len(ordered) - 1 - (len(ordered) - 1) // 10]
    return high > WIDE_SPREAD * max(low, 1.0)


def unseen_run_ms(elapsed_ms: float, runs: Sequence[float]) -> tuple[float, bool]:
    """``(expected total run time, uncertain)`` of a running job whose version has no history, that has run
    ``elapsed_ms`` so far, from ``runs`` (the class's recent versions' medians): the median of those longer
    than it already has run; once it outlived them all, twice its run so far (as long again), uncertain."""
    longer = [ms for ms in runs if ms > elapsed_ms]
    if not longer:
        return 2.0 * max(elapsed_ms, 1.0), True
    return statistics.median(longer), spread_is_wide(longer)


def warm_run_ms(started_ms: int, finished_ms: int, timings: Mapping[str, Any] | None) -> float:
    """A finished job's run time as a warm worker would take it: started → finished less the
    ``start_ms`` and ``setup_ms`` of its ``timings`` (a job without timings: its whole duration)."""
    paid = 0.0
    if timings:
        paid = float(timings.get("start_ms") or 0.0) + float(timings.get("setup_ms") or 0.0)
    return max(0.0, finished_ms - started_ms - paid)


class RunTimes:
    """Recent successful run times (ms) per (name, version, class), and per class the recent versions that ran
    on it; bounded memory."""

    def __init__(self, keep: int = KEEP, max_versions: int = 4096):
        self._keep = keep
        self._max_versions = max_versions
        self._by_version: dict[tuple[str, str, str], deque[float]] = {}
        # Medians are kept up to date on record: the replay reads them for every queued job.
        self._version_median: dict[tuple[str, str, str], float] = {}
        self._class_versions: dict[str, dict[tuple[str, str, str], None]] = {}  # last ``keep``, oldest first
        self._class_medians: dict[str, list[float]] = {}  # those versions' medians
        self._new_version_median: dict[str, float] = {}

    def record(self, name: str, version: str, gpu_class: str, duration_ms: float) -> None:
        if duration_ms < 0:
            return
        key = (name, version, gpu_class)
        if key not in self._by_version and len(self._by_version) >= self._max_versions:
            oldest = next(iter(self._by_version))  # the oldest-seen version goes first
            del self._by_version[oldest], self._version_median[oldest]
            self._class_versions.get(oldest[2], {}).pop(oldest, None)
        runs = self._by_version.setdefault(key, deque(maxlen=self._keep))
        runs.append(duration_ms)
        self._version_median[key] = statistics.median(runs)
        recent = self._class_versions.setdefault(gpu_class, {})
        recent.pop(key, None)
        recent[key] = None  # the most recent last
        while len(recent) > self._keep:
            del recent[next(iter(recent))]
        medians = [self._version_median[k] for k in recent]
        self._class_medians[gpu_class] = medians
        self._new_version_median[gpu_class] = statistics.median(medians)

    def expected_ms(self, name: str, version: str, gpu_class: str) -> float | None:
        """The version's median run time on the class, else ``new_version_ms``, else None."""
        median = self._version_median.get((name, version, gpu_class))
        return median if median is not None else self._new_version_median.get(gpu_class)

    def new_version_ms(self, gpu_class: str) -> float | None:
        """What a version that never ran on the class is expected to take: the median of the medians of the
        class's recent versions (None: nothing ran there yet)."""
        return self._new_version_median.get(gpu_class)

    def version_ms(self, name: str, version: str, gpu_class: str) -> float | None:
        """The version's own median run time on the class (None: no history)."""
        return self._version_median.get((name, version, gpu_class))

    def version_medians(self, gpu_class: str) -> Sequence[float]:
        """The medians of the class's last ``keep`` versions, least recently run first."""
        return self._class_medians.get(gpu_class, ())


@dataclass(frozen=True)
class Holding:
    """A job holding GPUs of the class (running, or placed and starting)."""

    job_id: str
    num_gpus: int
    started_ms: int | None  # None: placed, worker not started yet
    expected_ms: float | None
    uncertain: bool = False  # its run time rests on a version without history and says little


@dataclass(frozen=True)
class Waiting:
    """A pending job in queue order."""

    job_id: str
    num_gpus: int
    expected_ms: float | None
    uncertain: bool = False


MARK_EVERY = 64  # jobs walked between a replay's marks (``ClassReplay.rewind``)


@dataclass(frozen=True)
class _Mark:
    walked: int
    releases: list[tuple[float, int, bool]]
    free: int
    clock: float
    blocked: bool
    uncertain: bool
    taken: dict[str, tuple[int, int, int]]
    last_key: tuple[int, int] | None


class ClassReplay:
    """The replay of one class, extended job by job in queue order (a job appended to the queue costs
    O(log GPUs), not a replay of everything ahead of it)."""

    def __init__(self, now_ms: int, total_gpus: int, holding: Sequence[Holding]):
        self.created_ms = now_ms
        self.free = total_gpus - sum(h.num_gpus for h in holding)
        # (time GPUs come free, how many, whether that time is uncertain)
        self.releases: list[tuple[float, int, bool]] = []
        for h in holding:  # a job with an unknown end never frees its GPUs in the replay
            if h.expected_ms is not None:
                start = now_ms if h.started_ms is None else h.started_ms
                heapq.heappush(self.releases, (max(now_ms, start + h.expected_ms), h.num_gpus, h.uncertain))
        self.clock = float(now_ms)
        self.blocked = False  # only GPUs with an unknown end are left: everyone from here is unknown
        self.uncertain = False  # an uncertain release was waited for: everyone from here is uncertain
        self.starts: dict[str, int | None] = {}
        self.uncertain_starts: set[str] = set()
        # Where the walk of the start order stands, so that extending it resumes there (QueueEstimator):
        # namespace → (its jobs walked, their units, the last one's ticket); the sort key of the last job
        # walked ((level + units before it, ticket): the fair order's); the levels the order was walked with.
        self.taken: dict[str, tuple[int, int, int]] = {}
        self.last_key: tuple[int, int] | None = None
        self.levels: dict[str, int] = {}
        # The jobs walked, in order, and the replay's state after every ``MARK_EVERY``-th of them (after none
        # first): a job that fair order puts ahead of the last jobs walked rewinds the walk to the last mark before
        # it (``rewind``) instead of replaying the whole queue.
        self.walked: list[str] = []
        self.marks: list[_Mark] = [self._mark()]

    def _mark(self) -> _Mark:
        return _Mark(
            len(self.walked),
            list(self.releases),
            self.free,
            self.clock,
            self.blocked,
            self.uncertain,
            dict(self.taken),
            self.last_key,
        )

    def walk(
        self,
        job_id: str,
        namespace: str,
        num_gpus: int,
        key: tuple[int, int],
        ticket: int,
        expected_ms: float | None,
        uncertain: bool = False,
    ) -> None:
        """``extend`` with the next job of the start order (``QueueEstimator._extend``), whose sort key is ``key``."""
        count, units, _ = self.taken.get(namespace, (0, 0, 0))
        self.taken[namespace] = (count + 1, units + num_gpus, ticket)
        self.last_key = key
        self.extend(job_id, num_gpus, expected_ms, uncertain)
        self.walked.append(job_id)
        if len(self.walked) % MARK_EVERY == 0:
            self.marks.append(self._mark())

    def rewind(self, key: tuple[int, int]) -> None:
        """Back to the last mark whose walk ends before ``key``: the jobs walked since are walked again."""
        while self.marks[-1].last_key is not None and not self.marks[-1].last_key < key:
            self.marks.pop()  # the first mark (nothing walked) always stays
        mark = self.marks[-1]
        for job_id in self.walked[mark.walked :]:
            self.starts.pop(job_id, None)
            self.uncertain_starts.discard(job_id)
        del self.walked[mark.walked :]
        self.releases = list(mark.releases)
        self.free, self.clock, self.blocked, self.uncertain = mark.free, mark.clock, mark.blocked, mark.uncertain
        self.taken, self.last_key = dict(mark.taken), mark.last_key

    def extend(self, job_id: str, num_gpus: int, expected_ms: float | None, uncertain: bool = False) -> None:
        """The next queued job (plain arguments: this runs for every queued job the reports show)."""
        while not self.blocked and self.free < num_gpus:
            if not self.releases:
                self.blocked = True
                break
            at, gpus, vague = heapq.heappop(self.releases)
            self.clock = max(self.clock, at)
            self.free += gpus
            self.uncertain = self.uncertain or vague
        if self.blocked:
            self.starts[job_id] = None
            return
        self.starts[job_id] = round(self.clock)
        if self.uncertain:
            self.uncertain_starts.add(job_id)
        self.free -= num_gpus
        if expected_ms is not None:
            heapq.heappush(self.releases, (self.clock + expected_ms, num_gpus, uncertain))


def expected_starts(
    now_ms: int, total_gpus: int, holding: Sequence[Holding], waiting: Sequence[Waiting]
) -> dict[str, int | None]:
    """``{job_id: expected start (epoch ms) or None}`` for every waiting job of one class."""
    return replay_class(now_ms, total_gpus, holding, waiting).starts


def replay_class(now_ms: int, total_gpus: int, holding: Sequence[Holding], waiting: Sequence[Waiting]) -> ClassReplay:
    """The whole replay of one class (its ``starts`` and ``uncertain_starts``)."""
    replay = ClassReplay(now_ms, total_gpus, holding)
    for job in waiting:
        replay.extend(job.job_id, job.num_gpus, job.expected_ms, job.uncertain)
    return replay


class QueueEstimator:
    """The control plane's expected starts: one replay per class, kept while only jobs join the queue's tail.

    ``invalidate(gpu_class)`` is due whenever jobs of the class start, finish, are cancelled or placed (the
    machine calls it; a CPU job's changes leave every replay as it is);
    a replay older than ``refresh_ms`` is rebuilt anyway, as running jobs overrun their expected time.
    """

    def __init__(self, refresh_ms: int = 1000):
        self.run_times = RunTimes()
        self._refresh_ms = refresh_ms
        self._replays: dict[str, ClassReplay] = {}

    def invalidate(self, gpu_class: str | None = None) -> None:
        """Drop the replay of ``gpu_class`` (a CPU job's None: no class's replay changes)."""
        if gpu_class is not None:
            self._replays.pop(gpu_class, None)

    def expected_start(self, now_ms: int, pool: Any, job_id: str, jobs: dict) -> int | None:
        """When queued ``job_id`` of scheduler ``pool`` (a ``ClassPool``: devices, ``held``, ``levels``, ``queue``) should start,
        never before ``now_ms``; ``jobs`` are the job table's active ``JobRecord``s by id."""
        replay = self._replay(now_ms, pool, job_id, jobs)
        value = replay.starts.get(job_id)
        return None if value is None else max(value, now_ms)

    def is_uncertain(self, now_ms: int, pool: Any, job_id: str, jobs: dict) -> bool:
        """Whether ``expected_start`` of the same job rests on run times that say little (see above)."""
        return job_id in self._replay(now_ms, pool, job_id, jobs).uncertain_starts

    def _replay(self, now_ms: int, pool: Any, job_id: str, jobs: dict) -> ClassReplay:
        run_times = self.run_times
        new_ms, wide = run_times.new_version_ms(pool.name), spread_is_wide(run_times.version_medians(pool.name))

        def version_ms(other: str) -> float | None:
            spec = jobs[other].spec if other in jobs else {}
            return run_times.version_ms(spec.get("name", ""), spec.get("version", ""), pool.name)

        def holding(other: str, num_gpus: int) -> Holding:
            started_ms = getattr(jobs.get(other), "started_ms", None)
            known = version_ms(other)
            if known is not None:
                return Holding(other, num_gpus, started_ms, known)
            if started_ms is None:  # placed, not started: like a queued job of a new version
                return Holding(other, num_gpus, started_ms, new_ms, wide)
            runs = run_times.version_medians(pool.name)
            if not runs:
                return Holding(other, num_gpus, started_ms, None)
            total, uncertain = unseen_run_ms(now_ms - started_ms, runs)
            return Holding(other, num_gpus, started_ms, total, uncertain)

        replay = self._replays.get(pool.name)
        if (
            replay is not None
            and now_ms - replay.created_ms < self._refresh_ms
            and (job_id in replay.starts or self._extend(replay, pool, job_id, version_ms, new_ms, wide))
        ):
            return replay
        held = [holding(other, len(devices)) for other, devices in pool.held.items()]
        replay = self._replays[pool.name] = ClassReplay(now_ms, len(pool.devices), held)
        self._extend(replay, pool, job_id, version_ms, new_ms, wide)
        return replay

    @staticmethod
    def _extend(replay: ClassReplay, pool: Any, job_id: str, version_ms: Any, new_ms: float | None, wide: bool) -> bool:
        """Extend ``replay`` in start order up to ``job_id``, resuming the walk where it stopped (O(jobs added),
        however long the queue); False if the start order no longer begins with the jobs it replayed: one of
        them left the queue or the levels changed. A job queued since that fair order puts ahead of the last
        jobs walked (a new job of a namespace holding less) rewinds the walk to the mark before it: O(the jobs
        behind it), not O(the queue), as teams submitting at once do all the time."""
        queue = pool.queue
        if replay.taken and replay.levels != pool.levels:
            return False
        for ns, (count, _, last) in replay.taken.items():
            tickets = queue.tickets.get(ns)
            if tickets is None or len(tickets) < count or tickets[count - 1] != last:
                return False  # a walked job left (tickets only grow, so its index would be lower)
        replay.levels = dict(pool.levels)
        rewound = False
        while True:
            first = True
            for other, num_gpus in queue.order(pool.levels, {ns: t[:2] for ns, t in replay.taken.items()}):
                ns, _, ticket = queue.jobs[other]
                key = (pool.levels.get(ns, 0) + replay.taken.get(ns, (0, 0, 0))[1], ticket)
                if first and replay.last_key is not None and key < replay.last_key:
                    if rewound:  # cannot happen: the walk resumes at a mark before the job
                        return False
                    replay.rewind(key)
                    rewound = True
                    break
                first = False
                known = version_ms(other)
                if known is not None:
                    replay.walk(other, ns, num_gpus, key, ticket, known)
                else:
                    replay.walk(other, ns, num_gpus, key, ticket, new_ms, wide)
                if other == job_id:
                    return True
            else:
                return True
