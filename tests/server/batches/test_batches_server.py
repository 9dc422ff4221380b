"""Batches over real HTTP with the real local executor (docs/ARCHITECTURE.md, "Batches"):
fan-out through the class's FIFO, results in order, failures named by chunk and rows, retries,
retry of what did not finish, resume by re-running, cancel, SIGKILL mid-batch then restart,
and bad input that starts nothing.

Functions that must keep running wait for a file the test creates, so nothing depends on timing.
"""

from __future__ import annotations

import inspect
import threading

import httpx
import pytest
from conftest import register, registration_body
from helpers import DEADLINE_S, api_keys_toml, gated, submit, wait_done, wait_until

from lancefn_jupyter.wire.batch_models import Batch

GATE = inspect.getsource(gated)  # registered as "gate"

FLAKY = """from __future__ import annotations

import os


def flaky(marker: str, value: int) -> int:
    # Fails on the first attempt of each chunk (one marker file per chunk), then succeeds.
    tries = open(marker).read().count("x") if os.path.exists(marker) else 0
    with open(marker, "a") as handle:
        handle.write("x")
    if tries == 0:
        raise RuntimeError(f"first attempt for {value}")
    return value + 1
"""


def gate_version(http: httpx.Client) -> str:
    body = registration_body(
        "gate", source=GATE, entrypoint="gated", inputs=(("path", "utf8", False), ("value", "int64", False)), num_gpus=1
    )
    return register(http, body)["version"]


def create(http: httpx.Client, version: str, chunks: list, name: str = "gate", **options) -> dict:
    reply = http.post("/v1/batches/create", json={"name": name, "version": version, "chunks": chunks, **options})
    assert reply.status_code == 202, reply.text
    return reply.json()


def describe(http: httpx.Client, batch_id: str) -> dict:
    reply = http.post("/v1/batches/describe", json={"batch_id": batch_id})
    assert reply.status_code == 200, reply.text
    Batch.from_wire(reply.json())  # every reply decodes as the wire model
    return reply.json()


def wait_batch(http: httpx.Client, batch_id: str) -> dict:
    batch = http.post(
        "/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": DEADLINE_S}, timeout=DEADLINE_S + 10
    ).json()
    assert batch["batch_state"] in ("DONE", "FAILED", "CANCELLED"), batch
    return batch


def job(http: httpx.Client, job_id: str) -> dict:
    return http.post("/v1/jobs/describe", json={"job_id": job_id}).json()


def results(http: httpx.Client, batch: dict) -> list:
    out = []
    for chunk in batch["chunks"]:
        out.extend(job(http, chunk["job_id"])["result"])
    return out


def gate_chunks(tmp_path, values: list[list[int]], prefix: str = "g") -> list:
    return [[{"path": str(tmp_path / f"{prefix}{i}"), "value": v} for v in chunk] for i, chunk in enumerate(values)]


def open_gates(tmp_path, count: int, prefix: str = "g") -> None:
    for i in range(count):
        (tmp_path / f"{prefix}{i}").touch()


