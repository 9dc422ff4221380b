"""The jupyter_server extension (lancefn_jupyter.jupyter) against a real `jupyter server` subprocess
(token, non-root base_url `/jl/`) and a real control plane on 127.0.0.1.

Covers: authentication on every handler, proxied replies equal the control plane's, the API key
never reaches the browser, the SSE stream is passed through and resumable, an unreachable control
plane is a 502 envelope, embedded discovery, `jupyter labextension/server extension list` report
OK, and the frontend unit tests (`npm test` in labextension/).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_util import (
    REPO,
    free_port,
    register_gate_function,
    running_jupyter,
    submit_gate_job,
    wait_job_state,
)
from conftest import ControlPlaneProcess, make_env

from lancefn_jupyter.jupyter import handlers as handlers_module
from lancefn_jupyter.jupyter.discovery import ControlPlaneTarget, DiscoveryError, discover, redact_url
from lancefn_jupyter.jupyter.handlers import ALLOWED_ROUTES

JUPYTER_BIN = Path(sys.executable).parent / "jupyter"

# Bodies for the POST routes (valid or not: equality with the control plane is what matters).
POST_BODIES = {
    "functions/list": {"include_definition": False},
    "functions/describe": {"name": "wait_for", "version": "0000000000000000"},
    "functions/history": {},
    "functions/diff": {"name": "wait_for"},
    "jobs/list": {},
    "jobs/describe": {"job_id": "no-such-job"},
    "jobs/cancel": {"job_id": "no-such-job"},
    "jobs/logs": {"job_id": "no-such-job"},
    "batches/list": {"limit": 5},
    "batches/describe": {"batch_id": "no-such-batch"},
    "batches/cancel": {"batch_id": "no-such-batch"},
    "batches/pause": {"batch_id": "no-such-batch"},
    "batches/resume": {"batch_id": "no-such-batch"},
}


class Proxied:
    def __init__(self, cp: ControlPlaneProcess, server, tmp: Path) -> None:
        self.cp = cp
        self.server = server
        self.tmp = tmp

    def api(self, route: str) -> str:
        return self.server.url(f"lancefn/api/v1/{route}")

    def get(self, route: str, **kwargs) -> httpx.Response:
        return httpx.get(self.api(route), headers=self.server.auth_headers(), timeout=30, **kwargs)

    def post(self, route: str, body: dict, **kwargs) -> httpx.Response:
        return httpx.post(self.api(route), json=body, headers=self.server.auth_headers(), timeout=30, **kwargs)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory) -> Iterator[Proxied]:
    """One control plane (simulated `default` class, 2 GPUs) and one `jupyter server` proxying to it."""
    base = tmp_path_factory.mktemp("jext")
    cp = ControlPlaneProcess(base / "home", args=[], env=make_env(), log_dir=base).start()
    try:
        with running_jupyter(
            base / "jupyter",
            app="server",
            env={"LANCEFN_URL": cp.url, "LANCEFN_API_KEY": cp.api_key},
        ) as server:
            yield Proxied(cp, server, base)
    finally:
        cp.stop()


def read_sse(response: httpx.Response, until, limit_s: float = 30.0) -> list[dict]:
    """Parses SSE events from a streaming response until `until(events)` is true (bounded)."""
    events: list[dict] = []
    current: dict = {}
    deadline = time.monotonic() + limit_s
    for line in response.iter_lines():
        if line == "":
            if "data" in current:
                current["data"] = json.loads(current["data"])
                events.append(current)
                if until(events):
                    return events
            current = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            current[field] = value[1:] if value.startswith(" ") else value
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"stream ended or timed out before the expected events: {events}")


# ---------------------------------------------------------------------- authentication


def _verbs(cls) -> list[str]:
    return [m for m in ("get", "post", "put", "patch", "delete", "head", "options") if m in vars(cls)]


def test_every_handler_verb_is_decorated_authenticated():
    """Static check (like the extension template's check_auth.py): every verb of every handler."""
    handler_classes = [
        obj
        for obj in vars(handlers_module).values()
        if inspect.isclass(obj)
        and issubclass(obj, handlers_module.APIHandler)
        and obj.__module__ == handlers_module.__name__
    ]
    names = {cls.__name__ for cls in handler_classes}
    assert {"StatusHandler", "ProxyHandler"} <= names
    checked = 0
    for cls in handler_classes:
        for verb in _verbs(cls):
            source = inspect.getsource(getattr(cls, verb))
            assert "@tornado.web.authenticated" in source, f"{cls.__name__}.{verb} is not authenticated"
            checked += 1
    assert checked >= 3


def test_every_route_rejects_unauthenticated_requests(proxied):
    """No token, or a wrong one → 403 on every route the extension serves, before any proxying."""
    urls = [("GET", proxied.server.url("lancefn/status"))]
    for route, methods in ALLOWED_ROUTES.items():
        for method in methods:
            urls.append((method, proxied.api(route)))
    urls += [("GET", proxied.api("functions/create")), ("POST", proxied.api("functions/create"))]
    urls += [("GET", proxied.api("jobs/events") + "?token=wrong")]
    for method, url in urls:
        for headers in ({}, {"Authorization": "token wrong-token"}):
            reply = httpx.request(method, url, headers=headers, json={} if method == "POST" else None, timeout=10)
            assert reply.status_code in (401, 403), (method, url, headers, reply.status_code, reply.text)
            assert proxied.cp.api_key not in reply.text
    assert len(urls) >= 13


# ---------------------------------------------------------------------- proxying


def test_status_names_the_control_plane_without_its_key(proxied):
    reply = httpx.get(proxied.server.url("lancefn/status"), headers=proxied.server.auth_headers(), timeout=10)
    assert reply.status_code == 200
    body = reply.json()
    assert body["connected"] is True
    assert body["url"] == proxied.cp.url
    assert body["embedded"] is False and body["source"] == "env"
    assert body["executor"] == "local"
    assert proxied.cp.api_key not in reply.text


def test_proxied_replies_equal_the_control_planes(proxied):
    with proxied.cp.http() as direct:
        version = register_gate_function(direct)
        gate = proxied.tmp / "gate-equal"
        gate.write_text("open")
        job_id = submit_gate_job(direct, "wait_for", version, gate)
        wait_job_state(direct, job_id, {"DONE"})
        bodies = dict(POST_BODIES)
        bodies["functions/describe"] = {"name": "wait_for", "version": version}
        bodies["jobs/describe"] = {"job_id": job_id}
        bodies["jobs/logs"] = {"job_id": job_id}
        bodies["jobs/list"] = {"limit": 10}
        compared = 0
        for route, methods in ALLOWED_ROUTES.items():
            if route == "jobs/events":
                continue
            for method in methods:
                rid = {"x-request-id": f"equal-{route}"}  # passed on, so even error envelopes match
                if method == "GET":
                    ours = httpx.get(proxied.api(route), headers={**proxied.server.auth_headers(), **rid})
                    theirs = direct.get(f"/v1/{route}", headers=rid)
                else:
                    ours = httpx.post(
                        proxied.api(route), json=bodies[route], headers={**proxied.server.auth_headers(), **rid}
                    )
                    theirs = direct.post(f"/v1/{route}", json=bodies[route], headers=rid)
                assert ours.status_code == theirs.status_code, (route, ours.text, theirs.text)
                assert ours.json() == theirs.json(), (route, ours.text, theirs.text)
                assert ours.headers["x-request-id"] == f"equal-{route}"
                assert ours.headers["content-type"].startswith("application/json")
                compared += 1
        assert compared == len(ALLOWED_ROUTES) - 1
    # The error envelope of the control plane is passed through unchanged.
    missing = proxied.post("jobs/describe", {"job_id": "no-such-job"})
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"code", "message", "request_id"}


