"""Expected start of pending jobs (issue 17 §3): the pure replay, then a real control plane's REST shape,
queue events and the text a user reads. Accuracy is measured in benchmarks/bench_expected_wait.py."""

from __future__ import annotations

import json
import statistics
import time

import pytest
from conftest import register, registration_body
from helpers import describe, submit, wait_done, wait_state

from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.server.control.events import EventBus
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.placement import SchedulerPlacement
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.policy.estimates import Holding, RunTimes, Waiting, expected_starts, warm_run_ms
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.storage.store import JobRecord
from lancefn_jupyter.wire.models import Job


def first_in_line(job_id: str, **placement) -> dict:
    """A PENDING ``run_function`` job as the wire has it, waiting first in line for one GPU of ``default``."""
    return {
        "job_id": job_id,
        "job_type": "run_function",
        "job_state": "PENDING",
        "creation_ms": 0,
        "placement": {"gpu_class": "default", "num_gpus": 1, "waiting_on_capacity": True, "queue_position": 1}
        | placement,
        "progress": {},
    }


def test_replay_strict_fifo_over_predicted_run_times():
    # 2 GPUs: a (1 GPU) ends at 10_000, b (1 GPU) at 4_000; queue: c (2 GPUs), d (1 GPU, 3 s), e (1 GPU).
    holding = [Holding("a", 1, 0, 10_000.0), Holding("b", 1, 1_000, 3_000.0)]
    waiting = [Waiting("c", 2, 5_000.0), Waiting("d", 1, 3_000.0), Waiting("e", 1, 1_000.0)]
    got = expected_starts(2_000, 2, holding, waiting)
    # c needs both GPUs: after a ends (10 s); d and e start when c ends (15 s): FIFO, no overtaking.
    assert got == {"c": 10_000, "d": 15_000, "e": 15_000}


def test_overrun_unknown_and_unstarted_jobs():
    # a overran its expected 1 s: taken to end now. b was placed but has not started: counts from now.
    got = expected_starts(
        5_000,
        2,
        [Holding("a", 1, 0, 1_000.0), Holding("b", 1, None, 2_000.0)],
        [Waiting("c", 1, 500.0), Waiting("d", 1, None), Waiting("e", 1, 100.0), Waiting("f", 1, 1.0)],
    )
    assert got == {"c": 5_000, "d": 5_500, "e": 7_000, "f": 7_100}
    # A holder with no history never frees its GPU in the replay: whoever needs it is unknown, and so is
    # everyone behind (strict FIFO).
    got = expected_starts(0, 1, [Holding("a", 1, 0, None)], [Waiting("b", 1, 5.0), Waiting("c", 1, 5.0)])
    assert got == {"b": None, "c": None}


def test_run_times_version_median_then_the_median_of_the_class_versions():
    times = RunTimes(keep=3)
    assert times.expected_ms("f", "v1", "default") is None
    for ms in (100, 900, 200, 300):  # keeps the last 3: 900, 200, 300
        times.record("f", "v1", "default", ms)
    times.record("g", "v1", "default", 10_000)
    assert times.expected_ms("f", "v1", "default") == 300
    # A new version: each version counts once (300 and 10,000), not each run (200, 300, 10,000 → 300).
    assert times.expected_ms("f", "new", "default") == 5_150
    for ms in (40, 50, 60):  # a busy short version does not drag it down: one more version (50)
        times.record("h", "v1", "default", ms)
    assert times.new_version_ms("default") == 300 and list(times.version_medians("default")) == [300, 10_000, 50]
    times.record("k", "v1", "default", 7_000)  # the last 3 versions: g, h, k
    assert list(times.version_medians("default")) == [10_000, 50, 7_000] and times.new_version_ms("default") == 7_000
    assert times.expected_ms("f", "v1", "big") is None


def test_expected_start_text():
    assert display.expected_start_text(None) == "start time unknown"
    assert display.expected_start_text(41_000, now_ms=1_000) == "starts in about 40 s"
    assert display.expected_start_text(1_500, now_ms=1_000) == "starts any moment"
    assert display.expected_start_text(601_000, now_ms=1_000) == "starts in about 10 min"


NAP = "from __future__ import annotations\n\nimport time\n\ndef nap(s: float) -> float:\n    time.sleep(s)\n    return s\n"


def _nap(name="nap", source=NAP):
    return registration_body(
        name, source=source, entrypoint="nap", inputs=(("s", "float64", False),), output_type="float64"
    )


