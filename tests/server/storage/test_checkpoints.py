"""WAL checkpoints run on a thread of their own, not inside a commit (``storage/store.py``): the WAL stays
bounded over a steady stream of commits, and closing the store ends the thread."""

from __future__ import annotations

import itertools
import os
import threading

import pytest

from lancefn_jupyter.server.storage.store import CHECKPOINT_EVERY, WAL_KEPT_BYTES, JobRecord, Store

pytestmark = pytest.mark.unit

PAGE = 4096


def _threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "lancefn-checkpoints"]


_ids = itertools.count()


def _commit_jobs(store: Store, count: int) -> None:
    """``count`` commits of one new job each (ids job-000000, job-000001, … across calls)."""
    for _ in range(count):
        n = next(_ids)
        store.insert_job(JobRecord(job_id=f"job-{n:06d}", job_type="run_function", state="PENDING", creation_ms=n))


def test_the_wal_stays_bounded_under_steady_commits_and_closing_ends_the_thread(tmp_path):
    before = len(_threads())
    store = Store(tmp_path / "db.sqlite3")
    wal = tmp_path / "db.sqlite3-wal"
    commits = 40 * CHECKPOINT_EVERY
    _commit_jobs(store, commits)  # back to back: checkpoints beside them alone would never complete
    assert len(_threads()) == before + 1
    # Every commit appends a few pages (more than 4,000 × 4 KiB in all): the WAL started over, again and again.
    assert commits * PAGE > 1.5 * WAL_KEPT_BYTES >= wal.stat().st_size
    store.close()
    assert len(_threads()) == before
    assert not os.path.exists(wal) or wal.stat().st_size == 0  # the last connection checkpointed the rest
    reopened = Store(tmp_path / "db.sqlite3")
    assert len(reopened.query("SELECT job_id FROM jobs")) == commits
    reopened.close()