def test_routes_outside_the_allow_list_are_not_proxied(proxied):
    # Registration, dropping and running go through the kernel's client, never the browser proxy.
    for route in ("functions/create", "functions/drop", "functions/run", "jobs/wait", "nope", "gpu"):
        reply = proxied.post(route, {})
        assert reply.status_code == 404, (route, reply.text)
        assert reply.json()["error"]["code"] == "not_found"
    wrong_method = proxied.post("gpu/classes", {})
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "GET"
    assert proxied.get("jobs/list").status_code == 405


def test_the_api_key_never_reaches_the_browser(proxied):
    key = proxied.cp.api_key
    assert len(key) >= 16
    seen: list[str] = []

    def record(reply: httpx.Response) -> None:
        seen.append(reply.text)
        seen.extend(f"{k}: {v}" for k, v in reply.headers.items())

    record(httpx.get(proxied.server.url("lancefn/status"), headers=proxied.server.auth_headers()))
    for route, methods in ALLOWED_ROUTES.items():
        if route == "jobs/events":
            continue
        for method in methods:
            record(proxied.get(route) if method == "GET" else proxied.post(route, POST_BODIES[route]))
    record(proxied.post("functions/create", {}))
    record(proxied.post("jobs/describe", {"job_id": key}))  # even when the browser sends it
    # A job whose result is the key itself: the proxy scrubs it from the reply.
    with proxied.cp.http() as direct:
        version = register_gate_function(direct, name="echo_path")
        secret_path = proxied.tmp / key
        secret_path.write_text("x")
        job_id = submit_gate_job(direct, "echo_path", version, secret_path)
        assert key in json.dumps(wait_job_state(direct, job_id, {"DONE"}))
    leaked = proxied.post("jobs/describe", {"job_id": job_id})
    assert leaked.status_code == 200 and "***" in leaked.text
    record(leaked)
    with httpx.stream(
        "GET", proxied.api("jobs/events"), headers={**proxied.server.auth_headers(), "Last-Event-ID": "0"}, timeout=30
    ) as stream:
        seen.extend(f"{k}: {v}" for k, v in stream.headers.items())
        events = read_sse(stream, lambda ev: any(e.get("id") and e["data"].get("job_id") == job_id for e in ev))
        seen.extend(json.dumps(e) for e in events)
    for text in seen:
        assert key not in text