def _first_queue_event(cp) -> dict:
    with cp.http() as http, http.stream("GET", "/v1/jobs/events") as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: ") and kind == "queue":
                return json.loads(line[6:])
    raise AssertionError("no queue event")


def test_pending_jobs_carry_expected_start(control_plane):
    with control_plane.http() as http:
        version = register(http, _nap())["version"]
        first = [submit(http, "nap", version, [{"s": 1.5}]) for _ in range(3)]
        queued = wait_state(http, first[2], "PENDING")
        assert queued["placement"]["queue_position"] == 1
        assert queued["placement"]["expected_start_ms"] is None  # no run history on this server yet
        assert "start time unknown" in display.job_summary(Job.from_wire(queued))
        history = [wait_done(http, job_id) for job_id in first]
        median = statistics.median(job["finished_ms"] - job["started_ms"] for job in history)

        jobs = [submit(http, "nap", version, [{"s": 2.0}]) for _ in range(4)]
        running = [wait_state(http, job_id, "IN_PROGRESS") for job_id in jobs[:2]]
        third, fourth = describe(http, jobs[2]), describe(http, jobs[3])
        assert (third["placement"]["queue_position"], fourth["placement"]["queue_position"]) == (1, 2)
        # The first GPU to free is the earlier-started running job's, after the version's median run time.
        expected = max(min(job["started_ms"] for job in running) + median, time.time() * 1000 - 1000)
        assert third["placement"]["expected_start_ms"] == pytest.approx(expected, abs=1000)
        assert fourth["placement"]["expected_start_ms"] >= third["placement"]["expected_start_ms"]
        assert "starts in about" in display.job_summary(Job.from_wire(third)) or "any moment" in display.job_summary(
            Job.from_wire(third)
        )
        event = _first_queue_event(control_plane)
        assert event["classes"]["default"] == jobs[2:]
        assert set(event["expected_start_ms"]) == set(jobs[2:]) and all(event["expected_start_ms"].values())

        # A version never run on the class: the class-wide median stands in.
        other = register(http, _nap("nap2", NAP.replace("return s", "return s + 0")))["version"]
        fresh = submit(http, "nap2", other, [{"s": 0.1}])
        assert describe(http, fresh)["placement"]["expected_start_ms"] is not None
        for job_id in [*jobs, fresh]:
            wait_done(http, job_id)
        assert describe(http, fresh)["placement"]["expected_start_ms"] is None  # only pending jobs carry one


def test_listener_refreshes_expected_start_from_queue_events():
    """The kernel's event listener re-shows a pending job when a `queue` event moves its expected start."""
    from lancefn_jupyter.kernel.client.events import Event
    from lancefn_jupyter.kernel.client.listener import EventListener

    class Watcher:
        def __init__(self):
            self.seen = []

        def update(self, job):
            self.seen.append(job.placement.expected_start_ms)

    listener, watcher = EventListener(lambda: None), Watcher()
    listener.subscribe_job("j1", watcher.update)
    listener._dispatch(Event(event="job", data=first_in_line("j1", expected_start_ms=None), id="1"))
    listener._dispatch(
        Event(event="queue", data={"classes": {"default": ["j1"]}, "expected_start_ms": {"j1": 5000}}, id=None)
    )
    listener._dispatch(
        Event(event="queue", data={"classes": {"default": ["j1"]}, "expected_start_ms": {"j1": 5000}}, id=None)
    )
    assert listener.last_error is None
    assert watcher.seen == [None, 5000]  # an unchanged estimate is not re-shown
    vague = {
        "classes": {"default": ["j1"]},
        "expected_start_ms": {"j1": 5000},
        "expected_start_uncertain": {"j1": True},
    }
    listener._dispatch(Event(event="queue", data=vague, id=None))
    assert watcher.seen == [None, 5000, 5000]  # re-shown: the same estimate, now uncertain
    assert listener._pending["j1"].placement.expected_start_uncertain


