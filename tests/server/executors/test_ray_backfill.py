"""A backfill on the Ray executor (docs/ARCHITECTURE.md, "Backfills", "Running a chunk"): each
chunk's Ray task reads its rows from the table in the Ray worker (the job's spec carries the slice,
no rows file), and the control plane commits the results; a GPU function (embeddings) writes a
fixed_size_list column that LanceDB searches. On a shared server a namespace key's chunk rows are read by
its team's table agent in the control plane and shipped with the task ("Which tables")."""

from __future__ import annotations

import os

import pytest
from conftest import register, registration_body
from helpers import (
    EMBED,
    RAY_CLASSES,
    api_keys_toml,
    column,
    new_table,
    ray_server,
    team_table_roots,
)
from helpers import wait_backfill as wait

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def _embed_body() -> dict:
    return registration_body(
        "embed",
        source=EMBED.replace("SCALE", "1.0"),
        entrypoint="embed",
        inputs=(("text", "utf8", False),),
        output_type="tensor<float32>",
        num_gpus=1,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a root server (a table root of another uid)")
def test_a_shared_servers_ray_chunks_get_their_rows_from_the_teams_agent(tmp_path_factory):
    import lancedb

    uid, key = 61178, "ray-rights-team-a-0001"
    base = team_table_roots({"a": uid})
    keys = tmp_path_factory.mktemp("keys") / "api_keys.toml"
    keys.write_text(
        api_keys_toml(
            {"name": "ann", "key": key, "namespace": "a", "privileges": ["functions", "jobs"]},
            {"name": "ben", "key": "ray-rights-team-b-0002", "namespace": "b", "privileges": ["functions", "jobs"]},
        )
    )
    keys.chmod(0o600)
    table_uri = str(base / "a" / "t.lance")
    before = {p: p.stat().st_uid for p in (base / "a").rglob("*")}
    args = ("--api-keys", str(keys), "--table-roots", f"{base}/{{namespace}}")
    with ray_server(tmp_path_factory, RAY_CLASSES, *args) as cp, cp.http(key, timeout=60.0) as http:
        version = register(http, _embed_body())["version"]
        reply = http.post(
            "/v1/backfills/create",
            json={"name": "embed", "version": version, "table_uri": table_uri, "into": "emb", "chunk_size": 128},
        )
        assert reply.status_code == 202, reply.text
        batch = wait(http, reply.json()["batch_id"])
        assert batch["batch_state"] == "DONE", batch
        job = http.post("/v1/jobs/describe", json={"job_id": batch["chunks"][0]["job_id"]}).json()
        assert job["spec"]["table_slice"]["root"] == str(base / "a")
    table = lancedb.connect(str(base / "a")).open_table("t")
    assert column(table, "emb") == [[float(len(t)), float(int(t[1:]) % 7), 1.0, 1.0] for t in column(table, "text")]
    written = [p for p in (base / "a").rglob("*") if p not in before]
    assert written and {p.stat().st_uid for p in written} == {uid}  # by A's agent, not the server or Ray


def test_ray_chunks_read_their_rows_in_the_worker(ray_cp):
    import lancedb

    db_dir, table = new_table()
    with ray_cp.http() as http:
        version = register(http, _embed_body())["version"]
        reply = http.post(
            "/v1/backfills/create",
            json={"name": "embed", "version": version, "table_uri": table.uri, "into": "emb", "chunk_size": 128},
        )
        assert reply.status_code == 202, reply.text
        batch = wait(http, reply.json()["batch_id"])
        assert batch["batch_state"] == "DONE", batch
        job = http.post("/v1/jobs/describe", json={"job_id": batch["chunks"][-1]["job_id"]}).json()
        assert job["spec"]["table_slice"]["fragment"] == 1
    table = lancedb.connect(str(db_dir)).open_table("docs")
    texts = column(table, "text")
    assert column(table, "emb") == [[float(len(t)), float(int(t[1:]) % 7), 1.0, 1.0] for t in texts]
    assert table.search([2.0, 0.0, 1.0, 1.0]).limit(1).to_arrow().column("text").to_pylist() in (["t0"], ["t7"])