def test_six_chunks_on_two_gpus_two_run_four_wait_in_order_results_in_input_order(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        reply = create(http, version, gate_chunks(tmp_path, [[i, i + 100] for i in range(6)]))
        batch_id = reply["batch_id"]
        assert reply["reused_chunks"] == 0

        def placed():
            batch = describe(http, batch_id)
            return batch if batch["strip"].count("r") == 2 else None

        batch = wait_until(placed, "two chunks running")
        assert batch["strip"] == "rrpppp" and batch["batch_state"] == "IN_PROGRESS"
        assert [c["row_start"] for c in batch["chunks"]] == [0, 2, 4, 6, 8, 10] and batch["rows_total"] == 12
        waiting = [job(http, c["job_id"]) for c in batch["chunks"][2:]]
        assert [j["placement"]["queue_position"] for j in waiting] == [1, 2, 3, 4]
        assert all(j["placement"]["waiting_on_capacity"] and j["spec"]["batch_id"] == batch_id for j in waiting)
        assert [j["spec"]["chunk"] for j in waiting] == [2, 3, 4, 5]
        # Chunks finish out of order; results still come back in input order.
        for i in (5, 3, 1, 0, 2, 4):
            (tmp_path / f"g{i}").touch()
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "DONE" and batch["strip"] == "dddddd"
        assert batch["rows_done"] == 12 and batch["chunk_counts"] == {"DONE": 6}
        assert results(http, batch) == [v * 10 for i in range(6) for v in (i, i + 100)]
        assert batch["started_ms"] <= batch["finished_ms"]


def test_parallel_bounds_how_many_chunk_jobs_exist(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        batch_id = create(http, version, gate_chunks(tmp_path, [[i] for i in range(4)]), parallel=1)["batch_id"]
        batch = wait_until(lambda: (b := describe(http, batch_id))["strip"] == "rppp" and b, "first chunk running")
        assert [("job_id" in c) for c in batch["chunks"]] == [True, False, False, False]  # the rest are not jobs yet
        (tmp_path / "g0").touch()
        batch = wait_until(lambda: (b := describe(http, batch_id))["strip"] == "drpp" and b, "second chunk running")
        open_gates(tmp_path, 4)
        assert results(http, wait_batch(http, batch_id)) == [0, 10, 20, 30]


def test_a_failing_chunk_fails_the_batch_naming_rows_and_keeps_finished_chunks_then_retry_failed(
    control_plane, tmp_path
):
    with control_plane.http() as http:
        version = gate_version(http)
        open_gates(tmp_path, 3)
        batch_id = create(http, version, gate_chunks(tmp_path, [[1, 2], [3, -4], [5, 6]]))["batch_id"]
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "FAILED" and batch["strip"] == "dfd"
        failure = batch["failure"]
        assert (failure["chunk"], failure["row_start"], failure["row_end"]) == (1, 2, 4)
        assert "value -4 is negative" in failure["message"] and "ValueError" in failure["traceback"]
        kept = {c["index"]: c["job_id"] for c in batch["chunks"] if c["state"] == "DONE"}
        assert set(kept) == {0, 2}

        (tmp_path / "g1.fixed").touch()
        retried = http.post("/v1/batches/retry", json={"batch_id": batch_id})
        assert retried.status_code == 200, retried.text
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "DONE" and "failure" not in batch
        # Finished chunks were not run again: same jobs.
        assert {c["index"]: c["job_id"] for c in batch["chunks"] if c["index"] in kept} == kept
        assert results(http, batch) == [10, 20, 30, -40, 50, 60]


def test_retries_rerun_a_failed_chunk_and_zero_retries_do_not(control_plane, tmp_path):
    with control_plane.http() as http:
        body = registration_body(
            "flaky",
            source=FLAKY,
            entrypoint="flaky",
            inputs=(("marker", "utf8", False), ("value", "int64", False)),
            num_gpus=1,
        )
        version = register(http, body)["version"]
        chunks = [[{"marker": str(tmp_path / f"m{i}"), "value": i}] for i in range(3)]
        reply = http.post(
            "/v1/batches/create", json={"name": "flaky", "version": version, "chunks": chunks, "retries": 1}
        )
        batch = wait_batch(http, reply.json()["batch_id"])
        assert batch["batch_state"] == "DONE" and [c["attempts"] for c in batch["chunks"]] == [2, 2, 2]
        assert results(http, batch) == [1, 2, 3]

        chunks = [[{"marker": str(tmp_path / f"n{i}"), "value": i}] for i in range(2)]
        reply = http.post("/v1/batches/create", json={"name": "flaky", "version": version, "chunks": chunks})
        batch = wait_batch(http, reply.json()["batch_id"])
        assert batch["batch_state"] == "FAILED" and [c["attempts"] for c in batch["chunks"]] == [1, 1]
        assert "first attempt for 0" in batch["failure"]["message"]


def test_running_the_same_map_again_reuses_finished_chunks_unless_fresh(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        open_gates(tmp_path, 3)
        chunks = gate_chunks(tmp_path, [[1], [-2], [3]])
        first = create(http, version, chunks)
        batch = wait_batch(http, first["batch_id"])
        assert batch["strip"] == "dfd"
        done_jobs = [c["job_id"] for c in batch["chunks"] if c["state"] == "DONE"]

        (tmp_path / "g1.fixed").touch()
        again = create(http, version, chunks)
        assert again == {"batch_id": first["batch_id"], "reused_chunks": 2}
        batch = wait_batch(http, again["batch_id"])
        assert batch["batch_state"] == "DONE" and results(http, batch) == [10, -20, 30]
        assert [c["job_id"] for c in batch["chunks"] if c["index"] != 1] == done_jobs

        # A finished batch is returned as is; fresh=True runs everything again.
        assert create(http, version, chunks) == {"batch_id": first["batch_id"], "reused_chunks": 3}
        fresh = create(http, version, chunks, fresh=True)
        assert fresh["batch_id"] != first["batch_id"] and fresh["reused_chunks"] == 0
        assert wait_batch(http, fresh["batch_id"])["batch_state"] == "DONE"
        # A different cut of the same rows is a different input.
        other = create(http, version, [chunks[0] + chunks[1], chunks[2]])
        assert other["batch_id"] not in (first["batch_id"], fresh["batch_id"])
        wait_batch(http, other["batch_id"])


def test_cancel_cancels_every_pending_and_running_chunk_and_keeps_finished_ones(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        (tmp_path / "g0").touch()
        batch_id = create(http, version, gate_chunks(tmp_path, [[i] for i in range(5)]))["batch_id"]
        wait_until(lambda: describe(http, batch_id)["strip"] == "drrpp", "first done, two running")
        reply = http.post("/v1/batches/cancel", json={"batch_id": batch_id}).json()
        assert reply == {"batch_id": batch_id, "cancelled": True}
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "CANCELLED" and batch["strip"] == "dcccc"
        assert all(job(http, c["job_id"])["job_state"] == "CANCELLED" for c in batch["chunks"][1:])
        assert job(http, batch["chunks"][0]["job_id"])["result"] == [0]
        assert http.post("/v1/batches/cancel", json={"batch_id": batch_id}).json()["cancelled"] is False
        usage = http.get("/v1/gpu/usage").json()["classes"][0]
        assert usage["gpus_busy"] == 0 and usage["jobs_pending"] == 0


def test_sigkill_mid_batch_resumes_on_restart_with_no_row_lost_or_counted_twice(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        version = gate_version(http)
        open_gates(tmp_path, 2)
        batch_id = create(http, version, gate_chunks(tmp_path, [[i, i + 1] for i in range(0, 16, 2)]), parallel=3)[
            "batch_id"
        ]
        # Two chunks done, two running on the two GPUs, one queued (the window of 3), three not yet jobs.
        batch = wait_until(
            lambda: (b := describe(http, batch_id))["strip"] == "ddrrpppp" and b, "two done, two running"
        )
        assert [("job_id" in c) for c in batch["chunks"]] == [True] * 5 + [False] * 3
        spent = describe(http, batch_id)["usage"]
        assert spent["rows"] == 4 and spent["held_s"] > 0, spent  # what the two ended chunk jobs held
    cp.kill()
    cp.start()
    with cp.http() as http:
        batch = describe(http, batch_id)
        assert batch["batch_state"] == "IN_PROGRESS" and batch["strip"].startswith("dd")
        assert batch["usage"] == spent  # saved with the chunks that ended: counting goes on from there
        open_gates(tmp_path, 8)
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "DONE" and batch["rows_done"] == batch["rows_total"] == 16
        assert results(http, batch) == [i * 10 for i in range(16)]
        # Each chunk has exactly one finished job; the re-queued ones kept their job ids.
        jobs = http.post("/v1/jobs/list", json={"job_type": "run_function", "limit": 100}).json()["jobs"]
        done = sorted(
            j["spec"]["chunk"] for j in jobs if j["spec"].get("batch_id") == batch_id and j["job_state"] == "DONE"
        )
        assert done == list(range(8))
        held = sum(
            j["usage"]["held_s"] for j in jobs if j["spec"].get("batch_id") == batch_id and j["job_state"] == "DONE"
        )
        assert batch["usage"]["rows"] == 16 and batch["usage"]["held_s"] == pytest.approx(held, abs=1e-3), batch[
            "usage"
        ]


def test_arrow_chunks_survive_sigkill_mid_batch_and_resume_on_restart(control_plane, tmp_path):
    """Chunks sent as one Arrow IPC body (a record batch per chunk) are stored with the batch: after
    SIGKILL the chunks not yet submitted still get their rows, each row's result counted once."""
    import pyarrow as pa

    from lancefn_jupyter.wire import dataplane

    cp = control_plane
    rows = [row for chunk in gate_chunks(tmp_path, [[i, i + 1] for i in range(0, 12, 2)], prefix="a") for row in chunk]
    (whole,) = dataplane.encode_rows(rows, {"path": "utf8", "value": "int64"}).to_batches()
    body = dataplane.to_ipc_bytes(pa.Table.from_batches([whole.slice(i, 2) for i in range(0, 12, 2)]))
    with cp.http() as http:
        version = gate_version(http)
        reply = http.post(
            "/v1/batches/create",
            content=body,
            params={"name": "gate", "version": version, "parallel": "2"},
            headers={"content-type": dataplane.MEDIA_TYPE},
        )
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        open_gates(tmp_path, 1, prefix="a")
        batch = wait_until(lambda: (b := describe(http, batch_id))["strip"] == "drrppp" and b, "one done, two running")
        assert [(c["row_start"], c["row_end"]) for c in batch["chunks"]] == [(i, i + 2) for i in range(0, 12, 2)]
    cp.kill()
    cp.start()
    with cp.http() as http:
        open_gates(tmp_path, 6, prefix="a")
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "DONE" and batch["rows_done"] == batch["rows_total"] == 12
        assert results(http, batch) == [i * 10 for i in range(12)]
        assert job(http, batch["chunks"][5]["job_id"])["spec"]["rows_format"] == "arrow"


def test_bad_input_is_refused_clearly_and_starts_nothing(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        row = {"path": str(tmp_path / "x"), "value": 1}
        cases = [
            ({"chunks": []}, "non-empty list"),
            ({"chunks": [[]]}, "chunks[0]: rows must be a non-empty list"),
            ({"chunks": [[row], [{"path": "p"}]]}, "chunks[1]: rows[0]: missing parameter(s) value"),
            ({"chunks": [[row]], "parallel": 0}, "parallel"),
            ({"chunks": [[row]], "retries": 11}, "retries"),
            ({"chunks": [[row]], "version": "0000000000000000"}, "not found"),
        ]
        for extra, needle in cases:
            body = {"name": "gate", "version": version, **extra}
            reply = http.post("/v1/batches/create", json=body)
            assert reply.status_code in (400, 404), reply.text
            assert needle in reply.json()["error"]["message"], (needle, reply.text)
        assert http.post("/v1/batches/list", json={}).json() == {"batches": []}
        assert http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"] == []
        assert http.post("/v1/batches/describe", json={"batch_id": "nope"}).status_code == 404
        unauthorized = httpx.post(control_plane.url + "/v1/batches/list", json={})
        assert unauthorized.status_code == 401


def test_a_version_dropped_mid_batch_fails_the_chunks_not_yet_started_saying_why(control_plane, tmp_path):
    with control_plane.http() as http:
        version = gate_version(http)
        batch_id = create(http, version, gate_chunks(tmp_path, [[1], [2], [3]]), parallel=1)["batch_id"]
        wait_until(lambda: describe(http, batch_id)["strip"] == "rpp", "first chunk running")
        assert http.post("/v1/functions/drop", json={"name": "gate", "version": version}).json() == {"dropped": True}
        open_gates(tmp_path, 3)
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "FAILED" and batch["strip"] == "dff"
        assert batch["failure"]["phase"] == "validation" and "was dropped" in batch["failure"]["message"]


TEAM_KEYS = api_keys_toml(
    {"name": "alice", "key": "alice-key-000000001", "namespace": "team-a", "privileges": ["functions", "jobs"]},
    {"name": "carol", "key": "carol-key-000000003", "privileges": ["functions", "jobs"]},
)


def test_a_batch_lives_in_its_functions_namespace_and_other_teams_cannot_see_it(control_plane_factory):
    cp = control_plane_factory(api_keys=TEAM_KEYS)
    alice, carol = cp.http("alice-key-000000001", timeout=60), cp.http("carol-key-000000003", timeout=60)
    with alice, carol, cp.http() as admin:
        version = register(alice, registration_body("double"))["version"]
        batch_id = create(alice, version, [[{"x": 1}], [{"x": 2}]], name="double")["batch_id"]
        batch = wait_batch(alice, batch_id)
        assert batch["batch_state"] == "DONE" and batch["namespace"] == "team-a"
        assert all(job(alice, c["job_id"])["namespace"] == "team-a" for c in batch["chunks"])
        # Another team: the same 404 as a batch that does not exist, and an empty list.
        for path in ("/v1/batches/describe", "/v1/batches/cancel", "/v1/batches/retry", "/v1/batches/wait"):
            reply = carol.post(path, json={"batch_id": batch_id})
            assert reply.status_code == 404 and batch_id in reply.json()["error"]["message"], (path, reply.text)
        assert carol.post("/v1/batches/list", json={}).json() == {"batches": []}
        # Its function is not carol's either: she cannot start a batch of it.
        assert (
            carol.post(
                "/v1/batches/create", json={"name": "double", "version": version, "chunks": [[{"x": 1}]]}
            ).status_code
            == 404
        )
        # The admin sees every namespace.
        assert [b["batch_id"] for b in admin.post("/v1/batches/list", json={}).json()["batches"]] == [batch_id]


def test_creating_cancelling_and_retrying_5000_chunks_leaves_health_and_another_team_answering(
    control_plane_factory, tmp_path
):
    # Finding 4 of issue 27: create, cancel and retry work in slices of the lock, so others are served meanwhile.
    owner, other = "stall-owner-key-0000001", "stall-other-key-0000002"
    keys = api_keys_toml(
        {"name": "a", "key": owner, "namespace": "team-a", "privileges": ["functions", "jobs"]},
        {"name": "b", "key": other, "namespace": "team-b", "privileges": ["functions", "jobs"]},
    )
    cp = control_plane_factory(api_keys=keys)
    with cp.http(owner) as a, cp.http(other) as b:
        version = gate_version(a)
        double = register(b, registration_body(num_gpus=None))["version"]
        answers: dict[str, list] = {"health": [], "results": []}
        done = threading.Event()

        def others() -> None:
            while not done.is_set():
                answers["health"].append(b.get("/v1/health").status_code)
                job_id = submit(b, "double", double, [{"x": len(answers["results"])}])
                answers["results"].append(wait_done(b, job_id)["result"])

        def submitted(batch_id: str) -> int:
            chunks = describe(a, batch_id)["chunks"]
            return sum("job_id" in c for c in chunks)

        thread = threading.Thread(target=others)
        thread.start()
        try:
            wait_until(lambda: answers["results"], "team B's first result")
            chunks = [[{"path": str(tmp_path / "never"), "value": i}] for i in range(5000)]
            batch_id = create(a, version, chunks)["batch_id"]  # replies after its first slice
            seen = len(answers["results"])
            wait_until(lambda: submitted(batch_id) == 5000, "every chunk a job", timeout=DEADLINE_S * 5)
            during_create = len(answers["results"]) - seen
            reply = a.post("/v1/batches/cancel", json={"batch_id": batch_id}, timeout=DEADLINE_S * 5)
            assert reply.json() == {"batch_id": batch_id, "cancelled": True}
            assert wait_batch(a, batch_id)["chunk_counts"] == {"CANCELLED": 5000}
            retried = a.post("/v1/batches/retry", json={"batch_id": batch_id}, timeout=DEADLINE_S * 5)
            assert retried.status_code == 200 and retried.json()["batch_state"] in ("PENDING", "IN_PROGRESS")
            seen = len(answers["results"])
            wait_until(
                lambda: describe(a, batch_id)["chunk_counts"].get("CANCELLED", 0) == 0 and submitted(batch_id) == 5000,
                "every chunk a job again",
                timeout=DEADLINE_S * 5,
            )
            during_retry = len(answers["results"]) - seen
            a.post("/v1/batches/cancel", json={"batch_id": batch_id}, timeout=DEADLINE_S * 5)
        finally:
            done.set()
            thread.join(DEADLINE_S)
        batch = wait_batch(a, batch_id)
        assert batch["batch_state"] == "CANCELLED" and batch["chunk_counts"] == {"CANCELLED": 5000}
        # Team B was served while team A's chunks were being submitted (one slice at a time), not after.
        assert during_create > 0 and during_retry > 0
        assert answers["health"] and set(answers["health"]) == {200}
        assert answers["results"] == [[2 * i] for i in range(len(answers["results"]))]


def test_a_server_killed_while_submitting_a_big_batch_submits_the_rest_on_restart_each_chunk_once(
    control_plane, tmp_path
):
    cp = control_plane
    with cp.http() as http:
        version = gate_version(http)
        count = 2000
        batch_id = create(http, version, gate_chunks(tmp_path, [[i] for i in range(count)]))["batch_id"]
        cp.kill()  # mid-submission: the create replied after its first slice
    cp.start()
    with cp.http() as http:
        batch = wait_until(
            lambda: (b := describe(http, batch_id)) and all("job_id" in c for c in b["chunks"]) and b,
            "every chunk a job after the restart",
            timeout=DEADLINE_S * 3,
        )
        assert batch["chunks_total"] == count and len({c["job_id"] for c in batch["chunks"]}) == count
        http.post("/v1/batches/cancel", json={"batch_id": batch_id}, timeout=DEADLINE_S * 3)
        batch = wait_batch(http, batch_id)
        assert batch["batch_state"] == "CANCELLED" and sum(batch["chunk_counts"].values()) == count
        # One job per chunk: none submitted twice across the kill.
        jobs, token = [], None
        while True:
            page = http.post(
                "/v1/jobs/list",
                json={"job_type": "run_function", "limit": 1000, **({"page_token": token} if token else {})},
            ).json()
            jobs += [j for j in page["jobs"] if j.get("spec", {}).get("batch_id") == batch_id]
            token = page.get("page_token")
            if not token:
                break
        assert sorted(j["spec"]["chunk"] for j in jobs) == list(range(count))