def test_estimator_extends_the_replay_for_jobs_joining_the_tail():
    """The core's incremental estimator agrees with a full replay, and is rebuilt after invalidate()."""
    from types import SimpleNamespace

    from lancefn_jupyter.server.policy.estimates import QueueEstimator
    from lancefn_jupyter.server.policy.scheduler import ClassPool

    estimator = QueueEstimator(refresh_ms=10**9)
    for ms in (1000, 1000, 1000):
        estimator.run_times.record("f", "v", "default", ms)
    jobs = {j: SimpleNamespace(spec={"name": "f", "version": "v"}, started_ms=0) for j in "abcdef"}
    pool = ClassPool("default", ("sim0", "sim1"))
    pool.held.update({"a": ("sim0",), "b": ("sim1",)})
    pool.levels["ns"] = 2
    pool.queue.add("c", "ns", 1)
    pool.queue.add("d", "ns", 2)
    assert estimator.expected_start(0, pool, "c", jobs) == 1000
    pool.queue.add("e", "ns", 1)  # joins the tail: the replay is extended, not rebuilt
    assert [estimator.expected_start(0, pool, j, jobs) for j in "de"] == [2000, 3000]
    full = expected_starts(
        0,
        2,
        [Holding("a", 1, 0, 1000.0), Holding("b", 1, 0, 1000.0)],
        [Waiting(j, n, 1000.0) for j, n in pool.start_order()],
    )
    assert full == {"c": 1000, "d": 2000, "e": 3000}
    pool.queue.remove("c")
    del pool.held["a"]
    pool.held["c"] = ("sim0",)
    jobs["c"].started_ms = 1000
    # c started: the replay no longer begins with the queue, so it is rebuilt (here without invalidate()),
    # with c holding a GPU from 1000 to 2000.
    assert estimator.expected_start(1000, pool, "d", jobs) == 2000
    estimator.invalidate(None)  # a CPU job changed: the class's replay stays
    assert estimator._replays
    estimator.invalidate("default")
    assert not estimator._replays
    assert estimator.expected_start(1000, pool, "d", jobs) == 2000
    assert estimator.expected_start(5000, pool, "f", jobs) is None  # not queued


def _counting_queue():
    """A ``FairQueue`` and the list of every job its ``order`` walks (how much of the queue a replay walked)."""
    from lancefn_jupyter.server.policy.scheduler import FairQueue

    walked: list[str] = []

    class Counting(FairQueue):
        def order(self, levels, taken=None):
            for job_id, units in super().order(levels, taken):
                walked.append(job_id)
                yield job_id, units

    return Counting(), walked


def test_estimator_resumes_its_walk_and_rewinds_when_a_fairer_job_goes_ahead():
    """A job joining a long queue's tail costs a step of the walk, not a walk of the queue (creating a
    20,000-chunk batch was O(N²)); a job of a namespace holding less lands ahead and the replay is rewound."""
    from types import SimpleNamespace

    from lancefn_jupyter.server.policy.estimates import QueueEstimator
    from lancefn_jupyter.server.policy.scheduler import ClassPool, FairQueue

    queue, walked = _counting_queue()
    estimator = QueueEstimator(refresh_ms=10**9)
    estimator.run_times.record("f", "v", "default", 1000)
    jobs: dict = {}
    pool = ClassPool("default", ("sim0",), queue=queue)
    pool.held["run"], pool.levels["a"] = ("sim0",), 1
    jobs["run"] = SimpleNamespace(spec={"name": "f", "version": "v"}, started_ms=0)
    order = FairQueue.order.__get__(pool.queue)
    for i in range(500):
        jobs[f"a{i}"] = SimpleNamespace(spec={"name": "f", "version": "v"}, started_ms=None)
        pool.queue.add(f"a{i}", "a", 1)
        assert estimator.expected_start(0, pool, f"a{i}", jobs) == 1000 * (i + 1)
    assert len(walked) == 500  # each job once, not 500²/2
    jobs["b0"] = SimpleNamespace(spec={"name": "f", "version": "v"}, started_ms=None)
    pool.queue.add("b0", "b", 1)  # team b holds nothing (team a one GPU): due first
    assert estimator.expected_start(0, pool, "b0", jobs) == 1000
    assert estimator.expected_start(0, pool, "a0", jobs) == 2000  # pushed back one place
    full = expected_starts(0, 1, [Holding("run", 1, 0, 1000.0)], [Waiting(j, n, 1000.0) for j, n in order(pool.levels)])
    assert (
        [estimator.expected_start(0, pool, j, jobs) for j in ("b0", "a0", "a1", "a499")]
        == [
            full["b0"],
            full["a0"],
            full["a1"],
            full["a499"],
        ]
        == [1000, 2000, 3000, 501_000]
    )


