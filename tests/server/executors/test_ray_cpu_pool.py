"""The Ray executor's actor pool as plain bookkeeping (no Ray): slots, per-version reuse, LRU
retirement, cancel and idle expiry; for GPU classes, jobs weighted by their GPUs."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.executors.ray.pool import ActorPool

A, B, C = ("ns", "a"), ("ns", "b"), ("other", "a")


def test_jobs_start_in_order_up_to_the_slots_and_wait_for_a_free_one():
    pool = ActorPool(slots=2, idle_s=60)
    for job_id, key in (("1", A), ("2", A), ("3", B)):
        pool.submit(job_id, key)
    starts, retire = pool.dispatch()
    assert starts == [("1", None), ("2", None)] and retire == []  # two new actors; job 3 waits
    assert pool.bind("1", "actor-a1") and pool.bind("2", "actor-a2")
    assert pool.dispatch() == ([], [])
    assert pool.release("1", now=10.0, reuse=True) is None  # idle, warm for A
    starts, retire = pool.dispatch()
    # Job 3 (another version) never gets A's actor: A's idle actor retires to make room.
    assert starts == [("3", None)] and retire == ["actor-a1"]


def test_a_new_version_with_the_same_setup_key_takes_the_idle_actor_of_an_earlier_one():
    pool = ActorPool(slots=1, idle_s=60)
    pool.submit("1", A, setup="s")
    pool.dispatch()
    pool.bind("1", "actor-a")
    pool.release("1", now=1.0, reuse=True)
    pool.submit("2", B, setup="s")  # another version, same setup key ("Setup reuse")
    assert pool.dispatch() == ([("2", "actor-a")], [])
    assert pool.reused_from("2") == A and pool.reused_from("2") is None  # said once
    pool.release("2", now=2.0, reuse=True)  # the actor now serves B
    pool.submit("3", B, setup="s")
    assert pool.dispatch() == ([("3", "actor-a")], []) and pool.reused_from("3") is None  # its own now
    pool.release("3", now=3.0, reuse=True)
    pool.submit("4", C, setup="other")  # another setup key: never this actor
    assert pool.dispatch() == ([("4", None)], ["actor-a"])
    pool.bind("4", "actor-c")
    pool.release("4", now=4.0, reuse=True)
    pool.submit("5", A)  # no setup key (state=per_job, reuse_setup=no): only its own actors
    assert pool.dispatch() == ([("5", None)], ["actor-c"])


def test_a_version_reuses_its_most_recently_idle_actor():
    pool = ActorPool(slots=3, idle_s=60)
    for job_id in ("1", "2"):
        pool.submit(job_id, A)
    pool.dispatch()
    pool.bind("1", "old")
    pool.bind("2", "new")
    pool.release("1", now=1.0, reuse=True)
    pool.release("2", now=2.0, reuse=True)
    pool.submit("3", A)
    assert pool.dispatch() == ([("3", "new")], [])
    assert pool.idle_count() == 1


def test_the_least_recently_used_idle_actor_of_another_key_retires_first():
    pool = ActorPool(slots=2, idle_s=60)
    for job_id, key, actor, now in (("1", A, "actor-a", 5.0), ("2", B, "actor-b", 1.0)):
        pool.submit(job_id, key)
        pool.dispatch()
        pool.bind(job_id, actor)
        pool.release(job_id, now=now, reuse=True)
    pool.submit("3", C)
    assert pool.dispatch() == ([("3", None)], ["actor-b"])  # B was idle longer
    assert pool.idle_count() == 1
    # The bridge retires idle actors itself when Ray does not place a new one (GPUs on the wrong node).
    assert pool.retire_least_recent() == "actor-a" and pool.retire_least_recent() is None


def test_a_crashed_actor_is_not_kept_and_cancel_removes_queued_or_running_jobs():
    pool = ActorPool(slots=1, idle_s=60)
    pool.submit("1", A)
    pool.submit("2", A)
    pool.submit("3", B)
    pool.dispatch()
    pool.bind("1", "actor")
    assert pool.release("1", now=1.0, reuse=False) == "actor"  # crashed: to be killed
    assert pool.remove("2") is None  # queued: just dropped
    assert pool.dispatch() == ([("3", None)], [])
    pool.bind("3", "actor-b")
    assert pool.remove("3") == "actor-b"  # running: its actor is killed, the slot freed
    assert pool.bind("3", "late") is False  # an actor created after the cancel is not kept
    pool.submit("4", A)
    assert pool.dispatch() == ([("4", None)], [])


def test_idle_actors_expire_and_clear_returns_every_actor():
    pool = ActorPool(slots=3, idle_s=10)
    for job_id, key in (("1", A), ("2", B), ("3", C)):
        pool.submit(job_id, key)
    pool.dispatch()
    for job_id in ("1", "2", "3"):
        pool.bind(job_id, f"actor-{job_id}")
    pool.release("1", now=0.0, reuse=True)
    pool.release("2", now=5.0, reuse=True)
    assert pool.retire_times() == [10.0, 15.0]  # idle since + idle_s, soonest first (the usage's warm line)
    assert pool.expire(now=12.0) == ["actor-1"]
    assert pool.retire_times() == [15.0]
    assert sorted(pool.clear()) == ["actor-2", "actor-3"]
    assert pool.idle_count() == 0 and pool.dispatch() == ([], [])


def test_a_burst_of_one_version_on_one_gpu_runs_on_one_actor_one_job_at_a_time():
    pool = ActorPool(slots=1, idle_s=60)
    for job_id in ("1", "2", "3"):
        pool.submit(job_id, A, weight=1)
    assert pool.dispatch() == ([("1", None)], [])
    pool.bind("1", "warm")
    assert pool.dispatch() == ([], [])  # the GPU is busy
    for job_id, later in (("1", "2"), ("2", "3")):
        pool.release(job_id, now=1.0, reuse=True)
        assert pool.dispatch() == ([(later, "warm")], [])  # the same actor, no new one
    pool.submit("4", B, weight=1)
    pool.release("3", now=2.0, reuse=True)
    assert pool.dispatch() == ([("4", None)], ["warm"])  # another version: its own actor; the idle one frees the GPU


def test_gpu_jobs_weigh_their_gpus_and_start_in_order_behind_a_waiting_head():
    pool = ActorPool(slots=2, idle_s=60)
    for job_id, key, weight in (("1", A, 1), ("2", A, 1), ("3", B, 2), ("4", A, 1)):
        pool.submit(job_id, key, weight)
    assert pool.dispatch() == ([("1", None), ("2", None)], [])
    pool.bind("1", "a1")
    pool.bind("2", "a2")
    pool.release("1", now=1.0, reuse=True)
    # The 2-GPU head waits for the busy GPU, and job 4 waits behind it (as the local scheduler
    # does), though A's idle actor could run it: a stream of 1-GPU jobs never starves the head.
    assert pool.dispatch() == ([], [])
    pool.release("2", now=2.0, reuse=True)
    assert pool.dispatch() == ([("3", None)], ["a1", "a2"])  # both idle actors hold the GPUs it needs
    pool.bind("3", "b")
    assert pool.busy_weight() == 2 and pool.idle_weight() == 0
    assert pool.remove("3") == "b"  # cancelled: its actor is killed, its GPUs freed
    assert pool.dispatch() == ([("4", None)], [])


def test_with_nothing_running_a_job_heavier_than_the_class_starts_so_ray_sees_its_demand():
    pool = ActorPool(slots=1, idle_s=60)
    pool.submit("1", A, weight=1)
    pool.dispatch()
    pool.bind("1", "small")
    pool.release("1", now=1.0, reuse=True)
    pool.submit("2", B, weight=2)  # no node fits it yet: Ray holds its actor until one joins
    pool.submit("3", A, weight=1)
    assert pool.dispatch() == ([("2", None)], ["small"])
    pool.bind("2", "big")
    assert pool.dispatch() == ([], [])  # job 3 waits for it
    pool.slots = 2  # a bigger node joined
    pool.release("2", now=2.0, reuse=True)
    assert pool.dispatch() == ([("3", None)], ["big"])  # B's idle actor holds both GPUs: it retires


def test_a_bad_cpu_actor_count_is_refused_at_start_saying_what_to_use(monkeypatch):
    pytest.importorskip("ray")
    from lancefn_jupyter.server.executors.ray import RayExecutor

    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("LANCEFN_RAY_CPU_ACTORS", bad)
        with pytest.raises(ValueError, match="LANCEFN_RAY_CPU_ACTORS is .*use a whole number of at least 1"):
            RayExecutor()
    monkeypatch.setenv("LANCEFN_RAY_CPU_ACTORS", "3")
    RayExecutor()  # constructing starts nothing
