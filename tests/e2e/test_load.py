"""Load on loopback: 20 concurrent clients (threads, each with its own httpx client) submit 100
jobs each; every job is accepted, runs once, ends DONE with its own result, and the event
stream reports each job's end exactly once.  Plus concurrent identical registrations.
No timing asserts: only accounting."""

from __future__ import annotations

import json
import threading

import httpx
from conftest import register, registration_body
from test_jobs_e2e import usage

CLIENTS = 20
JOBS_PER_CLIENT = 100
TOTAL = CLIENTS * JOBS_PER_CLIENT
EIGHT_GPUS = '[[gpu_classes]]\nname = "default"\nsimulated = 8\nmax_gpu_count_per_worker = 2\n'


def test_20_clients_submit_100_jobs_each_and_every_job_is_accounted_for(control_plane_factory):
    cp = control_plane_factory(gpu_classes=EIGHT_GPUS)
    with cp.http() as http:
        one = register(http, registration_body("double"))["version"]
        two = register(http, registration_body("double2", num_gpus=2))["version"]

    # An SSE reader that counts terminal events per job while the load runs.
    ended: dict[str, list[str]] = {}
    connected, stop_reading = threading.Event(), threading.Event()
    reader_errors: list[BaseException] = []

    def read_events() -> None:
        try:
            with cp.http(timeout=httpx.Timeout(120.0)) as client, client.stream("GET", "/v1/jobs/events") as stream:
                block: dict[str, str] = {}
                for line in stream.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        key, _, value = line.partition(": ")
                        block[key] = value
                        continue
                    connected.set()
                    if block.get("event") == "job":
                        job = json.loads(block["data"])
                        if job["job_type"] == "run_function" and job["job_state"] in (
                            "DONE",
                            "FAILED",
                            "CANCELLED",
                            "TIMED_OUT",
                        ):
                            ended.setdefault(job["job_id"], []).append(job["job_state"])
                            if len(ended) >= TOTAL:
                                return
                    block = {}
                    if stop_reading.is_set():
                        return
        except BaseException as error:  # reported by the main thread
            reader_errors.append(error)

    reader = threading.Thread(target=read_events, daemon=True)
    reader.start()
    assert connected.wait(30), "event stream did not connect"

    expected: dict[str, int] = {}
    lock = threading.Lock()
    failures: list[str] = []
    start = threading.Barrier(CLIENTS)

    def client_thread(index: int) -> None:
        try:
            with cp.http(timeout=120.0) as client:
                start.wait()
                mine = []
                for i in range(JOBS_PER_CLIENT):
                    x = index * 1000 + i
                    # Every fifth job of each client wants 2 GPUs, so queues mix sizes.
                    name, version = ("double2", two) if i % 5 == 4 else ("double", one)
                    reply = client.post(
                        "/v1/functions/run", json={"name": name, "version": version, "rows": [{"x": x}]}
                    )
                    if reply.status_code != 202:
                        failures.append(f"client {index} job {i}: {reply.status_code} {reply.text[:200]}")
                        continue
                    mine.append((reply.json()["job_id"], 2 * x))
                with lock:
                    expected.update(mine)
                for job_id, result in mine:
                    job = client.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
                    while job["job_state"] in ("PENDING", "IN_PROGRESS"):
                        job = client.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
                    if job["job_state"] != "DONE" or job["result"] != [result]:
                        failures.append(
                            f"client {index}: {job_id} ended {job['job_state']} with {job.get('result')} {job.get('failure')}"
                        )
        except Exception as error:
            failures.append(f"client {index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not any(thread.is_alive() for thread in threads), "a client thread hung"
    assert failures == []
    assert len(expected) == TOTAL  # every submission accepted, every job id distinct

    reader.join(60)
    stop_reading.set()
    assert reader_errors == []
    assert set(ended) == set(expected)
    assert all(states == ["DONE"] for states in ended.values())  # each job ended once, DONE

    with cp.http() as http:
        listed, body = {}, {"job_type": "run_function", "limit": 1000}
        while True:
            page = http.post("/v1/jobs/list", json=body).json()
            listed.update((job["job_id"], job) for job in page["jobs"])
            if not page.get("page_token"):
                break
            body["page_token"] = page["page_token"]
        assert set(listed) == set(expected)
        assert all(job["job_state"] == "DONE" and job["result"] == [expected[job_id]] for job_id, job in listed.items())
        assert usage(http) == {"name": "default", "gpus_total": 8, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 0}


def test_concurrent_identical_registrations_give_one_version(control_plane):
    versions: list[str] = []
    errors: list[str] = []
    start = threading.Barrier(CLIENTS)

    def client_thread() -> None:
        try:
            with control_plane.http() as client:
                start.wait()
                versions.append(register(client, registration_body("same"))["version"])
        except Exception as error:
            errors.append(repr(error))

    threads = [threading.Thread(target=client_thread) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and len(versions) == CLIENTS and len(set(versions)) == 1
    with control_plane.http() as http:
        assert [
            f["version"] for f in http.post("/v1/functions/list", json={"name": "same"}).json()["functions"]
        ] == versions[:1]