def test_event_stream_is_passed_through_and_resumable(proxied):
    with proxied.cp.http() as direct:
        version = register_gate_function(direct)
        gate = proxied.tmp / "gate-sse"
        url = proxied.api("jobs/events") + f"?token={proxied.server.token}"  # how the browser's EventSource connects
        with httpx.stream("GET", url, timeout=httpx.Timeout(30.0)) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            assert stream.headers["cache-control"].startswith("no-cache")
            job_id = submit_gate_job(direct, "wait_for", version, gate)
            wait_job_state(direct, job_id, {"IN_PROGRESS"})
            gate.write_text("open")

            def finished(events: list[dict]) -> bool:
                return any(
                    e.get("event") == "job" and e["data"]["job_id"] == job_id and e["data"]["job_state"] == "DONE"
                    for e in events
                )

            events = read_sse(stream, finished)
        job_events = [e for e in events if e.get("event") == "job" and e["data"]["job_id"] == job_id]
        states = [e["data"]["job_state"] for e in job_events]
        assert states[0] == "PENDING" and "IN_PROGRESS" in states and states[-1] == "DONE", states
        assert any(e.get("event") == "usage" and "classes" in e["data"] for e in events)
        ids = [int(e["id"]) for e in job_events]
        assert ids == sorted(ids)

    # Resume: with Last-Event-ID (header, as EventSource reconnects) the stream starts right after it.
    first = ids[0]
    for how in ("header", "query"):
        headers = dict(proxied.server.auth_headers())
        url = proxied.api("jobs/events")
        if how == "header":
            headers["Last-Event-ID"] = str(first)
        else:
            url += f"?last_event_id={first}"
        with httpx.stream("GET", url, headers=headers, timeout=30) as stream:
            replay = read_sse(stream, lambda ev: any(e.get("event") == "job" for e in ev))
        assert int(next(e for e in replay if e.get("event") == "job")["id"]) == first + 1, how


