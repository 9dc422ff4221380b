"""Batches fail fast on a broken setup, over real HTTP with the real local executor
(docs/ARCHITECTURE.md, "Warm state" and "Batches"): a chunk whose setup failed gets one more try
whatever ``retries`` says, a second setup failure in the batch fails it at once (the other chunks
cancelled, the batch's failure that setup's), and the rule holds across a control-plane restart.

The setup failure is a module that raises while it is executed.  Workers before warm state name
that phase "import"; the batch rule treats both names alike."""

from __future__ import annotations

from conftest import register, registration_body
from helpers import DEADLINE_S, wait_until

from lancefn_jupyter.wire.batch_models import Batch

BROKEN = """from __future__ import annotations

raise RuntimeError("cannot load the model")


def broken(x: int) -> int:
    return x
"""

# Setup fails once for every flag file present when the module executes (it removes the file);
# rows wait for their gate file, so the test says when each chunk ends.
FLAKY_SETUP = """from __future__ import annotations

import os
import time

FLAG = {flag!r}
if os.path.exists(FLAG):
    os.remove(FLAG)
    raise RuntimeError("the model file is missing")


def gated(path: str, value: int) -> int:
    while not os.path.exists(path):
        time.sleep(0.01)
    return value * 10
"""


def describe(http, batch_id: str) -> dict:
    reply = http.post("/v1/batches/describe", json={"batch_id": batch_id})
    assert reply.status_code == 200, reply.text
    Batch.from_wire(reply.json())
    return reply.json()


def wait_batch(http, batch_id: str) -> dict:
    batch = http.post(
        "/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": DEADLINE_S}, timeout=DEADLINE_S + 10
    ).json()
    assert batch["batch_state"] in ("DONE", "FAILED", "CANCELLED"), batch
    return batch


def create(http, name: str, version: str, chunks: list, **options) -> str:
    reply = http.post("/v1/batches/create", json={"name": name, "version": version, "chunks": chunks, **options})
    assert reply.status_code == 202, reply.text
    return reply.json()["batch_id"]


def broken_version(http) -> str:
    return register(http, registration_body("broken", source=BROKEN, entrypoint="broken"))["version"]


def test_a_chunk_whose_setup_fails_twice_fails_the_batch_at_once_whatever_its_retries(control_plane):
    with control_plane.http() as http:
        version = broken_version(http)
        batch_id = create(http, "broken", version, [[{"x": i}] for i in range(6)], parallel=1, retries=5)
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "FAILED" and batch["strip"] == "fccccc"
        assert batch["chunk_counts"] == {"FAILED": 1, "CANCELLED": 5}
        # One more try only (not retries=5), and the waiting chunks never became jobs.
        assert [c["attempts"] for c in batch["chunks"]] == [2, 0, 0, 0, 0, 0]
        assert [("job_id" in c) for c in batch["chunks"]] == [True] + [False] * 5
        failure = batch["failure"]
        assert failure["chunk"] == 0 and failure["phase"] == "setup"
        assert "cannot load the model" in failure["message"]
        job = http.post("/v1/jobs/describe", json={"job_id": failure["job_id"]}).json()
        assert job["job_state"] == "FAILED" and job["failure"]["phase"] == failure["phase"]
    control_plane.restart()
    with control_plane.http() as http:
        again = describe(http, batch_id)
        assert again["batch_state"] == "FAILED" and again["failure"] == failure


def test_parallel_chunks_that_fail_setup_cancel_the_rest_of_the_batch(control_plane):
    with control_plane.http() as http:
        version = broken_version(http)
        batch_id = create(http, "broken", version, [[{"x": i}] for i in range(8)])  # "auto": both GPUs
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "FAILED"
        assert batch["chunk_counts"] == {"FAILED": 1, "CANCELLED": 7}
        assert sum(c["attempts"] for c in batch["chunks"]) <= 1 + 8  # no chunk ran a third time
        assert batch["failure"]["phase"] == "setup" and "cannot load the model" in batch["failure"]["message"]
        # Nothing of the batch is left queued or running.
        usage = http.get("/v1/gpu/usage").json()["classes"][0]
        assert usage["jobs_pending"] == 0 and usage["jobs_running"] == 0


def test_one_setup_failure_is_retried_and_a_second_after_a_restart_still_fails_the_batch(control_plane, tmp_path):
    cp = control_plane
    flag = tmp_path / "flag"
    source = FLAKY_SETUP.format(flag=str(flag))
    body = registration_body(
        "model", source=source, entrypoint="gated", inputs=(("path", "utf8", False), ("value", "int64", False))
    )
    chunks = [[{"path": str(tmp_path / f"g{i}"), "value": i}] for i in range(3)]
    with cp.http() as http:
        version = register(http, body)["version"]
        flag.touch()
        batch_id = create(http, "model", version, chunks, parallel=1)  # retries=0
        # Chunk 0's first setup failed; its one more try runs (and waits on its gate).
        batch = wait_until(
            lambda: (b := describe(http, batch_id))["chunks"][0]["attempts"] == 2 and b["strip"][0] == "r" and b,
            "chunk 0 running its second try",
        )
        assert not flag.exists()
        (tmp_path / "g0").touch()
        wait_until(lambda: describe(http, batch_id)["strip"][:2] == "dr", "chunk 1 running")
        flag.touch()  # chunk 1's module already ran: the flag waits for the next execution
    cp.restart()  # chunk 1's job is re-queued; its new worker executes the module again
    with cp.http() as http:
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "FAILED" and batch["strip"] == "dfc"
        assert [c["attempts"] for c in batch["chunks"]] == [2, 1, 0]  # the second failure is not retried
        assert batch["failure"]["chunk"] == 1 and "the model file is missing" in batch["failure"]["message"]
        assert batch["failure"]["phase"] == "setup"
        # A retry of the batch starts the rule afresh: chunk 1 may fail setup once more.
        flag.touch()
        (tmp_path / "g1").touch()
        (tmp_path / "g2").touch()
        reply = http.post("/v1/batches/retry", json={"batch_id": batch_id})
        assert reply.status_code == 200, reply.text
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "DONE" and "failure" not in batch
        assert [c["attempts"] for c in batch["chunks"]] == [2, 2, 1]
