"""Result staging (docs/ARCHITECTURE.md, "Result staging"): results land in reused memory slots, reach the home
off the reply's path, are never lost to a kill, and a slot a reader still maps is never written over."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.staging import ResultStaging, staging_dir_for, unshared
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.worker.protocol import result_target

pytestmark = pytest.mark.unit


def _staging(tmp_path: Path, **kwargs) -> ResultStaging:
    staging = ResultStaging(tmp_path / "home" / "data" / "results", tmp_path / "shm", **kwargs)
    staging.start()
    return staging


def _table(n: int, start: float = 0.0) -> pa.Table:
    return pa.table({"result": pa.array(np.arange(start, start + n, dtype=np.float64))})


def _write(staging: ResultStaging, job_id: str, table: pa.Table) -> Path:
    """What a worker does with the task's result fields, then what the control plane does on its result."""
    task = {"result_file": str(staging.results_dir / f"{job_id}.arrow"), **staging.task_fields(job_id)}
    path, slot = result_target(task, table.nbytes)
    if slot is not None:
        dataplane.write_ipc_into(slot, path, table)
    else:
        dataplane.write_ipc_file(path, table, durable=False)
    staging.staged(job_id)
    return Path(path)


def _read_found(staging: ResultStaging, final: Path, job_id: str) -> pa.Table:
    """What a reader does (the result route): where the result is now; found staged, it may be in the home by
    the time it is opened, so once more."""
    for _ in range(2):
        found = staging.find(final, job_id)
        assert found in (staging.staged_path(job_id), final)
        try:
            return dataplane.read_ipc(found)
        except FileNotFoundError:
            continue
    raise AssertionError(f"{job_id}: neither staged nor in the home")


def _wait_moved(staging: ResultStaging) -> None:
    assert staging.flush(timeout=30), "the spooler did not move the staged results"


