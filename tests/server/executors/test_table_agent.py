"""A team's backfill table I/O (docs/ARCHITECTURE.md, "Backfills", "Which tables"): the tree check's refusals
and what it remembers (``table_tree.py``, on real directories), and the table agent itself (``table_agent.py``),
a process of the table root's owner, which meets the kernel's EACCES where a link leads into another team's 0700
tree: what a link swapped in between the check and the read would lead to."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
from helpers import make_table, task_spec, team_table_roots, wait_until

from lancefn_jupyter.server.executors.table_agent import RemotePlanSource, TableAccessError, TableAgents
from lancefn_jupyter.server.executors.table_tree import TreeCheck, tree_problem
from lancefn_jupyter.tables.plan import TableError
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.backfill_models import TableSlice
from lancefn_jupyter.wire.task_models import TaskData

UIDS = {"a": 61172, "b": 61173}  # no passwd entry has them
SECRET = "bsecret"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (an agent of another uid)")


@pytest.fixture
def tree(tmp_path):
    """A root holding a table directory with the usual layout, and a sibling outside the root."""
    root, outside = tmp_path / "root", tmp_path / "elsewhere"
    table = root / "t.lance"
    for name in ("_versions", "data", "_transactions"):
        (table / name).mkdir(parents=True)
        (table / name / "1.bin").write_bytes(b"x")
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    return str(root), str(table), outside


@pytest.mark.unit
def test_a_clean_table_passes_and_each_kind_of_entry_that_leaves_the_root_is_named(tree):
    root, table, outside = tree
    assert tree_problem(table, root) is None
    data = Path(table) / "data"

    (data / "link").symlink_to(outside / "secret")
    assert "'data/link' is a symbolic link that leads outside" in tree_problem(table, root)
    (data / "link").unlink()

    (data / "inside").symlink_to(Path(root))  # a link that stays in the root is followed, and its target checked
    assert tree_problem(table, root) is None
    os.mkfifo(Path(root) / "fifo")
    assert "is not a file, a directory or a symbolic link" in tree_problem(table, root)
    (data / "inside").unlink()

    os.link(outside / "secret", data / "hard.bin")
    assert "'data/hard.bin' has 2 hard links" in tree_problem(table, root)
    (data / "hard.bin").unlink()

    assert "holds more than 3 entries" in tree_problem(table, root, max_entries=3)


@pytest.mark.unit
def test_a_table_path_that_comes_to_lead_outside_is_refused(tree):
    root, table, outside = tree
    check = TreeCheck()
    assert check.problem(table, root) is None
    moved = Path(root) / "moved.lance"
    os.rename(table, moved)
    Path(table).symlink_to(outside)
    assert "now leads outside" in check.problem(table, root)


@pytest.mark.unit
def test_a_remembered_clean_walk_notices_every_change_that_matters(tree, monkeypatch):
    root, table, outside = tree
    check = TreeCheck()
    walks = []
    real_scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path: walks.append(path) or real_scandir(path))
    assert check.problem(table, root) is None
    listed = len(walks)
    assert check.problem(table, root) is None and len(walks) == listed  # unchanged: not listed again

    versions = Path(table) / "_versions"
    os.rename(versions, Path(table) / "_versions.orig")  # a directory swapped for a link out of the root
    versions.symlink_to(outside)
    assert "'_versions' is a symbolic link that leads outside" in check.problem(table, root)
    versions.unlink()
    os.rename(Path(table) / "_versions.orig", versions)
    assert check.problem(table, root) is None

    (Path(root) / "shared").mkdir()  # a link inside the root, whose own target is then swapped
    (Path(table) / "data" / "more").symlink_to(Path(root) / "shared")
    assert check.problem(table, root) is None
    (Path(root) / "shared").rmdir()
    (Path(root) / "shared").symlink_to(outside)
    assert "leads outside" in check.problem(table, root)


def _slice(table: Path, root: Path) -> TableSlice:
    return TableSlice(
        uri=str(table), table_version=1, fragment=0, ranges=((0, 10),), columns={"text": "text"}, root=str(root)
    )


def _results_file(values: list[str]) -> int:
    fd = os.memfd_create("results")
    os.write(fd, dataplane.to_ipc_bytes(dataplane.encode_results(values, "utf8", many=True)))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@as_root
def test_the_agent_meets_the_kernel_where_a_link_leads_into_another_teams_tree():
    """No check here: the agent is asked directly, as the race would leave it, to read and write A's table whose
    directories lead into B's 0700 root. It works on A's own table; through the links the kernel refuses it."""
    import lancedb

    base = team_table_roots(UIDS, {"b": SECRET})
    root_a, a_table, b_table = base / "a", base / "a" / "t.lance", base / "b" / "t.lance"
    b_before = lancedb.connect(str(base / "b")).open_table("t").version
    agents = TableAgents()
    try:
        agent = agents.agent(str(root_a))
        assert RemotePlanSource(agent, str(a_table)).schema.names == ["id", "text", "a", "b"]
        rows_file = tempfile.mktemp(dir="/tmp")
        agents.read_slice(_slice(a_table, root_a), {"text": "utf8"}, rows_file)
        assert dataplane.read_ipc(rows_file).column("text").to_pylist() == [f"t{i}" for i in range(10)]

        for name in ("_versions", "data", "_transactions"):
            (a_table / name).rename(a_table / f"{name}.orig")
            (a_table / name).symlink_to(b_table / name)
        with pytest.raises(TableError, match="Permission denied"):
            RemotePlanSource(agent, str(a_table))
        with open(rows_file, "wb") as handle:
            reply = agent.call(
                {"op": "slice", "slice": _slice(a_table, root_a).to_wire(), "input_types": {"text": "utf8"}},
                [handle.fileno()],
            )
        assert "Permission denied" in reply["error"] and Path(rows_file).stat().st_size == 0
        commit = {
            "op": "commit",
            "uri": str(a_table),
            "fragment": 0,
            "into": "out",
            "output_type": "utf8",
            "version": "v1",
            "parts": [[[0, 10]]],
        }
        reply = agent.call(commit, load=lambda index: _results_file([f"from a {i}" for i in range(10)]))
        assert "Permission denied" in reply["error"], reply
        with pytest.raises(TableAccessError, match="is a symbolic link that leads outside"):
            agents.read_slice(_slice(a_table, root_a), {"text": "utf8"}, rows_file)  # the check, as servers do
        os.unlink(rows_file)
    finally:
        agents.close()
    after = lancedb.connect(str(base / "b")).open_table("t")
    assert after.version == b_before and "out" not in after.schema.names


@as_root
def test_a_table_root_owned_by_root_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    make_table(root, "t")
    with pytest.raises(TableAccessError, match="belongs to root") as refused:
        TableAgents().agent(str(root))
    assert refused.value.status == 403


@as_root
def test_an_agent_that_dies_during_a_request_fails_it_saying_so_and_is_started_again():
    base = team_table_roots({"a": UIDS["a"]})
    root, table = str(base / "a"), str(base / "a" / "t.lance")
    agents = TableAgents()

    def die() -> int:  # the commit reached its first chunk: the agent dies before it gets the file
        (agent,) = [p for p in psutil.Process().children() if "lancefn_jupyter.tables.agent" in p.cmdline()]
        agent.kill()
        agent.wait()
        return _results_file([f"from a {i}" for i in range(300)])

    try:
        with pytest.raises(TableAccessError, match="stopped during the request"):
            agents.commit(root, table, 0, into="out", output_type="utf8", version="v1", parts=[([[0, 300]], die)])
        rows_file = tempfile.mktemp(dir="/tmp")
        agents.read_slice(_slice(base / "a" / "t.lance", base / "a"), {"text": "utf8"}, rows_file)  # a new agent
        assert dataplane.read_ipc(rows_file).num_rows == 10
        os.unlink(rows_file)
    finally:
        agents.close()


class _Failures:
    """The executor callbacks a slice read can make: failures, recorded."""

    def __init__(self) -> None:
        self.failed: dict[str, object] = {}
        self.done = threading.Event()

    def task_failed(self, job_id, failure, **_):
        self.failed[job_id] = failure
        self.done.set()

    def event_loop(self):
        return None


@as_root
def test_a_ray_task_of_a_teams_slice_gets_rows_its_agent_read_not_the_slice():
    """The Ray executor's side ("Running a chunk"): a slice naming its table root is read by the team's agent on a
    thread of the executor, and the task goes on with the rows file (a Ray worker has Ray's rights, not the team's);
    a refused slice fails the job in phase ``validation``. No Ray cluster: the task waits in the executor's buffer."""
    pytest.importorskip("ray")
    from lancefn_jupyter.server.executors.base import TaskSpec
    from lancefn_jupyter.server.executors.ray.executor import RayExecutor

    base = team_table_roots({"a": UIDS["a"]})
    root, table = base / "a", base / "a" / "t.lance"
    executor = RayExecutor()
    executor.table_agents = TableAgents()
    executor._callbacks = callbacks = _Failures()
    rows_file = tempfile.mktemp(dir="/tmp")

    def task(job_id: str) -> TaskSpec:
        data = TaskData(input_types={"text": "utf8"}, rows_file=rows_file)
        return task_spec(job_id, namespace="a", data=data, table_slice=_slice(table, root))

    try:
        executor.launch(task("j1"))
        wait_until(lambda: executor._buffer, "the task to be launched with its rows")
        (launched,) = executor._buffer
        assert launched.job_id == "j1" and launched.table_slice is None
        assert dataplane.read_ipc(rows_file).column("text").to_pylist() == [f"t{i}" for i in range(10)]
        (table / "data" / "out").symlink_to("/etc")
        executor.launch(task("j2"))
        assert callbacks.done.wait(30)
        assert callbacks.failed["j2"].phase == "validation" and "leads outside" in callbacks.failed["j2"].message
    finally:
        executor.table_agents.close()
        os.unlink(rows_file)
