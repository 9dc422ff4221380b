"""The direct-route fast path (``server/http/fastpath.py``) answers exactly like the router's route
it shortcuts: one control plane on 127.0.0.1 served by two apps, one with the fast path and one
built with ``fast_path=False`` (every request through the router and its key check), gets
the same requests — good ones, bad JSON, wrong types, missing or unknown keys, a missing
privilege, unknown functions and jobs, ``wait_s`` variants — and must give the same status,
content type and body (job ids and times aside; both get the same ``x-request-id``)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import registration_body

ADMIN_KEY, JOBS_KEY, FUNCTIONS_KEY = "admin-key-parity", "jobs-only-parity", "functions-only-parity"
_VOLATILE = {
    "job_id",
    "creation_ms",
    "started_ms",
    "finished_ms",
    "expected_start_ms",
    "devices",
    "node",
    "timings",
    "usage",
}


def _socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(fast path URL, router-only URL): two apps over one control plane, on one event loop."""
    import uvicorn

    from lancefn_jupyter.server.executors import get_executor
    from lancefn_jupyter.server.http.app import create_app
    from lancefn_jupyter.server.plane import ControlPlane
    from lancefn_jupyter.server.policy.gpu_classes import simulated_default
    from lancefn_jupyter.server.policy.namespaces import Principal, admin_principal
    from lancefn_jupyter.server.storage.store import Store

    home = tmp_path_factory.mktemp("parity")
    classes = simulated_default()
    store = Store(home / "db.sqlite3")
    executor = get_executor("local", classes=classes, home=home, max_idle_workers=2)
    plane = ControlPlane(store=store, classes=classes, executor=executor)
    keys = {
        ADMIN_KEY: admin_principal(),
        JOBS_KEY: Principal("jobs-only", "default", frozenset({"jobs"})),
        FUNCTIONS_KEY: Principal("functions-only", "default", frozenset({"functions"})),
    }
    apps = [create_app(plane, api_keys=keys), create_app(plane, api_keys=keys, fast_path=False)]
    socks = [_socket(), _socket()]
    # Only the first runs the lifespan: the plane starts (and stops) once.
    uv = [
        uvicorn.Server(uvicorn.Config(app, lifespan=lifespan, log_level="warning"))
        for app, lifespan in zip(apps, ("on", "off"), strict=True)
    ]
    started = threading.Event()

    async def serve() -> None:
        first = asyncio.create_task(uv[0].serve(sockets=[socks[0]]))
        while not uv[0].started:
            await asyncio.sleep(0.01)
        second = asyncio.create_task(uv[1].serve(sockets=[socks[1]]))
        while not uv[1].started:
            await asyncio.sleep(0.01)
        started.set()
        await asyncio.gather(first, second)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30), "the servers did not start"
    try:
        yield tuple(f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in socks)  # type: ignore[misc]
    finally:
        uv[1].should_exit = True
        uv[0].should_exit = True
        thread.join(30)
        store.close()


