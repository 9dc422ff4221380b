"""Executors are plug-ins (docs/ARCHITECTURE.md, "Executor plug-ins"): a third executor registered from outside the
package (``plugin_pkg/``: a module and its ``*.dist-info/entry_points.txt``, put on the server's ``PYTHONPATH``) runs
a plain job, a batch and a backfill chunk through a real server; ``--executor`` accepts any registered name, and
``--help`` shows each plug-in's flags."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import SERVER_CMD, make_env, register, registration_body
from helpers import column, make_table, submit, table_dir, wait_backfill, wait_done

PLUGIN_PKG = Path(__file__).resolve().parent / "plugin_pkg"
NODE = "plugin-node-7"


def with_plugin() -> dict[str, str]:
    """The server's environment with the test package on its path (before the package's own)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGIN_PKG), os.environ.get("PYTHONPATH")]))}


def server(*args: str) -> subprocess.CompletedProcess:
    """``lancefn-server ARGS`` with the test package on its path, expected to end on its own (a refusal, --help)."""
    return subprocess.run([*SERVER_CMD, *args], env=make_env(with_plugin()), capture_output=True, text=True, timeout=60)


def test_a_minimal_executor_from_a_test_package_runs_a_job_a_batch_and_a_backfill_chunk(control_plane_factory):
    import lancedb

    cp = control_plane_factory(args=["--executor", "minimal", "--minimal-node", NODE], env=with_plugin())
    assert cp.info()["executor"] == "minimal"
    assert "executor plug-in 'broken'" in cp.log_text()  # left out, saying why; the others still load
    db_dir = table_dir()
    make_table(db_dir)
    with cp.http() as http:
        version = register(http, registration_body())["version"]
        job = wait_done(http, submit(http, "double", version, [{"x": 21}]))
        assert (job["job_state"], job["result"], job["placement"]["node"]) == ("DONE", [42], NODE), job

        chunks = [[{"x": 1}, {"x": 2}], [{"x": 3}]]
        reply = http.post("/v1/batches/create", json={"name": "double", "version": version, "chunks": chunks})
        assert reply.status_code == 202, reply.text
        batch = wait_backfill(http, reply.json()["batch_id"])
        assert batch["batch_state"] == "DONE", batch
        jobs = [wait_done(http, chunk["job_id"]) for chunk in batch["chunks"]]
        assert [job["result"] for job in jobs] == [[2, 4], [6]]
        assert {job["placement"]["node"] for job in jobs} == {NODE}

        table_uri = str(db_dir / "docs.lance")
        body = {"name": "double", "version": version, "table_uri": table_uri, "into": "twice", "columns": {"x": "b"}}
        reply = http.post("/v1/backfills/create", json={**body, "chunk_size": 400})
        assert reply.status_code == 202, reply.text
        backfill = wait_backfill(http, reply.json()["batch_id"])
        assert backfill["batch_state"] == "DONE", backfill
        chunk = wait_done(http, backfill["chunks"][0]["job_id"])
        assert chunk["spec"]["table_slice"]["uri"] == table_uri and chunk["placement"]["node"] == NODE
    table = lancedb.connect(str(db_dir)).open_table("docs")
    assert column(table, "twice") == [2 * b for b in column(table, "b")] == [2 * i for i in range(500)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--executor", "nope"], "invalid choice: 'nope' (choose from 'local', 'minimal', 'ray')"),
        (["--executor", "minimal", "--minimal-node", " "], "--minimal-node must name a node"),  # its build refuses
        (["--executor", "minimal", "--worker-uids", "61000-61999"], "--worker-uids applies to the local executor only"),
        (["--executor", "minimal", "--worker-max-procs", "8"], "applies to the local executor only (the minimal"),
    ],
)
def test_a_start_the_executors_refuse_exits_2_saying_why(tmp_path, args, message):
    done = server("--home", str(tmp_path / "home"), "--port", "0", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "home" / "server.json").exists()


def test_help_lists_every_plug_ins_own_flags():
    done = server("--help")
    assert done.returncode == 0, done.stderr
    for group, flag in [
        ("local executor (--executor local)", "--worker-uids"),
        ("local executor (--executor local)", "--max-idle-workers"),
        ("Ray executor (--executor ray)", "--ray-address"),
        ("minimal executor (--executor minimal)", "--minimal-node"),
    ]:
        section = done.stdout.split(f"\n{group}:\n")[1].split("\n\n")[0]  # the group's own lines
        assert f"  {flag} " in section, (group, flag, done.stdout)
