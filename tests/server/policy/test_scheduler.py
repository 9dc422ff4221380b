"""Pure scheduler decisions: FIFO per class, devices, no starvation, CPU jobs, release."""

from __future__ import annotations

import random

import pytest

from lancefn_jupyter.server.policy.scheduler import Placement, SchedulerState, queue_positions, release, schedule

pytestmark = pytest.mark.unit


def two_gpu_state() -> SchedulerState:
    return SchedulerState({"default": ("sim0", "sim1")})


def test_three_one_gpu_jobs_on_two_gpus_third_waits_at_position_1():
    state = two_gpu_state()
    for job in ("a", "b", "c"):
        state.enqueue(job, "default", 1)
    placed = schedule(state)
    assert placed == [Placement("a", "default", ("sim0",)), Placement("b", "default", ("sim1",))]
    assert queue_positions(state, "default") == {"c": 1}
    assert state.queue_position("c") == 1
    assert state.is_pending("c") and not state.is_pending("a")
    # Nothing more fits until a device frees up.
    assert schedule(state) == []
    assert release(state, "b") == ("sim1",)
    assert schedule(state) == [Placement("c", "default", ("sim1",))]
    assert queue_positions(state, "default") == {}


def test_head_of_queue_blocks_smaller_jobs_behind_it():
    state = two_gpu_state()
    state.enqueue("small1", "default", 1)
    schedule(state)
    state.enqueue("big", "default", 2)
    state.enqueue("small2", "default", 1)
    # One GPU is free and small2 would fit, but big is first in line.
    assert schedule(state) == []
    assert queue_positions(state, "default") == {"big": 1, "small2": 2}
    release(state, "small1")
    assert schedule(state) == [Placement("big", "default", ("sim0", "sim1"))]
    release(state, "big")
    assert schedule(state) == [Placement("small2", "default", ("sim0",))]


def test_cancelling_a_pending_head_lets_the_next_job_start():
    state = two_gpu_state()
    state.enqueue("run", "default", 1)
    state.enqueue("big", "default", 2)
    state.enqueue("small", "default", 1)
    assert [p.job_id for p in schedule(state)] == ["run"]
    assert release(state, "big") == ()  # a pending job holds no devices
    assert schedule(state) == [Placement("small", "default", ("sim1",))]


def test_cpu_jobs_are_placed_immediately_without_devices():
    state = SchedulerState({"default": ("0",)})
    state.enqueue("gpu", "default", 1)
    state.enqueue("gpu2", "default", 1)
    for i in range(5):
        state.enqueue(f"cpu{i}", None, 0)
    placed = schedule(state)
    assert [p for p in placed if p.gpu_class is None] == [Placement(f"cpu{i}", None, ()) for i in range(5)]
    assert state.is_pending("gpu2")
    assert release(state, "cpu3") == ()
    assert state.usage() == [{"name": "default", "gpus_total": 1, "gpus_busy": 1, "jobs_running": 1, "jobs_pending": 1}]


def test_cpu_slots_limit_concurrent_cpu_jobs_fifo():
    state = SchedulerState({}, cpu_slots=2)
    for i in range(4):
        state.enqueue(f"cpu{i}", None, 0)
    assert [p.job_id for p in schedule(state)] == ["cpu0", "cpu1"]
    assert queue_positions(state, None) == {"cpu2": 1, "cpu3": 2}
    assert state.queue_position("cpu3") == 2
    release(state, "cpu1")
    assert [p.job_id for p in schedule(state)] == ["cpu2"]
    assert schedule(state) == []


def test_classes_are_independent_pools():
    state = SchedulerState({"a100": ("0", "1"), "t4": ("2",)})
    state.enqueue("x", "t4", 1)
    state.enqueue("y", "t4", 1)
    state.enqueue("z", "a100", 2)
    placed = {p.job_id: p for p in schedule(state)}
    assert placed["x"].devices == ("2",) and placed["z"].devices == ("0", "1")
    assert "y" not in placed
    assert queue_positions(state, "t4") == {"y": 1}
    assert queue_positions(state, "a100") == {}


def test_freed_devices_are_reused_lowest_id_first():
    state = SchedulerState({"c": ("0", "1", "2", "3")})
    for job in "abcd":
        state.enqueue(job, "c", 1)
    schedule(state)
    release(state, "c")
    release(state, "a")
    state.enqueue("e", "c", 2)
    assert schedule(state) == [Placement("e", "c", ("0", "2"))]


