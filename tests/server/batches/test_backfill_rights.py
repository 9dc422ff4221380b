"""A backfill on a shared server reads and writes only files under its namespace's table root, whatever the
table directory holds (docs/ARCHITECTURE.md, "Backfills", "Which tables"): a root server with namespaces ``a``
and ``b``, ``--table-roots '<base>/{namespace}'``, each root owned by a uid of its own (no passwd entry) and
mode 0700, workers as ``nobody``.

Refused up front (403, naming the entry): links that leave the root, hard-linked files, mount points, a root
owned by root. And the I/O itself is the team's: a link swapped in after the checks (between a commit's start
and its write) meets the kernel's EACCES in the table agent; B's table never changes and no B row reaches A.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import python_body, register
from helpers import column, team_table_roots, two_teams, wait_until
from helpers import wait_backfill as wait

A_KEY, B_KEY = "rights-team-a-key-0001", "rights-team-b-key-0002"
KEYS = two_teams(A_KEY, B_KEY)
UIDS = {"a": 61170, "b": 61171}  # table roots' owners: no passwd entry has them
SECRET = "bsecret"  # B's texts: bsecret0 … bsecret49
TABLE_DIRS = ("_versions", "data", "_transactions")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root server (table roots of other uids)")

# Echoes its row (printed and returned); the row with b == 200 waits for GATE (a file) first.
ECHO = """from __future__ import annotations

import os
import time


def echo(text: str, b: int) -> str:
    print("row", text, flush=True)
    while b == 200 and not os.path.exists(GATE):
        time.sleep(0.02)
    return text + "!"