def _normal(value: Any) -> Any:
    """``value`` with job ids, times and device ids (which differ between two runs) blanked."""
    if isinstance(value, dict):
        return {k: "*" if k in _VOLATILE else _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def _both(servers: tuple[str, str], path: str, body: Any, key: str | None = ADMIN_KEY, raw: bool = False) -> tuple:
    replies = []
    for n, url in enumerate(servers):
        headers = {"x-request-id": f"parity-{path.rsplit('/', 1)[-1]}", "content-type": "application/json"}
        if key is not None:
            headers["x-api-key"] = key
        content = body if raw else httpx.Request("POST", url, json=body).content
        reply = httpx.post(url + path, content=content, headers=headers, timeout=30)
        replies.append((reply.status_code, reply.headers.get("content-type"), _normal(reply.json())))
        assert n == 0 or replies[0] == replies[1], (
            f"{path} {body!r}:\n fast path: {replies[0]}\n router:    {replies[1]}"
        )
    return replies[0]


@pytest.fixture(scope="module")
def function(servers) -> str:
    with httpx.Client(base_url=servers[0], headers={"x-api-key": ADMIN_KEY}) as http:
        reply = http.post("/v1/functions/create", json=registration_body("parity_double", num_gpus=None))
        assert reply.status_code == 202, reply.text
    return "parity_double"


def _version(servers: tuple[str, str], name: str) -> str:
    with httpx.Client(base_url=servers[0], headers={"x-api-key": ADMIN_KEY}) as http:
        listed = http.post("/v1/functions/list", json={"name": name}).json()
    return listed["functions"][0]["version"]


def test_run_replies_alike(servers, function):
    version = _version(servers, function)
    good = {"name": function, "version": version, "rows": [{"x": 2}, {"x": 3}]}
    status, _, body = _both(servers, "/v1/functions/run", {**good, "wait_s": 20})
    assert status == 202 and body["job"]["job_state"] == "DONE", body
    assert body["job"]["result"] == [4, 6]
    for variant in (
        {**good, "wait_s": 20, "timeout_s": 60},
        {**good, "wait_s": 61},
        {**good, "wait_s": -1},
        {**good, "wait_s": "5"},
        {**good, "wait_s": True},
        {**good, "timeout_s": 0},
        {**good, "rows": []},
        {**good, "rows": "x"},
        {**good, "rows": [{"y": 1}], "wait_s": 1},
        {**good, "rows": [[1]]},
        {**good, "name": 5},
        {**good, "name": "no_such_function"},
        {**good, "version": "v" * 12},
        {**good, "namespace": "elsewhere"},
        {**good, "rows_file": "../escape.arrow"},
        {"version": version, "rows": good["rows"]},
        [good],
        "a string",
        None,
    ):
        _both(servers, "/v1/functions/run", variant)
    status, _, body = _both(servers, "/v1/functions/run", good)  # no wait: the job id alone
    assert status == 202 and body == {"job_id": "*"}


def test_bad_bodies_and_keys_reply_alike(servers, function):
    good = {"name": function, "version": _version(servers, function), "rows": [{"x": 1}], "wait_s": 20}
    for path in ("/v1/functions/run", "/v1/jobs/wait"):
        for raw in (b"", b"   ", b"{", b'{"name": NaN}', b"\xed\xa0\x80", b'{"name": "\\ud800"}', b"[1, 2]", b"7"):
            _both(servers, path, raw, raw=True)
    assert _both(servers, "/v1/functions/run", good, key=None)[0] == 401
    assert _both(servers, "/v1/functions/run", good, key="not-a-key-at-all")[0] == 401
    assert _both(servers, "/v1/functions/run", good, key=JOBS_KEY)[0] == 403
    assert _both(servers, "/v1/jobs/wait", {"job_id": "x"}, key=FUNCTIONS_KEY)[0] == 403
    assert _both(servers, "/v1/functions/run", good, key=FUNCTIONS_KEY)[0] == 202


def test_wait_replies_alike(servers, function):
    version = _version(servers, function)
    with httpx.Client(base_url=servers[0], headers={"x-api-key": ADMIN_KEY}) as http:
        job_id = http.post(
            "/v1/functions/run", json={"name": function, "version": version, "rows": [{"x": 5}], "wait_s": 20}
        ).json()["job_id"]
    status, _, body = _both(servers, "/v1/jobs/wait", {"job_id": job_id, "timeout_s": 5})
    assert status == 200 and body["job_state"] == "DONE" and body["result"] == [10]
    for variant in (
        {"job_id": job_id},
        {"job_id": job_id, "timeout_s": 0},
        {"job_id": job_id, "timeout_s": 61},
        {"job_id": job_id, "timeout_s": -1},
        {"job_id": job_id, "timeout_s": "1"},
        {"job_id": 5},
        {"job_id": "no-such-job"},
        {"timeout_s": 1},
        {},
    ):
        _both(servers, "/v1/jobs/wait", variant)
