"""Pausing and resuming a batch or a backfill (docs/ARCHITECTURE.md, "Batches": pause): no new chunk starts, the
running one finishes and is kept, the pause survives a restart, and LanceDB 0.40's client pauses, resumes, lists and
follows it by id."""

from __future__ import annotations

import inspect
from pathlib import Path

import lancedb
import pytest
from conftest import python_body, register, registration_body
from helpers import DEADLINE_S, column, gated, new_table, wait_backfill, wait_until


@pytest.fixture
def server(control_plane_factory):
    return control_plane_factory()


def gated_batch(http, gate: str, chunks: int) -> str:
    """A batch of ``chunks`` one-row chunks of ``gated`` (each waits for ``gate``), one at a time; its id."""
    body = registration_body(
        "gate",
        source=inspect.getsource(gated),
        entrypoint="gated",
        inputs=(("path", "utf8", False), ("value", "int64", False)),
    )
    version = register(http, body)["version"]
    rows = [[{"path": gate, "value": v}] for v in range(chunks)]
    created = http.post("/v1/batches/create", json={"name": "gate", "version": version, "chunks": rows, "parallel": 1})
    assert created.status_code == 202, created.text
    return created.json()["batch_id"]


def describe(http, batch_id: str) -> dict:
    return http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()


def client(server):
    return lancedb.connect("db://lancefn", api_key=server.api_key, host_override=server.url)


def pause_while_one_runs(server, batch_id: str, gate: Path, chunks: int) -> dict:
    """Pause with LanceDB's client while the first of ``chunks`` runs, then let it end: the batch as then, the chunk
    that ran kept and none started after it (the next would start in the same step)."""
    db = client(server)
    assert db.pause_job(batch_id) == "pausing"
    assert db.pause_job(batch_id) == "already_paused"
    gate.touch()
    with server.http() as http:
        paused = wait_until(
            lambda: (b := describe(http, batch_id))["chunk_counts"].get("DONE") == 1 and b, "the running chunk ends"
        )
    assert paused["paused"] is True and paused["chunk_counts"] == {"DONE": 1, "PENDING": chunks - 1}
    assert [c.get("job_id") is not None for c in paused["chunks"]] == [True] + [False] * (chunks - 1)
    return paused


def restart_then_resume(server, batch_id: str, chunks: int) -> None:
    """Restart the server: the batch is still paused as it was; then resume it with LanceDB's client."""
    server.restart()
    with server.http() as http:
        after = describe(http, batch_id)
    assert after["paused"] is True and after["chunk_counts"] == {"DONE": 1, "PENDING": chunks - 1}
    db = client(server)
    assert db.open_job(batch_id).status() == "PAUSED"
    assert db.resume_job(batch_id) == "resumed"


def test_pause_keeps_the_running_chunk_starts_none_survives_a_restart_and_resumes(server, tmp_path):
    gate = str(tmp_path / "gate")
    with server.http() as http:
        batch_id = gated_batch(http, gate, 4)
        wait_until(lambda: describe(http, batch_id)["chunk_counts"].get("IN_PROGRESS") == 1, "the first chunk runs")

    paused = pause_while_one_runs(server, batch_id, Path(gate), 4)
    with server.http() as http:
        as_job = http.post("/v1/jobs/describe", json={"job_id": batch_id}).json()
        assert (as_job["job_type"], as_job["job_state"]) == ("batch", "PAUSED")
        pause_single = http.post("/v1/jobs/pause", json={"job_id": paused["chunks"][0]["job_id"]})
        assert pause_single.status_code == 409 and "only batches and backfills pause" in pause_single.text

    restart_then_resume(server, batch_id, 4)
    with server.http() as http:
        done = http.post(
            "/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": DEADLINE_S}, timeout=DEADLINE_S + 10
        ).json()
        assert done["batch_state"] == "DONE" and "paused" not in done
        assert http.post("/v1/batches/resume", json={"batch_id": batch_id}).json()["resumed"] is False
        refused = http.post("/v1/batches/pause", json={"batch_id": batch_id})
        assert refused.status_code == 409 and "has ended" in refused.text
        chunks = describe(http, batch_id)["chunks"]
    assert client(server).open_job(batch_id).status() == "finished"
    assert_batch_events(server, batch_id, [c["job_id"] for c in chunks], 4)