def test_invalid_enqueues_are_refused():
    state = two_gpu_state()
    with pytest.raises(KeyError):
        state.enqueue("x", "nope", 1)
    with pytest.raises(ValueError):
        state.enqueue("x", "default", 3)  # could never fit: would wait forever
    state.enqueue("x", "default", 1)
    with pytest.raises(ValueError):
        state.enqueue("x", "default", 1)
    assert release(state, "unknown") == ()


def test_set_devices_keeps_held_devices_held():
    state = two_gpu_state()
    state.enqueue("a", "default", 1)
    schedule(state)
    state.set_devices("default", ("sim0", "sim1", "sim2"))
    state.enqueue("b", "default", 2)
    assert schedule(state) == [Placement("b", "default", ("sim1", "sim2"))]


def test_random_workload_invariants():
    """Invariants under random enqueue/release: no device double-booked, FIFO order kept."""
    rng = random.Random(1234)
    devices = tuple(str(i) for i in range(4))
    state = SchedulerState({"c": devices})
    running: dict[str, tuple[str, ...]] = {}
    enqueued: list[str] = []
    started: list[str] = []
    for step in range(5000):
        if rng.random() < 0.55:
            job = f"j{step}"
            state.enqueue(job, "c", rng.randint(1, 4))
            enqueued.append(job)
        elif running:
            job = rng.choice(sorted(running))
            assert release(state, job) == running.pop(job)
        for placement in schedule(state):
            running[placement.job_id] = placement.devices
            started.append(placement.job_id)
        busy = [d for ds in running.values() for d in ds]
        assert len(busy) == len(set(busy))
        assert set(busy) <= set(devices)
    # Jobs start in exactly the order they were enqueued (strict FIFO).
    assert started == enqueued[: len(started)]