def test_non_ascii_request_ids_and_bad_last_event_ids_are_400_not_500(proxied):
    auth = proxied.server.auth_headers()
    for url in (proxied.server.url("lancefn/status"), proxied.api("health"), proxied.api("jobs/events")):
        reply = httpx.get(url, headers={**auth, "x-request-id": "café".encode()}, timeout=30)
        assert reply.status_code == 400, (url, reply.status_code, reply.text)
        error = reply.json()["error"]
        assert "X-Request-Id" in error["message"] and error["request_id"].isascii()
    for last in (b"abc", "caf\u00e9".encode(), "\u0663".encode(), b"-1"):
        reply = httpx.get(proxied.api("jobs/events"), headers={**auth, "Last-Event-ID": last}, timeout=30)
        assert reply.status_code == 400, (last, reply.status_code, reply.text)
        assert "Last-Event-ID" in reply.json()["error"]["message"]
    # An anonymous request is still refused as such, whatever its headers.
    assert httpx.get(proxied.api("health"), headers={"x-request-id": "café".encode()}).status_code in (401, 403)
    # Printable ASCII ids are passed through as before.
    reply = httpx.get(proxied.api("health"), headers={**auth, "x-request-id": "trace-42"}, timeout=30)
    assert reply.status_code == 200 and reply.headers["x-request-id"] == "trace-42"


def test_client_disconnect_closes_the_upstream_stream(proxied):
    """Opening and dropping many streams must not leave the proxy stuck (each is cancelled)."""
    for _ in range(5):
        with httpx.stream("GET", proxied.api("jobs/events"), headers=proxied.server.auth_headers(), timeout=10) as s:
            assert s.status_code == 200
    assert proxied.get("gpu/usage").status_code == 200


# ---------------------------------------------------------------------- failures