def test_run_times_are_recorded_warm_so_one_cold_job_does_not_delay_the_warm_ones_behind_it():
    assert warm_run_ms(1_000, 11_000, {"start_ms": 1_500, "setup_ms": 7_500, "run_ms": 900}) == 1_000
    assert warm_run_ms(1_000, 2_000, None) == 1_000  # a job from before timings: its whole duration
    assert warm_run_ms(1_000, 2_000, {"start_ms": 5_000}) == 0  # never negative
    table = JobTable(scheduler=SchedulerState({"default": ("0", "1")}), executor=None)
    reports = Reports(table, classes=None, bus=EventBus(), placement=SchedulerPlacement(table))  # type: ignore[arg-type]

    def finished(job_id: str, duration_ms: int, timings: dict) -> JobRecord:
        return JobRecord(
            job_id=job_id,
            job_type="run_function",
            state="DONE",
            creation_ms=0,
            spec={"name": "f", "version": "v1"},
            gpu_class="default",
            num_gpus=1,
            started_ms=1_000,
            finished_ms=1_000 + duration_ms,
            timings=timings,
        )

    # One cold job (8 s start + setup, 1 s run) and two warm ones (1 s): the expected run time is 1 s.
    reports.note_run_time(finished("cold", 9_000, {"start_ms": 2_000, "setup_ms": 6_000, "run_ms": 1_000}))
    reports.note_run_time(finished("w1", 1_000, {"start_ms": 0, "setup_ms": 0, "run_ms": 1_000}))
    reports.note_run_time(finished("w2", 1_000, {"start_ms": 0, "setup_ms": 0, "run_ms": 1_000}))
    assert reports.estimator.run_times.expected_ms("f", "v1", "default") == 1_000
    # Two warm jobs hold both GPUs since t=1 s; four 1-GPU jobs wait: pairs start at 2 s and 3 s
    # (a cold-inflated median of 9 s would have said 10 s and 19 s).
    scheduler = reports.table.scheduler
    jobs = {}
    for job_id in "abcdef":
        scheduler.enqueue(job_id, "default", 1)
        jobs[job_id] = finished(job_id, 0, {})
        jobs[job_id].started_ms = 1_000 if job_id in "ab" else None
    assert [p.job_id for p in scheduler.schedule()] == ["a", "b"]
    pool = scheduler.pools["default"]
    got = {j: reports.estimator.expected_start(1_500, pool, j, jobs) for j in "cdef"}
    assert got == {"c": 2_000, "d": 2_000, "e": 3_000, "f": 3_000}


def _issue_29_estimator(elapsed_ms: int):
    """Two GPUs held by two jobs of a new function (no history) that started at 0 and will run 30 s;
    the class's history is a few 4 s runs of another function; one job of that other function waits."""
    from types import SimpleNamespace

    from lancefn_jupyter.server.policy.estimates import QueueEstimator
    from lancefn_jupyter.server.policy.scheduler import ClassPool

    estimator = QueueEstimator()
    for ms in (3_800, 4_000, 4_200):
        estimator.run_times.record("quick", "q1", "default", ms)
    jobs = {
        "a": SimpleNamespace(spec={"name": "slow", "version": "s1"}, started_ms=0),
        "b": SimpleNamespace(spec={"name": "slow", "version": "s1"}, started_ms=0),
        "c": SimpleNamespace(spec={"name": "quick", "version": "q1"}, started_ms=None),
    }
    pool = ClassPool("default", ("sim0", "sim1"))
    pool.held.update({"a": ("sim0",), "b": ("sim1",)})
    pool.queue.add("c", "ns", 1)
    start = estimator.expected_start(elapsed_ms, pool, "c", jobs)
    return start, estimator.is_uncertain(elapsed_ms, pool, "c", jobs)


def test_running_jobs_without_history_are_not_taken_to_end_at_the_class_median():
    """Issue 29: the queued job said "starts in about 4 s" while the running jobs had ~24 s left. Now a running
    job of a version without history that outlived the class's runs is expected to run as long again as it has
    (never less than it has shown), and the estimate says it is uncertain."""
    start, uncertain = _issue_29_estimator(6_000)  # the running jobs are 6 s in, 24 s left
    assert start == 12_000  # 6 s from now: they ran 6 s, as long again; the old rule said "now" (4 s < 6 s)
    assert uncertain
    text = display.expected_start_text(start, now_ms=6_000, uncertain=uncertain)
    assert text == "start time uncertain (best guess 6 s)"
    assert "about 4 s" not in text and "any moment" not in text
    queued = Job.from_wire(
        first_in_line("c", expected_start_ms=int(time.time() * 1000) + 6_000, expected_start_uncertain=True)
    )
    assert "start time uncertain" in display.job_summary(queued)