def test_queue_position_matches_the_queue_order_under_random_operations():
    """queue_position is computed without walking the queue; it must equal the walk."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(
        st.tuples(
            st.sampled_from(["gpu", "cpu", "schedule", "release", "cancel"]), st.integers(0, 50), st.integers(1, 2)
        ),
        max_size=80,
    )

    @settings(max_examples=300, deadline=None)
    @given(ops)
    def check(operations):
        state = SchedulerState({"a": ("d0", "d1", "d2")}, cpu_slots=1)
        known: list[str] = []
        for op, pick, gpus in operations:
            if op in ("gpu", "cpu"):
                job_id = f"j{len(known)}"
                state.enqueue(job_id, "a" if op == "gpu" else None, gpus if op == "gpu" else 0)
                known.append(job_id)
            elif op == "schedule":
                state.schedule()
            elif known:
                state.release(known[pick % len(known)])  # a running job finishing, or a cancel anywhere
            for gpu_class in ("a", None):
                walked = state.queue_positions(gpu_class)
                for job_id in known:
                    if state._class_of.get(job_id, "x") == gpu_class:
                        assert state.queue_position(job_id) == walked.get(job_id), (job_id, operations)

    check()


# ------------------------------------------------------------ warm device sets


class Warm:
    """A warm lookup: owner → device sets whose idle worker holds it; records who was asked."""

    def __init__(self, sets: dict) -> None:
        self.sets, self.asked = sets, []

    def __call__(self, owner):
        self.asked.append(owner)
        return self.sets.get(owner, [])


F, G = ("team", "f", "v1"), ("team", "g", "v1")


def test_the_head_gets_the_free_device_set_whose_idle_worker_holds_its_version():
    warm = Warm({F: [("sim2",)], G: [("sim1", "sim3")]})
    state = SchedulerState({"default": ("sim0", "sim1", "sim2", "sim3")}, warm=warm)
    state.enqueue("f1", "default", 1, F)
    state.enqueue("g1", "default", 2, G)
    assert state.schedule() == [Placement("f1", "default", ("sim2",)), Placement("g1", "default", ("sim1", "sim3"))]
    assert warm.asked == [F, G]
    assert release(state, "f1") == ("sim2",) and state.pools["default"].free == ["sim0", "sim2"]


def test_a_busy_or_wrongly_sized_warm_set_falls_back_to_the_lowest_free_devices():
    warm = Warm({F: [("sim1",)], G: [("sim2",), ("sim3", "sim3"), ("sim2", "sim3", "sim0")]})
    state = SchedulerState({"default": ("sim0", "sim1", "sim2", "sim3")}, warm=warm)
    state.enqueue("busy", "default", 1)  # no owner: lowest free, nobody asked
    state.enqueue("hold1", "default", 1)
    assert [p.devices for p in state.schedule()] == [("sim0",), ("sim1",)]
    assert warm.asked == []
    state.enqueue("f1", "default", 1, F)  # its warm sim1 is busy
    state.enqueue("g1", "default", 2, G)  # a 1-GPU set, a set naming one device twice, a 3-GPU set
    assert state.schedule() == [Placement("f1", "default", ("sim2",))]
    assert warm.asked == [F]  # g1 needs 2 GPUs, 1 is free: not about to be placed, not asked
    release(state, "busy")
    assert state.schedule() == [Placement("g1", "default", ("sim0", "sim3"))]
    assert warm.asked == [F, G]


def test_warm_sets_never_change_the_fifo_order():
    # g1's warm device is free, but f1 (2 GPUs) is the head and does not fit: g1 waits behind it.
    warm = Warm({G: [("sim1",)]})
    state = SchedulerState({"default": ("sim0", "sim1")}, warm=warm)
    state.enqueue("a", "default", 1)
    state.schedule()
    state.enqueue("f1", "default", 2, F)
    state.enqueue("g1", "default", 1, G)
    assert state.schedule() == [] and warm.asked == []
    assert state.queue_positions("default") == {"f1": 1, "g1": 2}
    release(state, "a")
    assert state.schedule() == [Placement("f1", "default", ("sim0", "sim1"))]
    assert warm.asked == [F]


def test_a_cancelled_queued_job_leaves_no_owner_behind():
    state = SchedulerState({"default": ("sim0",)}, warm=Warm({}))
    state.enqueue("a", "default", 1, F)
    state.enqueue("b", "default", 1, G)
    state.schedule()
    release(state, "b")
    release(state, "a")
    assert state.pools["default"].owners == {}


def test_random_warm_placements_keep_fifo_and_never_double_book_devices():
    rng = random.Random(7)
    devices = tuple(f"sim{i}" for i in range(6))
    owners = [("team", name, "v1") for name in "abcd"]
    warm_sets = {owner: [tuple(rng.sample(devices, rng.randint(1, 3))) for _ in range(2)] for owner in owners}
    state = SchedulerState({"default": devices}, warm=lambda owner: warm_sets[owner])
    plain = SchedulerState({"default": devices})
    running: list[str] = []
    for step in range(500):
        job = f"j{step}"
        num = rng.randint(1, 3)
        owner = rng.choice(owners)
        state.enqueue(job, "default", num, owner)
        plain.enqueue(job, "default", num)
        placed, placed_plain = state.schedule(), plain.schedule()
        assert [p.job_id for p in placed] == [p.job_id for p in placed_plain]  # same jobs, same order
        running.extend(p.job_id for p in placed)
        held = [d for ds in state.pools["default"].held.values() for d in ds]
        assert len(held) == len(set(held)) and set(held).isdisjoint(state.pools["default"].free)
        assert sorted(held + state.pools["default"].free) == sorted(devices)
        if running and rng.random() < 0.6:
            done = running.pop(rng.randrange(len(running)))
            release(state, done)
            release(plain, done)


# ------------------------------------------------------------ fair across namespaces


def test_one_teams_long_queue_does_not_hold_back_another_teams_job():
    """vision holds both GPUs and queues 20 more; nlp's one job is next, not 21st, and starts on the first free GPU."""
    state = two_gpu_state()
    for i in range(22):
        state.enqueue(f"v{i}", "default", 1, namespace="vision")
    assert [p.job_id for p in schedule(state)] == ["v0", "v1"]
    state.enqueue("n0", "default", 1, namespace="nlp")
    assert state.queue_position("n0") == 1
    assert state.queue_position("v2") == 2  # vision's own order is kept
    assert list(queue_positions(state, "default"))[:3] == ["n0", "v2", "v3"]
    assert state.queue_heads(2) == {"default": ["n0", "v2"]}
    release(state, "v0")
    assert schedule(state) == [Placement("n0", "default", ("sim0",))]
    release(state, "v1")
    assert [p.job_id for p in schedule(state)] == ["v2"]


def test_gpus_go_round_the_waiting_namespaces():
    state = SchedulerState({"default": ("g0", "g1", "g2", "g3", "g4", "g5")})
    for team in ("a", "b", "c"):  # arrival: every a, then every b, then every c
        for i in range(3):
            state.enqueue(f"{team}{i}", "default", 1, namespace=team)
    assert [p.job_id for p in schedule(state)] == ["a0", "b0", "c0", "a1", "b1", "c1"]
    assert queue_positions(state, "default") == {"a2": 1, "b2": 2, "c2": 3}


