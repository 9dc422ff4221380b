"""What many test modules share: polling with a deadline, a file-gated "hold" function, and the
REST calls the job tests make against a real control plane.

Waits poll until a condition holds and fail only when it never does (a generous deadline, never
an assert on elapsed time). A hold function runs until the test creates a file, so job states
change when the test says so, not by timing.
"""

from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import httpx
from conftest import register, registration_body

from lancefn_jupyter.models import Job

T = TypeVar("T")

DEADLINE_S = 60.0

#: ``hold(path)`` returns ``path`` once the file exists; it prints a line first so tests can see it started.
HOLD_SOURCE = """from __future__ import annotations

import os
import time


def hold(path: str) -> str:
    print("holding", path, flush=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    return path
"""

TERMINAL = ("DONE", "FAILED", "CANCELLED", "TIMED_OUT")


def wait_until(condition: Callable[[], T], what: str, timeout: float = DEADLINE_S, interval: float = 0.05) -> T:
    """Poll ``condition()`` until it returns something truthy and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return value


def hold_version(http: httpx.Client, name: str = "hold", num_gpus: int | None = 1, **options: Any) -> str:
    """Registers :data:`HOLD_SOURCE` as ``name``; returns its version id."""
    body = registration_body(
        name,
        source=HOLD_SOURCE,
        entrypoint="hold",
        inputs=(("path", "utf8", False),),
        output_type="utf8",
        num_gpus=num_gpus,
        **options,
    )
    return register(http, body)["version"]


def submit(http: httpx.Client, name: str, version: str, rows: list[dict], timeout_s: float | None = None) -> str:
    body = {"name": name, "version": version, "rows": rows, **({"timeout_s": timeout_s} if timeout_s else {})}
    reply = http.post("/v1/functions/run", json=body)
    assert reply.status_code == 202, reply.text
    return reply.json()["job_id"]


def describe(http: httpx.Client, job_id: str) -> dict:
    reply = http.post("/v1/jobs/describe", json={"job_id": job_id})
    assert reply.status_code == 200, reply.text
    Job.from_wire(reply.json())  # every reply decodes as the wire model
    return reply.json()


def wait_state(http: httpx.Client, job_id: str, *states: str) -> dict:
    return wait_until(lambda: (job := describe(http, job_id))["job_state"] in states and job, f"{job_id} in {states}")


def wait_done(http: httpx.Client, job_id: str) -> dict:
    reply = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": DEADLINE_S})
    assert reply.status_code == 200, reply.text
    job = reply.json()
    assert job["job_state"] in TERMINAL, job
    return job
