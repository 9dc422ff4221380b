"""Backfills over real HTTP with the real local executor (docs/ARCHITECTURE.md, "Backfills"): the
control plane chooses the rows of a LanceDB table, runs them as chunk jobs and commits each
fragment's results into the table; checked by opening the table with LanceDB (values, `IS NULL`
counts, the version sidecar, a vector search), with where=, recompute=, several fragments,
duplicate inputs, bad inputs (400s that create nothing) and the one-backfill-per-column 409.
A backfill belongs to the control plane: it finishes after the script that started it exits, and
a control plane SIGKILLed mid-backfill resumes on restart (chunks DONE before the kill are not run
again, uncommitted fragments are committed, every row is written once with the right value).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import python_body, register
from helpers import EMBED, api_keys_toml, column, give_to_team, make_table, new_table, table_dir, wait_until
from helpers import wait_backfill as wait

from lancefn_jupyter.kernel.display.cards import result_text
from lancefn_jupyter.wire.models import Job

SCORE = """from __future__ import annotations


def score(x: float, y: int) -> float:
    return x * 10 + y
"""

SCORE_BODY = python_body("score", SCORE, (("x", "float64", False), ("y", "int64", False)), "float64")

GATED = """from __future__ import annotations

import os
import time


def gated(n: int) -> int:
    while not os.path.exists(GATE):
        time.sleep(0.02)
    return n + 1
