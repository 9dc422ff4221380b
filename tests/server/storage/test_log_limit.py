"""Job logs over all jobs stay under `--log-max-bytes` on every write: whole jobs' logs go, oldest first."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.storage.store import Store

pytestmark = pytest.mark.unit


def _log_bytes(store: Store) -> int:
    return store._query("SELECT COALESCE(SUM(LENGTH(CAST(line AS BLOB))), 0) FROM job_logs")[0][0]


def test_every_write_keeps_logs_under_the_limit_and_the_oldest_jobs_go_first(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    store.limit_logs(10_000)
    for job in range(30):
        pos = 0
        for _ in range(4):  # each job writes 4 × 250 bytes
            pos = store.append_logs(f"job{job:02d}", pos, "stdout", ["é" * 100 + "x" * 50])
            assert _log_bytes(store) <= 10_000
    kept = {row[0] for row in store._query("SELECT DISTINCT job_id FROM job_logs")}
    assert "job29" in kept and "job00" not in kept
    assert kept == {f"job{j:02d}" for j in range(30 - len(kept), 30)}  # a suffix: oldest went first
    assert store.pruned_log_lines("job00") == 4 and store.pruned_log_lines("job29") == 0
    assert store.next_log_pos("job00") == 4  # a pruned job that logs again goes on after its removed lines
    store.close()


def test_the_limit_applies_at_start_to_what_an_earlier_run_kept(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    for job in range(10):
        store.append_logs(f"j{job}", 0, "stdout", ["y" * 1000])
    store.close()
    again = Store(tmp_path / "db.sqlite3")
    again.limit_logs(5_000)
    assert _log_bytes(again) <= 5_000
    assert again.pruned_log_lines("j0") == 1
    again.close()
