"""A run queued on the event loop (``Intake.admit_on_loop``) and the jobs of several requests saved in one commit
(``save_on_loop``/``save_group``; docs/ARCHITECTURE.md, "REST details"), with a recording executor in place of workers:
the loop never waits for the job table or the store, a job is in the store only once saved, and a commit that
fails drops only the jobs that could not be saved alone.  The same path over HTTP, with a SIGKILL after the
replies, is in tests/server/http/test_submits.py."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
from conftest import registration_body
from helpers import RecordingExecutor, admit, in_process_plane

from lancefn_jupyter.server.control.intake import ON_LOOP_MAX_ROWS, JobRequest
from lancefn_jupyter.server.plane import ControlPlane


@pytest.fixture
def plane(tmp_path):
    plane = in_process_plane(tmp_path, RecordingExecutor())
    # A loop that never runs: deferred changes wait for their save (its 10 ms timer never fires).
    plane.table.loop = loop = asyncio.new_event_loop()
    yield plane
    plane.table.loop = None
    plane.shutdown()
    loop.close()


def _version(plane: ControlPlane, body: dict | None = None) -> str:
    rec = plane.jobs.record(plane.catalog.register(body or registration_body()).job_id)
    assert rec is not None and rec.state == "DONE", rec
    version = rec.result["version"]
    admit(plane, "double", version, [{"x": 0}])  # its first job decides that it needs no environment
    return version


def _on_loop(plane: ControlPlane, version: str, rows) -> str | None:
    """A run of ``double`` the event loop would queue (the grouped lane's first try)."""
    return plane.intake.admit_on_loop(JobRequest("double", version, {}, rows=rows))


def _stored(plane: ControlPlane, job_id: str) -> sqlite3.Row | None:
    """The job's row and events as a fresh connection reads them (what a restart would find)."""
    db = sqlite3.connect(plane.store.path)
    try:
        row = db.execute("SELECT state FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        events = db.execute("SELECT COUNT(*) FROM events WHERE job_id=?", (job_id,)).fetchone()[0]
    finally:
        db.close()
    return None if row is None else (row[0], events)


def _held_elsewhere(lock_holder) -> tuple[threading.Event, threading.Event, threading.Thread]:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock_holder():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return held, release, thread


def test_a_run_queued_on_the_loop_is_stored_only_once_saved_with_its_first_event(plane):
    version = _version(plane)
    job_id = _on_loop(plane, version, [{"x": 1}, {"x": 2}])
    assert job_id is not None
    assert plane.jobs.record(job_id).state == "PENDING"  # queued (and launched: a GPU was free)
    assert _stored(plane, job_id) is None  # nothing on disk yet: its id is not answered yet
    assert plane.intake.save_on_loop([job_id]) == {}
    state, events = _stored(plane, job_id)
    assert state == "PENDING" and events == 1  # its placement event, in the same commit
    assert plane.intake.save_on_loop([job_id]) == {}  # saved already: nothing to do


def test_the_loop_never_waits_for_the_table_or_the_store(plane):
    version = _version(plane)
    for holder in (lambda: plane.table.lock, plane.store.batch):  # a core thread's work; a commit under way
        _, release, thread = _held_elsewhere(holder)
        try:
            assert _on_loop(plane, version, [{"x": 1}]) is None
            assert plane.intake.save_on_loop(["anything"]) is None
        finally:
            release.set()
            thread.join(10)
    assert _on_loop(plane, version, [{"x": 1}]) is not None


def test_what_the_loop_leaves_to_a_core_thread(plane):
    body = registration_body()
    version = plane.jobs.record(plane.catalog.register(body).job_id).result["version"]
    assert _on_loop(plane, version, [{"x": 1}]) is None  # its environment not decided yet
    admit(plane, "double", version, [{"x": 0}])
    assert _on_loop(plane, version, [{"x": i} for i in range(ON_LOOP_MAX_ROWS + 1)]) is None
    assert _on_loop(plane, version, {"not": "a list"}) is None
    with pytest.raises(Exception, match="not found"):  # its own errors are the request's, as from ``admit``
        _on_loop(plane, "0" * 16, [{"x": 1}])


def test_a_failed_commit_saves_each_job_alone_and_drops_only_those_that_still_fail(plane, monkeypatch):
    version = _version(plane)
    good, bad = (_on_loop(plane, version, [{"x": x}]) for x in (1, 2))
    assert good and bad
    insert = plane.store.insert_job

    def full_for_bad(rec, rows=None):
        if rec.job_id == bad:
            raise sqlite3.OperationalError("database or disk is full")
        insert(rec, rows)

    monkeypatch.setattr(plane.store, "insert_job", full_for_bad)
    failures = plane.intake.save_group([good, bad])
    assert list(failures) == [bad] and "full" in str(failures[bad])
    assert _stored(plane, good) is not None and plane.jobs.record(good).state == "PENDING"
    assert _stored(plane, bad) is None and bad not in plane.table.active  # nothing of it is kept
    assert plane.table.scheduler.release(bad) == ()  # nor its place or devices


def test_a_queued_job_launched_before_its_save_gets_its_rows(plane):
    version = _version(plane)  # its first job holds one GPU
    executor = plane.table.executor
    first = executor.tasks[-1].job_id
    admit(plane, "double", version, [{"x": 9}])  # the other GPU
    queued = _on_loop(plane, version, [{"x": 5}, {"x": 6}])
    assert queued is not None and plane.jobs.record(queued).devices == ()  # behind both GPUs
    assert _stored(plane, queued) is None  # its request's save is still to come
    executor.callbacks.task_succeeded(first, [0])  # a GPU frees: the queued job is launched now
    task = executor.tasks[-1]
    assert task.job_id == queued and task.rows == [{"x": 5}, {"x": 6}]  # from memory: the store has none yet
    assert plane.intake.save_on_loop([queued]) == {}
    assert _stored(plane, queued)[0] == "PENDING"  # placed, not started: its start is the executor's to report