"""


def embed_version(http: httpx.Client, scale: float) -> str:
    body = python_body("embed", EMBED.replace("SCALE", repr(scale)), (("text", "utf8", False),), "tensor<float32>")
    return register(http, body)["version"]


def create(http: httpx.Client, **body) -> dict:
    reply = http.post("/v1/backfills/create", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()


@pytest.fixture(scope="module")
def cp(shared_control_plane):
    return shared_control_plane


def test_embeddings_into_a_new_vector_column_then_stale_and_all(cp):
    import lancedb

    db_dir, table = new_table()
    with cp.http() as http:
        v1 = embed_version(http, 1.0)
        created = create(
            http, name="embed", version=v1, table_uri=table.uri, columns=["text"], into="emb", chunk_size=64
        )
        assert created["rows_total"] == 500 and created["chunks_total"] == 5 + 4  # 300 → 5 chunks, 200 → 4
        batch = wait(http, created["batch_id"])
        assert batch["batch_state"] == "DONE", batch
        backfill = batch["backfill"]
        assert backfill["rows_written"] == 500 and backfill["fragments_committed"] == backfill["fragments_total"] == 2
        assert (
            backfill["version_column"] == "emb__lancefn_version"
            and backfill["table_version"] == created["table_version"]
        )
        first = http.post("/v1/jobs/describe", json={"job_id": batch["chunks"][0]["job_id"]}).json()
        assert first["spec"]["table_slice"]["ranges"] == [[0, 64]]
        # Committed into the table, the chunks' result files are gone: a backfill neither fills the home nor pushes
        # other jobs' results out under the retention rule. Their jobs say so.
        for chunk in batch["chunks"]:
            described = http.post("/v1/jobs/describe", json={"job_id": chunk["job_id"]}).json()
            summary = described["result_summary"]
            assert described["job_state"] == "DONE" and summary["expired"] is True and summary["committed"] is True
            gone = http.get("/v1/jobs/result", params={"job_id": chunk["job_id"]})
            assert gone.status_code == 410 and "committed into its table" in gone.json()["error"]["message"], gone.text
            assert not (cp.home / "data" / "results" / f"{chunk['job_id']}.arrow").exists()
            assert not list((cp.home / "data" / "backfills").glob(f"*/*-{chunk['job_id']}.arrow"))
            assert result_text(Job.model_validate(described)).endswith("(committed into its table)")  # %gpu_jobs

        table = lancedb.connect(str(db_dir)).open_table("docs")
        assert str(table.schema.field("emb").type) == "fixed_size_list<item: float>[4]"
        emb, texts = column(table, "emb"), column(table, "text")
        # Each row got its own result (matched by row id, never by value): duplicates included.
        assert emb == [[float(len(t)), float(int(t[1:]) % 7), 1.0, 1.0] for t in texts]
        assert set(column(table, "emb__lancefn_version")) == {v1}
        assert table.search().where("emb IS NULL").limit(None).to_arrow().num_rows == 0
        hit = table.search([2.0, 3.0, 1.0, 1.0]).limit(1).to_arrow().column("text").to_pylist()
        assert hit[0] in {f"t{i}" for i in range(10) if i % 7 == 3}

        # Nothing left to do: rows_total 0, a DONE batch at once.
        again = create(http, name="embed", version=v1, table_uri=table.uri, columns=["text"], into="emb")
        assert again["rows_total"] == 0 and wait(http, again["batch_id"])["batch_state"] == "DONE"

        # A new version: "stale" redoes the rows another version wrote, here within where=.
        v2 = embed_version(http, 2.0)
        by_v2 = {"name": "embed", "version": v2, "table_uri": table.uri, "columns": ["text"], "into": "emb"}
        stale = create(http, **by_v2, recompute="stale", where="id < 100")
        assert stale["rows_total"] == 100
        assert wait(http, stale["batch_id"])["batch_state"] == "DONE"
        table = lancedb.connect(str(db_dir)).open_table("docs")
        versions, emb = column(table, "emb__lancefn_version"), column(table, "emb")
        assert versions == [v2] * 100 + [v1] * 400
        assert [row[2] for row in emb] == [2.0] * 100 + [1.0] * 400
        # "all" redoes every row, whatever wrote it.
        everything = create(http, **by_v2, recompute="all", chunk_size=256)
        assert everything["rows_total"] == 500 and wait(http, everything["batch_id"])["batch_state"] == "DONE"
        table = lancedb.connect(str(db_dir)).open_table("docs")
        assert set(column(table, "emb__lancefn_version")) == {v2}
        assert table.count_rows() == 500


def test_several_columns_by_name_with_where(cp):
    import lancedb

    db_dir, table = new_table()
    with cp.http() as http:
        version = register(http, SCORE_BODY)["version"]
        created = create(
            http,
            name="score",
            version=version,
            table_uri=table.uri,
            columns={"x": "a", "y": "b"},
            into="s",
            where="b % 3 = 0",
            chunk_size=40,
        )
        assert created["rows_total"] == len(range(0, 500, 3))
        assert wait(http, created["batch_id"])["batch_state"] == "DONE"
    table = lancedb.connect(str(db_dir)).open_table("docs")
    assert column(table, "s") == [i / 4 * 10 + i if i % 3 == 0 else None for i in range(500)]
    assert table.search().where("s IS NULL").limit(None).to_arrow().num_rows == 500 - len(range(0, 500, 3))
    assert column(table, "a") == [i / 4 for i in range(500)]  # the other columns are untouched


def test_bad_inputs_are_400s_that_create_nothing_and_a_second_backfill_is_a_409(cp):
    db_dir, table = new_table()
    gate = db_dir / "gate"
    with cp.http() as http:
        version = register(http, python_body("gated", GATED.replace("GATE", repr(str(gate)))))["version"]
        base = {"name": "gated", "version": version, "table_uri": table.uri, "into": "out", "columns": ["b"]}

        def batch_ids() -> list[str]:
            return [b["batch_id"] for b in http.post("/v1/batches/list", json={}).json()["batches"]]

        before = batch_ids()
        bad = [
            ({"table_uri": str(db_dir / "nope.lance")}, "not a Lance dataset"),
            ({"columns": ["missing"]}, "no column"),
            ({"columns": ["text"]}, "does not cast"),
            ({"into": "b"}, "also an input column"),
            ({"into": "text"}, "into column 'text'"),
            ({"where": "b >>> 3"}, "where="),
            ({"recompute": "sometimes"}, "recompute="),
            ({"on_error": "ignore"}, "on_error="),
            ({"max_skip_fraction": 2}, "max_skip_fraction"),
            ({"columns": {"m": "b"}}, "no parameter"),
        ]
        for change, words in bad:
            reply = http.post("/v1/backfills/create", json={**base, **change})
            assert reply.status_code == 400, (change, reply.text)
            assert words in reply.json()["error"]["message"], (change, reply.text)
        assert batch_ids() == before

        first = create(http, **base, chunk_size=100)
        second = http.post("/v1/backfills/create", json=base)
        assert second.status_code == 409 and first["batch_id"] in second.json()["error"]["message"]
        gate.touch()
        finished = wait(http, first["batch_id"])
        assert finished["batch_state"] == "DONE", finished.get("failure", {}).get("message")
        errors = http.post("/v1/backfills/errors", json={"batch_id": first["batch_id"]}).json()
        assert errors == {"errors": [], "total": 0}
    import lancedb

    table = lancedb.connect(str(db_dir)).open_table("docs")
    assert column(table, "out") == [i + 1 for i in range(500)]


# Each call appends its row to a log (so a test sees which rows ran twice); rows of the second
# fragment wait for a gate file, so the test can kill the server while they are held.
COUNTED = """from __future__ import annotations

