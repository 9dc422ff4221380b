"""The router (``server/http/router.py``) over real HTTP: what it answers for paths and methods it does not
serve and for a missing query parameter (each route's privilege: ``test_security.py``); its API outline; and that the
server starts without a web framework's import (the first ``%%gpu_function`` waits for that start)."""

from __future__ import annotations

import subprocess
import sys


def _error(reply, status: int) -> dict:
    assert reply.status_code == status, (reply.status_code, reply.text)
    error = reply.json()["error"]
    assert error["request_id"] == reply.headers["x-request-id"]
    return error


def test_other_methods_unknown_paths_and_missing_query_parameters(shared_control_plane):
    with shared_control_plane.http() as http:
        error = _error(http.get("/v1/jobs/list"), 405)
        assert error["code"] == "method_not_allowed" and "takes POST" in error["message"]
        assert http.get("/v1/jobs/list").headers["allow"] == "POST"
        assert _error(http.post("/v1/gpu/classes", json={}), 405)["message"].endswith("takes GET")
        assert http.post("/v1/gpu/classes", json={}).headers["allow"] == "GET"
        for path in ("/v1/nowhere", "/v1/jobs/list/", "/", "/v1/health/"):
            error = _error(http.get(path), 404)
            assert error["code"] == "not_found" and "no such endpoint" in error["message"], path
        error = _error(http.get("/v1/jobs/result"), 400)
        assert "job_id" in error["message"] and "?job_id=" in error["message"]
        # With it, the route runs (an unknown job is the route's own 404).
        assert "nope" in _error(http.get("/v1/jobs/result", params={"job_id": "nope"}), 404)["message"]
        assert http.get("/v1/health").json()["status"] == "ok"


def test_the_api_outline_lists_every_route(tmp_path):
    from test_server_functions import all_routes

    from lancefn_jupyter.server.http.app import create_app
    from lancefn_jupyter.server.plane import ControlPlane
    from lancefn_jupyter.server.policy.gpu_classes import simulated_default
    from lancefn_jupyter.server.storage.store import Store

    store = Store(tmp_path / "db.sqlite3")
    try:
        document = create_app(
            ControlPlane(store=store, classes=simulated_default(), executor=None), api_keys={}
        ).openapi()
    finally:
        store.close()
    outlined = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
    assert outlined == set(all_routes()) and len(outlined) >= 24
    result = document["paths"]["/v1/jobs/result"]["get"]
    assert result["parameters"] == [{"name": "job_id", "in": "query", "required": True, "schema": {"type": "string"}}]
    assert document["paths"]["/v1/functions/run"]["post"]["responses"].keys() == {"202"}
    assert document["components"]["securitySchemes"]["apiKey"]["name"] == "x-api-key"


def test_the_server_imports_no_web_framework(tmp_path):
    """Building the app imports neither FastAPI nor what its route analysis pulled in (``pydantic.v1``)."""
    code = (
        "import sys\n"
        "from lancefn_jupyter.server.http.app import create_app\n"
        "from lancefn_jupyter.server.plane import ControlPlane\n"
        "from lancefn_jupyter.server.policy.gpu_classes import simulated_default\n"
        "from lancefn_jupyter.server.storage.store import Store\n"
        f"store = Store({str(tmp_path / 'db.sqlite3')!r})\n"
        "create_app(ControlPlane(store=store, classes=simulated_default(), executor=None), api_keys={})\n"
        "print(sorted(m for m in ('fastapi', 'pydantic.v1') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