def test_a_young_running_job_without_history_takes_the_class_runs_longer_than_it_has_run():
    # 1 s in: the class's runs (3.8, 4.0, 4.2 s) all lasted longer; their median, and they agree: not uncertain.
    assert _issue_29_estimator(1_000) == (4_000, False)


def test_unseen_run_time_and_spread():
    from lancefn_jupyter.server.policy.estimates import spread_is_wide, unseen_run_ms

    runs = [1_000.0, 6_000.0, 8_000.0, 9_000.0]
    assert unseen_run_ms(0, runs) == (7_000.0, True)  # median of all; 1 s .. 9 s spreads wide
    assert unseen_run_ms(1_500, runs) == (8_000.0, False)  # only the runs longer than 1.5 s: 6, 8, 9 s
    assert unseen_run_ms(8_500, runs) == (9_000.0, False)  # never less than what it has shown
    assert unseen_run_ms(20_000, runs) == (40_000.0, True)  # outlived them all: as long again, uncertain
    assert not spread_is_wide([4_000.0]) and not spread_is_wide([3_000.0, 5_000.0])
    assert spread_is_wide([1_000.0, 4_000.0])


def test_uncertainty_carries_to_everyone_behind_and_queued_new_versions_with_spread_history():
    from lancefn_jupyter.server.policy.estimates import replay_class

    replay = replay_class(
        0,
        1,
        [Holding("a", 1, 0, 1_000.0)],
        [Waiting("b", 1, 5_000.0, uncertain=True), Waiting("c", 1, 1_000.0), Waiting("d", 1, 1_000.0)],
    )
    assert replay.starts == {"b": 1_000, "c": 6_000, "d": 7_000}
    assert replay.uncertain_starts == {"c", "d"}  # b waits on a's known end; c and d on b's vague one


@pytest.mark.parametrize("seed", range(6))
def test_teams_submitting_at_once_rewind_the_walk_and_agree_with_a_full_replay(seed):
    """Jobs of several teams joining at once: fair order puts a new job of the team that holds less ahead of the
    jobs already walked. The walk rewinds to its mark before that job (not a replay of the queue), and every
    estimate agrees with a full replay of the queue as it stands."""
    import random
    from types import SimpleNamespace

    from lancefn_jupyter.server.policy.estimates import QueueEstimator
    from lancefn_jupyter.server.policy.scheduler import ClassPool, FairQueue

    queue, walked = _counting_queue()
    rng = random.Random(seed)
    estimator = QueueEstimator(refresh_ms=10**9)
    for version, ms in (("v1", 1000), ("v2", 300)):
        estimator.run_times.record("f", version, "default", ms)
    jobs: dict = {}
    pool = ClassPool("default", ("sim0", "sim1"), queue=queue)
    pool.held.update({"run0": ("sim0",), "run1": ("sim1",)})
    pool.levels.update({"t0": 1, "t1": 1})
    for j in ("run0", "run1"):
        jobs[j] = SimpleNamespace(spec={"name": "f", "version": "v1"}, started_ms=0)
    order = FairQueue.order.__get__(pool.queue)
    teams = ["t0", "t1", "t2"][: 2 + seed % 2]
    total = 1500
    for i in range(total):
        team = rng.choice(teams)  # uneven: one team runs ahead, and its jobs are walked past the others'
        version = rng.choice(("v1", "v2"))
        jobs[f"j{i}"] = SimpleNamespace(spec={"name": "f", "version": version}, started_ms=None)
        pool.queue.add(f"j{i}", team, rng.choice((1, 1, 1, 2)))
        estimator.expected_start(0, pool, f"j{i}", jobs)
    # Each arrival walked about the jobs fair order puts behind it, plus a mark's worth: a replay of the queue per
    # arrival would walk ~total²/2 = 1,125,000 jobs.
    assert len(walked) < 50 * total
    full = expected_starts(
        0,
        2,
        [Holding("run0", 1, 0, 1000.0), Holding("run1", 1, 0, 1000.0)],
        [Waiting(j, n, 1000.0 if jobs[j].spec["version"] == "v1" else 300.0) for j, n in order(pool.levels)],
    )
    assert {j: estimator.expected_start(0, pool, j, jobs) for j in full} == full
    estimator.invalidate("default")
    assert estimator.expected_start(0, pool, f"j{total - 1}", jobs) == full[f"j{total - 1}"]