import os
import time


def counted(n: int) -> int:
    with open(LOG, "a") as log:
        log.write(f"{n}\\n")
    while n >= 300 and not os.path.exists(GATE):
        time.sleep(0.02)
    return n * 2
"""


def counted_version(http, log: Path, gate: Path) -> str:
    source = COUNTED.replace("LOG", repr(str(log))).replace("GATE", repr(str(gate)))
    return register(http, python_body("counted", source))["version"]


def test_a_backfill_outlives_the_script_that_started_it(shared_control_plane):
    import lancedb

    cp = shared_control_plane
    db_dir, table = new_table()
    gate = db_dir / "gate"
    with cp.http() as http:
        version = counted_version(http, db_dir / "calls.log", gate)
    script = (
        "import httpx, sys; r = httpx.post(sys.argv[1] + '/v1/backfills/create', headers={'x-api-key': sys.argv[2]}, "
        f"json={{'name': 'counted', 'version': {version!r}, 'table_uri': {table.uri!r}, 'columns': ['b'], 'into': 'out'}});"
        " print(r.json()['batch_id'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, cp.url, cp.api_key], capture_output=True, text=True, check=True
    )
    batch_id = done.stdout.strip()  # the script has exited: nothing of it is left to run the backfill
    gate.touch()
    with cp.http() as http:
        assert wait(http, batch_id)["batch_state"] == "DONE"
    table = lancedb.connect(str(db_dir)).open_table("docs")
    assert column(table, "out") == [2 * i for i in range(500)]


def test_sigkill_mid_backfill_then_restart_finishes_it(control_plane_factory):
    import lancedb

    cp = control_plane_factory()
    db_dir, table = new_table()
    log, gate = db_dir / "calls.log", db_dir / "gate"
    with cp.http() as http:
        version = counted_version(http, log, gate)
        created = http.post(
            "/v1/backfills/create",
            json={
                "name": "counted",
                "version": version,
                "table_uri": table.uri,
                "columns": ["b"],
                "into": "out",
                "chunk_size": 50,
                "parallel": 2,
            },
        ).json()
        batch_id = created["batch_id"]

        def first_fragment_committed():
            batch = http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()
            return batch if batch["backfill"]["fragments_committed"] == 1 else None

        before = wait_until(first_fragment_committed, "the first fragment's commit")
    done_before = {c["index"]: c["job_id"] for c in before["chunks"] if c["state"] == "DONE"}
    assert len(done_before) >= 6  # the 300 rows of fragment 0
    cp.kill()
    gate.touch()
    cp.start()
    with cp.http() as http:
        batch = wait(http, batch_id)
    assert batch["batch_state"] == "DONE", batch
    assert batch["backfill"]["rows_written"] == 500 and batch["backfill"]["fragments_committed"] == 2
    for chunk in batch["chunks"]:
        if chunk["index"] in done_before:  # not run again: the same job, one attempt
            assert chunk["job_id"] == done_before[chunk["index"]] and chunk["attempts"] == 1
    calls = [int(line) for line in log.read_text().split()]
    assert sorted(set(calls)) == list(range(500))
    assert all(calls.count(n) == 1 for n in range(300))  # fragment 0's rows ran once
    table = lancedb.connect(str(db_dir)).open_table("docs")
    assert column(table, "out") == [2 * i for i in range(500)]
    assert set(column(table, "out__lancefn_version")) == {version}


TEAM_KEYS = api_keys_toml(
    {"name": "alice", "key": "alice-key-000000001", "namespace": "team-a", "privileges": ["functions", "jobs"]},
    {"name": "carol", "key": "carol-key-000000003", "privileges": ["functions", "jobs"]},
    {"name": "viewer", "key": "viewer-key-00000004", "namespace": "team-a", "privileges": ["jobs"]},
)


def test_a_backfill_lives_in_its_functions_namespace(control_plane_factory):
    root = table_dir()
    cp = control_plane_factory(api_keys=TEAM_KEYS, args=["--table-roots", f"{root}/{{namespace}}"])
    (root / "team-a").mkdir(mode=0o755)
    _, table = make_table(root / "team-a")
    give_to_team(root / "team-a")
    alice, carol = cp.http("alice-key-000000001"), cp.http("carol-key-000000003")
    viewer = cp.http("viewer-key-00000004")
    with alice, carol, viewer:
        body = SCORE_BODY
        version = register(alice, body)["version"]
        request = {"name": "score", "version": version, "table_uri": table.uri, "columns": ["a", "b"], "into": "s"}
        assert viewer.post("/v1/backfills/create", json=request).status_code == 403  # creating runs code
        assert carol.post("/v1/backfills/create", json=request).status_code == 404  # not her function
        batch_id = create(alice, **request)["batch_id"]
        batch = wait(alice, batch_id)
        assert batch["batch_state"] == "DONE" and batch["namespace"] == "team-a"
        assert viewer.post("/v1/backfills/errors", json={"batch_id": batch_id}).json()["total"] == 0
        reply = carol.post("/v1/backfills/errors", json={"batch_id": batch_id})
        assert reply.status_code == 404 and batch_id in reply.json()["error"]["message"]


PICKY = """from __future__ import annotations

