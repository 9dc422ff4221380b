"""A backfill on the Ray executor (docs/ARCHITECTURE.md, "Backfills", "Running a chunk"): each
chunk's Ray task reads its rows from the table in the Ray worker (the job's spec carries the slice,
no rows file), and the control plane commits the results; a GPU function (embeddings) writes a
fixed_size_list column that LanceDB searches."""

from __future__ import annotations

import pytest
from conftest import register, registration_body
from helpers import EMBED, column, make_table, table_dir
from helpers import wait_backfill as wait

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_ray_chunks_read_their_rows_in_the_worker(ray_cp):
    import lancedb

    db_dir = table_dir()
    _, table = make_table(db_dir)
    with ray_cp.http() as http:
        body = registration_body(
            "embed",
            source=EMBED.replace("SCALE", "1.0"),
            entrypoint="embed",
            inputs=(("text", "utf8", False),),
            output_type="tensor<float32>",
            num_gpus=1,
        )
        version = register(http, body)["version"]
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