def test_a_namespace_holding_more_waits_behind_one_holding_less():
    state = SchedulerState({"default": ("g0", "g1", "g2")})
    state.enqueue("a0", "default", 2, namespace="a")
    state.enqueue("b0", "default", 1, namespace="b")
    schedule(state)  # a holds 2, b holds 1
    state.enqueue("a1", "default", 1, namespace="a")
    state.enqueue("b1", "default", 1, namespace="b")  # later, but b holds less
    assert queue_positions(state, "default") == {"b1": 1, "a1": 2}
    assert state.queue_position("b1") == 1 and state.queue_position("a1") == 2
    release(state, "b0")  # b now holds nothing, a still 2: b's job first
    assert [p.job_id for p in schedule(state)] == ["b1"]
    release(state, "a0")  # a holds 0, b 1: a's turn
    assert [p.job_id for p in schedule(state)] == ["a1"]


def test_the_fair_choice_still_blocks_smaller_jobs_behind_it():
    """The chosen head needs 2 GPUs and 1 is free: another team's 1-GPU job does not jump it (no starvation)."""
    state = two_gpu_state()
    state.enqueue("b0", "default", 1, namespace="b")
    schedule(state)
    state.enqueue("a0", "default", 2, namespace="a")  # a holds nothing: its head is chosen
    state.enqueue("b1", "default", 1, namespace="b")
    assert schedule(state) == []
    release(state, "b0")
    assert schedule(state) == [Placement("a0", "default", ("sim0", "sim1"))]


def test_a_namespace_at_its_cap_waits_without_blocking_the_others():
    state = SchedulerState({"default": ("g0", "g1", "g2")}, caps={"vision": 1})
    for i in range(3):
        state.enqueue(f"v{i}", "default", 1, namespace="vision")
    assert [p.job_id for p in schedule(state)] == ["v0"]  # its cap: one GPU at once
    state.enqueue("n0", "default", 1, namespace="nlp")
    state.enqueue("n1", "default", 1, namespace="nlp")
    assert [p.job_id for p in schedule(state)] == ["n0", "n1"]
    release(state, "n0")
    assert schedule(state) == []  # vision is still at its cap; the free GPU waits for nlp or vision's end
    release(state, "v0")
    assert [p.job_id for p in schedule(state)] == ["v1"]
    assert state.gpus_held == {"vision": 1, "nlp": 1}


def test_the_cap_counts_every_class_together_and_refuses_what_could_never_fit():
    state = SchedulerState({"a": ("a0", "a1"), "b": ("b0", "b1")}, caps={"t": 2})
    state.enqueue("x", "a", 2, namespace="t")
    state.enqueue("y", "b", 1, namespace="t")
    assert [p.job_id for p in schedule(state)] == ["x"]
    release(state, "x")
    assert [p.job_id for p in schedule(state)] == ["y"]
    state.caps["t"] = 1
    with pytest.raises(ValueError, match="may hold 1"):
        state.enqueue("z", "a", 2, namespace="t")


def test_cpu_slots_go_round_the_namespaces_too():
    state = SchedulerState({}, cpu_slots=2)
    for i in range(4):
        state.enqueue(f"a{i}", None, 0, namespace="a")
    state.enqueue("b0", None, 0, namespace="b")
    assert [p.job_id for p in schedule(state)] == ["a0", "b0"]
    assert state.queue_position("a1") == 1
    release(state, "b0")
    assert [p.job_id for p in schedule(state)] == ["a1"]


def test_fair_positions_and_starts_match_the_walk_under_random_operations():
    """With several namespaces (1-GPU jobs), queue_position equals the walked start order, and every
    placement is the walk's first job at that moment."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    ops = st.lists(
        st.tuples(st.sampled_from(["enqueue", "schedule", "release"]), st.integers(0, 60), st.sampled_from("abc")),
        max_size=80,
    )

    @settings(max_examples=300, deadline=None)
    @given(ops)
    def check(operations):
        state = SchedulerState({"g": ("d0", "d1", "d2")})
        known: list[str] = []
        for op, pick, team in operations:
            if op == "enqueue":
                job_id = f"j{len(known)}"
                state.enqueue(job_id, "g", 1, namespace=team)
                known.append(job_id)
            elif op == "schedule":
                expected = list(queue_positions(state, "g"))
                placed = [p.job_id for p in state.schedule()]
                assert placed == expected[: len(placed)], operations
            elif known:
                state.release(known[pick % len(known)])
            walked = state.queue_positions("g")
            for job_id in known:
                assert state.queue_position(job_id) == walked.get(job_id), (job_id, operations)
            pool = state.pools["g"]
            assert sum(pool.levels.values()) == len(pool.devices) - len(pool.free)

    check()