import os


def picky(n: int) -> int:
    if n == 42 and not os.path.exists(FIXED):
        raise ValueError("row 42 is not ready")
    return -n
"""


def test_a_failed_chunk_fails_the_backfill_and_retry_finishes_it(cp):
    import lancedb

    db_dir, table = new_table()
    fixed = db_dir / "fixed"
    with cp.http() as http:
        version = register(http, python_body("picky", PICKY.replace("FIXED", repr(str(fixed)))))["version"]
        created = create(
            http, name="picky", version=version, table_uri=table.uri, columns=["b"], into="neg", chunk_size=100
        )
        failed = wait(http, created["batch_id"])
        assert failed["batch_state"] == "FAILED" and failed["failure"]["chunk"] == 0, failed
        assert "row 42 is not ready" in failed["failure"]["message"]
        # The other fragment's rows are committed; the failed chunk's fragment waits for it.
        assert failed["backfill"]["fragments_committed"] == 1 and failed["backfill"]["rows_written"] == 200
        neg = column(lancedb.connect(str(db_dir)).open_table("docs"), "neg")
        assert neg == [None] * 300 + [-i for i in range(300, 500)]
        fixed.touch()
        assert http.post("/v1/batches/retry", json={"batch_id": created["batch_id"]}).status_code == 200
        done = wait(http, created["batch_id"])
        assert done["batch_state"] == "DONE" and done["backfill"]["rows_written"] == 500, done
        # Only the failed chunk ran again.
        assert [c["job_id"] == f["job_id"] for c, f in zip(done["chunks"], failed["chunks"], strict=True)] == [
            False
        ] + [True] * 4
    neg = column(lancedb.connect(str(db_dir)).open_table("docs"), "neg")
    assert neg == [-i for i in range(500)]


def test_a_shared_server_backfills_only_tables_under_the_callers_root(control_plane_factory):
    """The control plane opens a backfill's table itself: one team's key must not point it at another's."""
    root = table_dir()
    for team in ("team-a", "default"):
        (root / team).mkdir(mode=0o755)
    _, ours = make_table(root / "team-a")
    _, theirs = make_table(root / "default")
    (root / "team-a" / "link.lance").symlink_to(Path(theirs.uri))
    give_to_team(root / "team-a")
    cp = control_plane_factory(api_keys=TEAM_KEYS, args=["--table-roots", f"{root}/{{namespace}}"])
    body = SCORE_BODY
    with cp.http("alice-key-000000001") as alice, cp.http() as admin:
        version = register(alice, body)["version"]
        request = {"name": "score", "version": version, "columns": ["a", "b"], "into": "s"}
        for uri in (theirs.uri, str(root / "team-a" / "link.lance"), str(root / "missing.lance")):
            reply = alice.post("/v1/backfills/create", json={**request, "table_uri": uri})
            assert reply.status_code == 403, reply.text
            message = reply.json()["error"]["message"]
            assert f"{root}/team-a" in message and "not a Lance dataset" not in message
        assert "s" not in theirs.to_arrow().column_names
        assert wait(alice, create(alice, **request, table_uri=ours.uri)["batch_id"])["batch_state"] == "DONE"
        # The operator's key backfills wherever the server's user can.
        admin_version = register(admin, body)["version"]
        done = wait(admin, create(admin, **{**request, "version": admin_version}, table_uri=theirs.uri)["batch_id"])
        assert done["batch_state"] == "DONE"
    no_roots = control_plane_factory(api_keys=TEAM_KEYS)
    with no_roots.http("alice-key-000000001") as alice:
        version = register(alice, body)["version"]
        reply = alice.post("/v1/backfills/create", json={**request, "version": version, "table_uri": ours.uri})
        assert reply.status_code == 403 and "names no --table-roots" in reply.json()["error"]["message"]