"""


class Teams:
    """Two namespaces' table roots under ``base``, a table in each (B's texts are its secret), and a server."""

    def __init__(self, factory, *, root_owner: dict[str, int] | None = None) -> None:
        self.base = team_table_roots({**UIDS, **(root_owner or {})}, {"b": SECRET})
        self.roots = {ns: self.base / ns for ns in UIDS}
        self.a_table, self.b_table = self.roots["a"] / "t.lance", self.roots["b"] / "t.lance"
        self.b_before = self.b_state()
        self.cp = factory(
            api_keys=KEYS, env={"LANCEFN_WORKER_USER": ""}, args=["--table-roots", f"{self.base}/{{namespace}}"]
        )

    def b_state(self) -> tuple:
        import lancedb

        table = lancedb.connect(str(self.roots["b"])).open_table("t")
        return table.version, table.schema.names, column(table, "text")

    def register(self, http, gate: Path | None = None) -> str:
        source = ECHO.replace("GATE", repr(str(gate or self.base / "open")))
        body = python_body("echo", source, (("text", "utf8", False), ("b", "int64", False)), "utf8")
        if gate is None:
            (self.base / "open").touch()
        return register(http, body)["version"]

    def request(self, version: str, **extra) -> dict:
        return {"name": "echo", "version": version, "table_uri": str(self.a_table), "into": "out", **extra}

    def link_into_b(self) -> None:
        """A's table directories become links into B's table (the originals set aside)."""
        for name in TABLE_DIRS:
            (self.a_table / name).rename(self.a_table / f"{name}.orig")
            (self.a_table / name).symlink_to(self.b_table / name)

    def nothing_of_b_reached(self, http) -> None:
        """B's table is as it was, and no job of A saw one of B's rows (results, failures, logs)."""
        assert self.b_state() == self.b_before
        for batch in http.post("/v1/batches/list", json={}).json()["batches"]:
            described = http.post("/v1/batches/describe", json={"batch_id": batch["batch_id"]}).json()
            for chunk in described["chunks"]:
                if chunk.get("job_id"):
                    job = http.post("/v1/jobs/describe", json={"job_id": chunk["job_id"]}).json()
                    logs = http.post("/v1/jobs/logs", json={"job_id": chunk["job_id"]}).json()
                    assert SECRET not in json.dumps(job) + json.dumps(logs), job
        assert "Traceback" not in self.cp.log_text()


def test_a_table_whose_directories_link_into_another_teams_table_is_refused(control_plane_factory):
    teams = Teams(control_plane_factory)
    teams.link_into_b()
    with teams.cp.http(A_KEY, timeout=60.0) as a:
        version = teams.register(a)
        reply = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"]))
        assert reply.status_code == 403, reply.text
        message = reply.json()["error"]["message"]
        assert "symbolic link that leads outside" in message and str(teams.roots["a"]) in message
        assert any(repr(name) in message for name in TABLE_DIRS), message
        assert a.post("/v1/batches/list", json={}).json()["batches"] == []
        teams.nothing_of_b_reached(a)


def test_a_link_swapped_in_after_the_checks_meets_the_kernel_and_a_later_read_is_refused(control_plane_factory):
    """The race: a commit checked and started (it waits for its fragment's second chunk), then A's directories
    become links into B's table. The agent, as A's uid, cannot write there; the retry's slice reads are refused."""
    teams = Teams(control_plane_factory)
    gate = teams.base / "gate"
    with teams.cp.http(A_KEY, timeout=60.0) as a:
        version = teams.register(a, gate)
        created = a.post(
            "/v1/backfills/create", json=teams.request(version, columns=["text", "b"], chunk_size=150, parallel=1)
        )
        assert created.status_code == 202, created.text
        batch_id, started = created.json()["batch_id"], created.json()["table_version"]

        def committing() -> bool:  # chunk 1 holds at the gate; fragment 0's commit added the column and waits
            import lance

            batch = a.post("/v1/batches/describe", json={"batch_id": batch_id}).json()
            states = [c["state"] for c in batch["chunks"]]
            return states[:2] == ["DONE", "IN_PROGRESS"] and lance.dataset(str(teams.a_table)).version > started

        wait_until(committing, "fragment 0's commit to start")
        teams.link_into_b()
        gate.touch()
        failed = wait(a, batch_id)
        assert failed["batch_state"] == "FAILED", failed
        assert f"writing fragment 0 with the rights of uid {UIDS['a']}" in failed["backfill"]["commit_failure"]
        teams.nothing_of_b_reached(a)

        assert a.post("/v1/batches/retry", json={"batch_id": batch_id}).status_code == 200
        again = wait(a, batch_id)
        assert again["batch_state"] == "FAILED", again
        refused = [c["failure"]["message"] for c in again["chunks"] if c.get("failure")]
        refused.append(again["failure"]["message"])
        assert any("symbolic link that leads outside" in message for message in refused), refused
        teams.nothing_of_b_reached(a)


def test_hard_links_and_mount_points_in_a_table_are_refused(control_plane_factory):
    teams = Teams(control_plane_factory)
    b_file = next((teams.b_table / "data").iterdir())
    linked = teams.a_table / "data" / "extra.lance"
    os.link(b_file, linked)
    with teams.cp.http(A_KEY, timeout=60.0) as a:
        version = teams.register(a)
        reply = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"]))
        assert reply.status_code == 403, reply.text
        assert "'data/extra.lance' has 2 hard links" in reply.json()["error"]["message"]
        linked.unlink()
        mount = teams.a_table / "more"
        mount.mkdir()
        done = subprocess.run(["mount", "--bind", str(teams.b_table / "data"), str(mount)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
        try:
            reply = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"]))
        finally:
            subprocess.run(["umount", str(mount)], check=True)
        assert reply.status_code == 403, reply.text
        assert "'more' is a mount point" in reply.json()["error"]["message"]
        teams.nothing_of_b_reached(a)


def test_direct_and_dotdot_paths_stay_refused_and_a_root_owned_by_root_is_refused(control_plane_factory):
    teams = Teams(control_plane_factory, root_owner={"a": 0})
    with teams.cp.http(A_KEY, timeout=60.0) as a:
        version = teams.register(a)
        for uri in (teams.b_table, teams.roots["a"] / ".." / "b" / "t.lance"):
            reply = a.post("/v1/backfills/create", json={**teams.request(version), "table_uri": str(uri)})
            assert reply.status_code == 403 and "outside the tables namespace 'a'" in reply.text, reply.text
        reply = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"]))
        assert reply.status_code == 403, reply.text
        assert f"`chown -R <team-user>: {teams.roots['a']}`" in reply.json()["error"]["message"]
        teams.nothing_of_b_reached(a)


def _agents(cp) -> list[psutil.Process]:
    server = psutil.Process(cp.proc.pid)
    return [p for p in server.children(recursive=True) if "lancefn_jupyter.tables.agent" in " ".join(p.cmdline())]


def test_a_backfill_on_a_shared_server_runs_through_its_teams_agent(control_plane_factory):
    import lancedb

    teams = Teams(control_plane_factory)
    before = set(teams.a_table.rglob("*"))
    with teams.cp.http(A_KEY, timeout=60.0) as a, teams.cp.http(B_KEY, timeout=60.0) as b:
        version = teams.register(a)
        created = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"], where="b % 3 = 0"))
        assert created.status_code == 202, created.text
        assert created.json()["rows_total"] == len(range(0, 500, 3))
        done = wait(a, created.json()["batch_id"])
        assert done["batch_state"] == "DONE", done
        table = lancedb.connect(str(teams.roots["a"])).open_table("t")
        assert column(table, "out") == [f"t{i % 50}!" if i % 3 == 0 else None for i in range(500)]
        written = set(teams.a_table.rglob("*")) - before  # the new column's files, manifests, transactions
        assert len(written) >= 4 and {p.stat().st_uid for p in written} == {UIDS["a"]}  # A's uid, not the server's
        (agent,) = _agents(teams.cp)
        assert agent.uids().real == UIDS["a"] and agent.gids().real == UIDS["a"]

        # An agent that died is started again for the next request.
        os.kill(agent.pid, signal.SIGKILL)
        wait_until(lambda: agent.status() == psutil.STATUS_ZOMBIE, "the agent to die")
        again = a.post("/v1/backfills/create", json=teams.request(version, columns=["text", "b"]))
        assert again.status_code == 202, again.text
        assert wait(a, again.json()["batch_id"])["batch_state"] == "DONE"
        assert column(lancedb.connect(str(teams.roots["a"])).open_table("t"), "out") == [
            f"t{i % 50}!" for i in range(500)
        ]

        # B's own backfill runs through B's agent, as B's uid.
        version_b = teams.register(b)
        request = {**teams.request(version_b, columns=["text", "b"]), "table_uri": str(teams.b_table)}
        created = b.post("/v1/backfills/create", json=request)
        assert created.status_code == 202, created.text
        assert wait(b, created.json()["batch_id"])["batch_state"] == "DONE"
        assert sorted(p.uids().real for p in _agents(teams.cp)) == sorted(UIDS.values())
    assert "Traceback" not in teams.cp.log_text()
