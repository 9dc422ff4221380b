"""The results retention rule applies on every kept result (an index built by one scan at start), not now and then."""

from __future__ import annotations

import os

import pytest

from lancefn_jupyter.server.storage.files import DataStore

pytestmark = pytest.mark.unit


def _write(data: DataStore, job_id: str, size: int, mtime: float) -> None:
    path = data.result_path(job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


def _kept(data: DataStore) -> set[str]:
    return {p.stem for p in data.results_dir.glob("*.arrow")}


def test_every_kept_result_keeps_the_total_under_the_limit_oldest_first(tmp_path):
    data = DataStore(tmp_path, max_bytes=1000, max_age_s=3600)
    data.enforce_retention(now=0)
    removed: list[str] = []
    for i in range(40):
        _write(data, f"j{i:02d}", 300, mtime=float(i))
        removed += data.kept(f"j{i:02d}", now=float(i))
        on_disk = sum(p.stat().st_size for p in data.results_dir.glob("*.arrow"))
        assert on_disk <= 1000, (i, on_disk)  # on every write, not every 16th
    assert _kept(data) == {"j37", "j38", "j39"}
    assert removed == [f"j{i:02d}" for i in range(37)]


def test_age_limit_on_write_and_the_start_scan_sees_what_is_there(tmp_path):
    data = DataStore(tmp_path, max_bytes=10**9, max_age_s=100)
    for i in range(5):
        _write(data, f"old{i}", 10, mtime=float(i))
    _write(data, "new", 10, mtime=500.0)
    assert sorted(data.enforce_retention(now=550.0)) == [f"old{i}" for i in range(5)]  # at start
    assert _kept(data) == {"new"}
    _write(data, "newer", 10, mtime=700.0)
    assert data.kept("newer", now=700.0) == ["new"]  # past the age limit at the next write
    assert _kept(data) == {"newer"}


def test_a_result_larger_than_the_limit_alone_is_removed_itself(tmp_path):
    data = DataStore(tmp_path, max_bytes=100)
    data.enforce_retention()
    _write(data, "small", 50, mtime=1.0)
    assert data.kept("small", now=2.0) == []
    _write(data, "huge", 500, mtime=3.0)
    assert data.kept("huge", now=4.0) == ["small", "huge"]
    assert _kept(data) == set()


def test_a_released_result_is_gone_and_no_longer_counts_against_the_limit(tmp_path):
    """A backfill chunk's result, committed into its table, is released: the other results keep their room."""
    data = DataStore(tmp_path, max_bytes=1000, max_age_s=3600)
    data.enforce_retention(now=0)
    _write(data, "theirs", 400, mtime=1.0)
    assert data.kept("theirs", now=1.0) == []
    for i in range(5):  # a backfill's chunks, each released once its fragment committed
        _write(data, f"chunk{i}", 500, mtime=2.0 + i)
        assert data.kept(f"chunk{i}", now=2.0 + i) == []
        data.forget(f"chunk{i}")
        data.remove(f"chunk{i}")
        assert not data.result_path(f"chunk{i}").exists()
    assert _kept(data) == {"theirs"}  # never pushed out by the backfill
    _write(data, "next", 500, mtime=10.0)
    assert data.kept("next", now=10.0) == []  # 900 bytes kept: under the limit
    data.forget("never-written")  # nothing there: nothing happens
    data.remove("never-written")
    assert _kept(data) == {"theirs", "next"}