def test_a_relative_table_root_refuses_to_start_saying_why(control_plane_factory):
    cp = control_plane_factory(args=["--table-roots", "data/{namespace}"], start=False)
    result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "--table-roots 'data/{namespace}' is not an absolute path" in result.stderr


class Shift:
    def __init__(self, factor: float, offset: float = 0.0):
        self.factor, self.offset = factor, offset

    def __call__(self, x: float) -> float:
        return x * self.factor + self.offset


def init_row(**values) -> str:
    """A LanceDB 0.40 binding's ``initialization``: a base64 one-row Arrow IPC stream."""
    import base64

    import pyarrow as pa

    sink = pa.BufferOutputStream()
    table = pa.table({name: [value] for name, value in values.items()})
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def test_a_class_backfill_takes_init_values_as_json_or_a_lancedb_binding_row(cp):
    import lancedb
    from lancedb.functions import udf

    from lancefn_jupyter.kernel import api

    _, table = new_table()
    client = lancedb.connect("db://lancefn", api_key=cp.api_key, host_override=cp.url)
    version = client.create_function(udf(Shift)).metadata["lancefn.version"]
    target = {"name": "Shift", "version": version, "table_uri": table.uri, "columns": {"x": "a"}}
    with cp.http() as http:
        for init, problem in (
            ({}, "init: missing factor; Shift@"),
            ({"init": {"factor": 1.0, "scale": 2.0}}, "unknown scale"),
            ({"initialization": init_row(scale=2.0)}, "init: missing factor and unknown scale"),
            ({"initialization": "not arrow"}, "initialization must be a base64 Arrow IPC stream of one row"),
            ({"initialization": init_row(factor=1.0), "init": {"factor": 1.0}}, "not both"),
        ):
            refused = http.post("/v1/backfills/create", json={**target, "into": "refused", **init})
            assert refused.status_code == 400 and problem in refused.text, refused.text
        by_json = create(http, **target, into="doubled", init={"factor": 2.0})
        by_row = create(http, **target, into="shifted", initialization=init_row(factor=3.0, offset=1.0))
        for created in (by_json, by_row):
            ended = wait(http, created["batch_id"])
            assert ended["batch_state"] == "DONE", {k: v for k, v in ended.items() if "fail" in k or k == "chunks"}
    api.connect(cp.url, cp.api_key)  # the kernel's backfill: map(table, into=, init=)
    api.lookup(f"Shift@{version}").map(table, column="a", into="halved", init={"factor": 0.5}).wait()
    done = lancedb.connect(str(Path(table.uri).parent)).open_table("docs")
    a = column(done, "a")
    assert column(done, "doubled") == [x * 2 for x in a] and column(done, "shifted") == [x * 3 + 1 for x in a]
    assert column(done, "halved") == [x * 0.5 for x in a]