def test_unreachable_control_plane_is_a_502_envelope(tmp_path):
    port = free_port()  # nothing listens there
    with running_jupyter(
        tmp_path, app="server", env={"LANCEFN_URL": f"http://127.0.0.1:{port}", "LANCEFN_API_KEY": "k" * 32}
    ) as server:
        headers = server.auth_headers()
        status = httpx.get(server.url("lancefn/status"), headers=headers, timeout=10)
        assert status.status_code == 200
        body = status.json()
        assert body["connected"] is False and body["url"] == f"http://127.0.0.1:{port}" and body["error"]
        for method, route in (("GET", "gpu/classes"), ("POST", "jobs/list"), ("GET", "jobs/events")):
            reply = httpx.request(
                method,
                server.url(f"lancefn/api/v1/{route}"),
                headers=headers,
                json={} if method == "POST" else None,
                timeout=10,
            )
            assert reply.status_code == 502, (route, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "control_plane_unreachable"
            assert error["message"].startswith("control plane unreachable")
            assert error["request_id"]
            assert "k" * 32 not in reply.text and "Traceback" not in reply.text


def test_embedded_control_plane_is_started_when_nothing_is_configured(tmp_path):
    """No LANCEFN_URL: the extension starts (or reuses) the embedded server of LANCEFN_HOME."""
    from lancefn_jupyter.embedded import read_server_info, stop_server

    home = tmp_path / "lancefn-home"
    try:
        with running_jupyter(
            tmp_path / "jupyter", app="server", env={"LANCEFN_HOME": str(home), **_no_nvml()}
        ) as server:
            status = httpx.get(server.url("lancefn/status"), headers=server.auth_headers(), timeout=90).json()
            info = read_server_info(home)
            assert info is not None
            assert status == {
                "connected": True,
                "url": info.url,
                "embedded": True,
                "source": "embedded",
                "version": status["version"],
                "executor": "local",
            }
            classes = httpx.get(server.url("lancefn/api/v1/gpu/classes"), headers=server.auth_headers(), timeout=30)
            assert classes.status_code == 200
            assert classes.json()["classes"][0]["name"] == "default"
            assert info.api_key not in json.dumps(status) and info.api_key not in classes.text
    finally:
        stop_server(home)


def _no_nvml() -> dict:
    return {"LANCEFN_DISABLE_NVML": "1"}


# ---------------------------------------------------------------------- discovery (pure)


def test_discovery_prefers_the_environment():
    target = discover({"LANCEFN_URL": "http://cp.example:8080/", "LANCEFN_API_KEY": "abc"}, ensure_embedded=_boom)
    assert target == ControlPlaneTarget("http://cp.example:8080", "abc", False, "env")
    assert "abc" not in repr(target) and "abc" not in json.dumps(target.public_dict())


def test_discovery_falls_back_to_the_embedded_server(tmp_path):
    calls = []

    def fake(home: Path):
        calls.append(home)
        return "http://127.0.0.1:9999/", "key"

    target = discover({"LANCEFN_HOME": str(tmp_path)}, ensure_embedded=fake)
    assert calls == [tmp_path]
    assert target == ControlPlaneTarget("http://127.0.0.1:9999", "key", True, "embedded")
    with pytest.raises(DiscoveryError, match="could not start the embedded control plane"):
        discover({"LANCEFN_HOME": str(tmp_path)}, ensure_embedded=_boom)


def test_redact_url_drops_userinfo():
    assert redact_url("http://user:secret@host:8080/p") == "http://host:8080/p"
    assert redact_url("http://host/p") == "http://host/p"


def _boom(home):
    raise RuntimeError("no")


# ---------------------------------------------------------------------- packaging and frontend


def _run(cmd: list[str], **kwargs) -> str:
    env = dict(os.environ)
    # The installed state only: no per-test JUPYTER_PATH or config dirs.
    for key in ("JUPYTER_PATH", "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR"):
        env.pop(key, None)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, **kwargs)
    return re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)  # no colour codes


def test_labextension_and_server_extension_are_installed_and_ok():
    """What `pip install .` must give: both extensions listed, enabled and OK (issue: blank panels)."""
    labext = _run([str(JUPYTER_BIN), "labextension", "list"])
    assert re.search(r"lancefn-jupyter v\S+ enabled\s+.*OK", labext), labext
    serverext = _run([str(JUPYTER_BIN), "server", "extension", "list"])
    assert re.search(r"lancefn_jupyter enabled", serverext), serverext
    assert re.search(r"lancefn_jupyter \S+ OK", serverext), serverext


def test_labextension_version_matches_the_python_package():
    import lancefn_jupyter

    package = json.loads((REPO / "labextension" / "package.json").read_text())
    assert package["name"] == "lancefn-jupyter"
    assert package["version"] == lancefn_jupyter.__version__
    assert package["jupyterlab"]["outputDir"] == "../lancefn_jupyter/labextension"


def test_frontend_unit_tests():
    """`npm test` in labextension/ (vitest): formatting, state labels, events, URLs, backoff."""
    labext = REPO / "labextension"
    if not (labext / "node_modules" / ".bin" / "vitest").exists():
        pytest.skip(
            "labextension/node_modules is absent: `pip install -e .` (or `npm install` in labextension/) installs it"
        )
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed")
    # CI terminals may force colour; vitest then wraps every word in ANSI codes.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CI_FORCE_COLOR")}
    env["NO_COLOR"] = "1"
    result = subprocess.run([npm, "test", "--silent"], cwd=labext, capture_output=True, text=True, timeout=300, env=env)
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    assert result.returncode == 0, output
    assert re.search(r"Tests\s+\d+ passed", output), output