def assert_batch_events(server, batch_id: str, chunk_jobs: list[str], rows: int) -> None:
    """The batch's events by LanceDB 0.40's ``Job.events()`` (recorded durably: those before the restart are there):
    created, started, paused, resumed, ended; each chunk's job started and ended, the first across the pause."""
    job = client(server).open_job(batch_id)
    events = job.events().to_pylist()
    assert {e["job_id"] for e in events} == {batch_id}
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})
    own = [(e["state"], e["updated_by"]) for e in events if e["emitted_from"] == "control_plane"]
    assert own == [
        ("PENDING", "created"),
        ("IN_PROGRESS", "started"),
        ("PAUSED", "paused"),
        ("IN_PROGRESS", "resumed"),
        ("DONE", "ended"),
    ]
    assert events[-1]["rows_processed"] == rows
    ended = [e for e in events if e["updated_by"] == "chunk ended"]
    assert [(e["emitted_by"], e["state"], e["claim_entity"]) for e in ended] == [
        (f"chunk {i}", "DONE", job_id) for i, job_id in enumerate(chunk_jobs)
    ]
    order = [(e["updated_by"], e["emitted_by"]) for e in events]
    paused, resumed = order.index(("paused", "lancefn-server")), order.index(("resumed", "lancefn-server"))
    assert order.index(("chunk started", "chunk 0")) < paused < order.index(("chunk ended", "chunk 0")) < resumed
    assert job.events(filter="emitted_from = 'control_plane' AND state = 'PAUSED'", limit=5).to_pylist() == [
        e for e in events if e["updated_by"] == "paused"
    ]


def paused_batch(server, gate: str, chunks: int) -> str:
    """A :func:`gated_batch` paused at once (``POST /v1/jobs/pause``); its id."""
    with server.http() as http:
        batch_id = gated_batch(http, gate, chunks)
        assert http.post("/v1/jobs/pause", json={"job_id": batch_id}).json()["paused"] is True
    return batch_id


def test_cancel_job_cancels_a_paused_batch_by_id(server, tmp_path):
    gate = str(tmp_path / "gate")
    batch_id = paused_batch(server, gate, 3)
    assert client(server).cancel_job(batch_id) is True
    Path(gate).touch()
    with server.http() as http:
        ended = http.post(
            "/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": DEADLINE_S}, timeout=DEADLINE_S + 10
        ).json()
    assert ended["batch_state"] == "CANCELLED"


def test_list_jobs_lists_batches_among_jobs_page_by_page(server, tmp_path):
    gate = str(tmp_path / "gate")
    batch_id = paused_batch(server, gate, 2)
    rows = {row.job_id: row for row in client(server).list_jobs()}  # 0.40's JobInfo rows, its pages followed
    assert (rows[batch_id].job_type, rows[batch_id].state) == ("batch", "PAUSED")
    assert rows[batch_id].created_at_millis > 0 and rows[batch_id].table == ""
    with server.http() as http:
        pages, token = [], None
        while True:  # one row a page: every job and the batch once, newest first
            reply = http.post("/v1/jobs/list", json={"limit": 1, **({"page_token": token} if token else {})}).json()
            pages += reply["jobs"]
            if not (token := reply.get("page_token")):
                break
        assert sorted(row["job_id"] for row in pages) == sorted(rows)
        created = [row["creation_ms"] for row in pages]
        assert created == sorted(created, reverse=True)
        paused = http.post("/v1/jobs/list", json={"state": "PAUSED"}).json()["jobs"]
        assert [row["job_id"] for row in paused] == [batch_id]
        assert [row["job_id"] for row in http.post("/v1/jobs/list", json={"job_type": "batch"}).json()["jobs"]] == [
            batch_id
        ]
        assert batch_id not in {
            row["job_id"] for row in http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"]
        }
        assert http.post("/v1/jobs/list", json={"page_token": "bm9uZQ"}).status_code == 400
    Path(gate).touch()


GATED_ROWS = """from __future__ import annotations

import os
import time


def held(n: int) -> int:
    while not os.path.exists(GATE):
        time.sleep(0.02)
    return n + 1
"""


def test_a_paused_backfill_starts_no_chunk_keeps_the_running_one_stays_paused_across_a_restart_and_resumes(server):
    db_dir, table = new_table()  # 500 rows in two fragments: 3 + 2 chunks of 100, one at a time
    gate = db_dir / "gate"
    with server.http() as http:
        version = register(http, python_body("held", GATED_ROWS.replace("GATE", repr(str(gate)))))["version"]
        body = {"name": "held", "version": version, "table_uri": table.uri, "columns": ["b"], "into": "out"}
        created = http.post("/v1/backfills/create", json={**body, "chunk_size": 100, "parallel": 1})
        assert created.status_code == 202, created.text
        batch_id = created.json()["batch_id"]
        wait_until(lambda: describe(http, batch_id)["chunk_counts"].get("IN_PROGRESS") == 1, "the first chunk runs")

    first = pause_while_one_runs(server, batch_id, gate, 5)["chunks"][0]
    row = {r.job_id: r for r in client(server).list_jobs()}[batch_id]
    assert (row.job_type, row.state, row.table) == ("backfill", "PAUSED", table.uri)

    restart_then_resume(server, batch_id, 5)
    with server.http() as http:
        done = wait_backfill(http, batch_id)
    assert done["batch_state"] == "DONE" and "paused" not in done
    assert done["backfill"]["rows_written"] == 500 and done["backfill"]["fragments_committed"] == 2
    assert (done["chunks"][0]["job_id"], done["chunks"][0]["attempts"]) == (first["job_id"], 1)  # kept, not rerun
    assert column(lancedb.connect(str(db_dir)).open_table("docs"), "out") == [i + 1 for i in range(500)]
    assert_batch_events(server, batch_id, [c["job_id"] for c in done["chunks"]], 500)
