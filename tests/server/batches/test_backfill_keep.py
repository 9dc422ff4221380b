"""A backfill chunk's result is kept from retention by a hard link until its fragment commits
(docs/ARCHITECTURE.md, "Backfills", "Results"). A result still staged in memory is on another file system:
it is read where it is, never copied under the job table's lock, and linked once the spooler has moved it to
the home. In-process plane; the staged file lives in /dev/shm (tmpfs), the home under tmp_path."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from lancefn_jupyter.server.batches import commits as commits_module
from lancefn_jupyter.server.control.states import DONE
from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.policy.gpu_classes import simulated_default
from lancefn_jupyter.server.storage.store import Store

pytestmark = pytest.mark.unit

SHM = Path("/dev/shm")


@pytest.fixture
def plane(tmp_path):
    plane = ControlPlane(store=Store(tmp_path / "db.sqlite3"), classes=simulated_default(), executor=None)
    yield plane
    plane.shutdown()


@pytest.fixture
def staged_dir(tmp_path):
    if not SHM.is_dir() or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    path = Path(tempfile.mkdtemp(prefix="lancefn-keep-test-", dir=SHM))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _chunk_of_a_backfill() -> tuple[SimpleNamespace, SimpleNamespace, SimpleNamespace]:
    job_id = uuid.uuid4().hex
    batch = SimpleNamespace(batch_id=uuid.uuid4().hex)
    chunk = SimpleNamespace(idx=3, job_id=job_id)
    rec = SimpleNamespace(state=DONE, job_id=job_id, result={"arrow": True})
    return batch, chunk, rec


def test_a_staged_result_is_read_where_it_is_then_linked_once_it_is_in_the_home(plane, staged_dir, monkeypatch):
    batches = plane.batches.commits
    batch, chunk, rec = _chunk_of_a_backfill()
    staged = staged_dir / f"{rec.job_id}.arrow"
    staged.write_bytes(b"result bytes")
    home = plane.data.result_path(rec.job_id)
    where = {"path": staged}
    monkeypatch.setattr(plane.data, "find_result", lambda job_id: where["path"])
    copies: list = []
    monkeypatch.setattr(commits_module.shutil, "copyfile", lambda *args, **kwargs: copies.append(args))

    # Staged: the result itself, nothing copied or kept yet.
    assert batches.keep_result(batch, chunk, rec) == staged
    assert copies == []
    kept = batches.kept_dir / batch.batch_id / f"{chunk.idx}-{chunk.job_id}.arrow"
    assert not kept.exists()

    # The spooler moved it to the home: now kept, as a hard link to the home's file.
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_bytes(staged.read_bytes())
    staged.unlink()
    where["path"] = home
    assert batches.keep_result(batch, chunk, rec) == kept
    assert os.path.samefile(kept, home)
    assert copies == []
    # Kept: the link is the answer from now on, wherever the job's own file goes.
    home.unlink()
    assert batches.keep_result(batch, chunk, rec) == kept
    assert kept.read_bytes() == b"result bytes"


def test_a_result_that_is_gone_is_none(plane):
    batch, chunk, rec = _chunk_of_a_backfill()
    assert plane.batches.commits.keep_result(batch, chunk, rec) is None  # never written: the chunk is run again
