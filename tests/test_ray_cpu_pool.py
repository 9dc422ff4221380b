"""The Ray executor's CPU actor pool as plain bookkeeping (no Ray): slots, per-version reuse, LRU
retirement, cancel and idle expiry."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.executors.ray.pool import CpuActorPool

A, B, C = ("ns", "a"), ("ns", "b"), ("other", "a")


def test_jobs_start_in_order_up_to_the_slots_and_wait_for_a_free_one():
    pool = CpuActorPool(slots=2, idle_s=60)
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


def test_a_version_reuses_its_most_recently_idle_actor():
    pool = CpuActorPool(slots=3, idle_s=60)
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
    pool = CpuActorPool(slots=2, idle_s=60)
    for job_id, key, actor, now in (("1", A, "actor-a", 5.0), ("2", B, "actor-b", 1.0)):
        pool.submit(job_id, key)
        pool.dispatch()
        pool.bind(job_id, actor)
        pool.release(job_id, now=now, reuse=True)
    pool.submit("3", C)
    assert pool.dispatch() == ([("3", None)], ["actor-b"])  # B was idle longer
    assert pool.idle_count() == 1


def test_a_crashed_actor_is_not_kept_and_cancel_removes_queued_or_running_jobs():
    pool = CpuActorPool(slots=1, idle_s=60)
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
    pool = CpuActorPool(slots=3, idle_s=10)
    for job_id, key in (("1", A), ("2", B), ("3", C)):
        pool.submit(job_id, key)
    pool.dispatch()
    for job_id in ("1", "2", "3"):
        pool.bind(job_id, f"actor-{job_id}")
    pool.release("1", now=0.0, reuse=True)
    pool.release("2", now=5.0, reuse=True)
    assert pool.expire(now=12.0) == ["actor-1"]
    assert sorted(pool.clear()) == ["actor-2", "actor-3"]
    assert pool.idle_count() == 0 and pool.dispatch() == ([], [])


def test_a_bad_cpu_actor_count_is_refused_at_start_saying_what_to_use(monkeypatch):
    pytest.importorskip("ray")
    from lancefn_jupyter.server.executors.ray import RayExecutor

    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("LANCEFN_RAY_CPU_ACTORS", bad)
        with pytest.raises(ValueError, match="LANCEFN_RAY_CPU_ACTORS is .*use a whole number of at least 1"):
            RayExecutor()
    monkeypatch.setenv("LANCEFN_RAY_CPU_ACTORS", "3")
    RayExecutor()  # constructing starts nothing