def test_a_staged_result_reaches_the_home_whole_and_readers_find_it_throughout(tmp_path):
    staging = _staging(tmp_path)
    try:
        for size in (10_001, 4096 // 8, 1_000_000):  # a partial last block, exactly one block, 8 MB
            job_id = f"j{size}"
            want = _table(size)
            staged = _write(staging, job_id, want)
            final = staging.results_dir / f"{job_id}.arrow"
            assert staged.parent == tmp_path / "shm"
            assert _read_found(staging, final, job_id).equals(want)
            _wait_moved(staging)
            assert staging.find(final, job_id) == final and not staged.exists()
            assert dataplane.read_ipc(final).equals(want) and final.stat().st_size == os.path.getsize(final)
            assert (final.stat().st_mode & 0o777) == 0o600
    finally:
        staging.close()
    assert not (tmp_path / "shm").exists(), "a graceful stop leaves no staging directory behind"


def test_slots_are_reused_once_nobody_maps_them_and_never_while_a_reader_does(tmp_path):
    staging = _staging(tmp_path)
    try:
        _write(staging, "a", _table(1000))
        _wait_moved(staging)
        held = dataplane.read_ipc(staging.results_dir / "a.arrow")  # from the home: the slot is free
        fields = staging.task_fields("b")["result_stage"]
        assert "slot" in fields, "the freed slot is offered to the next job"
        dataplane.write_ipc_into(fields["slot"], fields["file"], _table(1000, 5.0))
        # A kernel's zero-copy view of b's staged slot, taken before the spooler is told: once told, it may
        # move the file before this thread runs again (CI saw it gone).
        mapped = dataplane.read_ipc(fields["file"])
        staging.staged("b")
        _wait_moved(staging)
        (free,) = [p for p in (tmp_path / "shm").iterdir() if p.name.startswith("free-")]
        assert not unshared(free), "the lease check sees the reader's mapping"
        assert "slot" not in staging.task_fields("c")["result_stage"]  # mapped: not handed out
        staging.discard("c")
        assert mapped.column(0).to_numpy()[:3].tolist() == [5.0, 6.0, 7.0]  # untouched under the reader
        assert held.column(0).to_numpy()[-1] == 999.0
        del mapped
        assert "slot" in staging.task_fields("d")["result_stage"]  # let go: reused
    finally:
        staging.close()


def test_what_a_kill_left_staged_is_in_the_home_after_the_next_start(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    want = _table(3000, 1.0)
    dataplane.write_ipc_file(shm / "k.arrow", want, durable=False)  # staged; the server died before moving it
    (shm / "k.arrow.tmp-999").write_bytes(b"half")  # a killed writer's temp file
    (shm / "x.slot").write_bytes(b"\0" * 8192)  # a slot a killed worker held
    again = ResultStaging(tmp_path / "home" / "data" / "results", shm)
    again.start()
    try:
        final = again.results_dir / "k.arrow"
        assert dataplane.read_ipc(final).equals(want)
        names = sorted(p.name for p in (tmp_path / "shm").iterdir())
        assert all(name.startswith("free-") for name in names) and len(names) == 2, names
    finally:
        again.close()


def test_retention_removing_a_staged_result_is_never_undone_by_the_spooler(tmp_path):
    data = DataStore(tmp_path / "home", max_bytes=1)
    data.staging = ResultStaging(data.results_dir, tmp_path / "shm")
    data.start()
    try:
        task = data.result_fields("r", arrow=True)
        path, _ = result_target(task, 8000)
        dataplane.write_ipc_file(path, _table(1000), durable=False)
        data.staging.staged("r")
        assert data.kept("r") == ["r"]  # over the limit alone: removed at once
        _wait_moved(data.staging)
        assert not data.find_result("r").exists() and not (tmp_path / "shm" / "r.arrow").exists()
    finally:
        data.close()


def test_orphans_and_limits(tmp_path):
    staging = _staging(tmp_path, max_file_bytes=1000, max_bytes=1)
    try:
        task = {"result_file": "/home/r.arrow", **staging.task_fields("big")}
        assert result_target(task, 5000) == ("/home/r.arrow", None)  # over max_file_bytes: to the home
        staged = _write(staging, "small", _table(10))
        assert staged.parent == tmp_path / "shm"
        assert staging.task_fields("next") == {}  # backlog over max_bytes: to the home directly
        _wait_moved(staging)
        stage = staging.task_fields("cancelled")["result_stage"]  # written, never taken: the job was cancelled
        dataplane.write_ipc_into(stage["slot"], stage["file"], _table(10))
        staging.discard("cancelled")
        assert not Path(stage["file"]).exists() and not Path(stage["slot"]).exists()
        assert not any(p.name.startswith("free-") for p in (tmp_path / "shm").iterdir())  # removed with it
    finally:
        staging.close()


def test_a_staging_directory_someone_else_made_is_not_used(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o755)  # not private: another user could read the results
    staging = ResultStaging(tmp_path / "results", shm)
    staging.start()
    assert not staging.enabled and staging.task_fields("j") == {}
    staging.close()
    assert staging_dir_for(tmp_path / "a") != staging_dir_for(tmp_path / "b")


def test_the_pool_gives_its_memory_back_when_idle(tmp_path):
    staging = _staging(tmp_path)
    try:
        _write(staging, "a", _table(100))
        _wait_moved(staging)
        assert any(p.name.startswith("free-") for p in (tmp_path / "shm").iterdir())
        staging._trim(0.0)
        assert not any(p.name.startswith("free-") for p in (tmp_path / "shm").iterdir())
    finally:
        staging.close()


def test_what_a_killed_worker_renamed_after_its_job_ended_goes_when_idle(tmp_path):
    staging = _staging(tmp_path)
    try:
        stage = staging.task_fields("late")["result_stage"]
        staging.discard("late")  # the job was cancelled; its worker, not dead yet, goes on writing
        dataplane.write_ipc_file(stage["file"], _table(10), durable=False)
        (tmp_path / "shm" / "gone.slot").write_bytes(b"\0" * 4096)  # a slot of a job long over
        staging._trim(0.0)
        names = [p.name for p in (tmp_path / "shm").iterdir()]
        assert "late.arrow" not in names and "gone.slot" not in names
        assert [n for n in names if n.startswith("free-")], "the orphan slot's pages went back to the pool"
    finally:
        staging.close()
