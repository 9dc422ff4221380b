"""Function catalog over real HTTP: auth, privileges, registration, idempotency, listing,
dropping, and bad input that must give a readable 4xx (never 5xx, never a traceback)."""

from __future__ import annotations

import hashlib
import json
import stat

import httpx
import pytest
from conftest import register, registration_body
from helpers import api_keys_toml

from lancefn_jupyter.wire.models import FunctionRegistrationRequest, FunctionVersion, Job, version_id

TWO_CLASSES = """
[[gpu_classes]]
name = "default"
simulated = 2

[[gpu_classes]]
name = "big"
gpu_model = "Simulated big GPU"
simulated = 4
max_gpu_count_per_worker = 3
"""


def assert_error(reply: httpx.Response, status: int, *words: str) -> str:
    """The reply is the error envelope with ``status``; returns its message."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "request_id"}, error
    assert error["request_id"] == reply.headers["x-request-id"]
    assert "Traceback" not in reply.text and 'File "' not in reply.text
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error["message"]


def all_routes() -> list[tuple[str, str]]:
    """Every (method, path) the app serves, read from the real app's router."""
    import tempfile

    from lancefn_jupyter.server.http.app import create_app
    from lancefn_jupyter.server.plane import ControlPlane
    from lancefn_jupyter.server.policy.gpu_classes import simulated_default
    from lancefn_jupyter.server.storage.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"{tmp}/db.sqlite3")
        app = create_app(ControlPlane(store=store, classes=simulated_default(), executor=None), api_keys={})
        routes = [(route.method, route.path) for route in app.router.routes]
        store.close()
    return routes


# ------------------------------------------------------------------------ auth


def test_health_needs_no_key_and_request_ids_are_echoed(control_plane):
    reply = httpx.get(control_plane.url + "/v1/health", headers={"x-request-id": "trace-123"})
    assert reply.status_code == 200
    assert reply.json() == {"status": "ok", "version": "0.1.0", "executor": "local"}
    assert reply.headers["x-request-id"] == "trace-123"
    # Without one, the server makes one up.
    assert len(httpx.get(control_plane.url + "/v1/health").headers["x-request-id"]) >= 16


def test_every_route_but_health_rejects_missing_and_wrong_keys(control_plane):
    routes = all_routes()
    assert ("GET", "/v1/health") in routes and ("POST", "/v1/jobs/wait") in routes
    assert len(routes) >= 14
    checked = 0
    for method, path in routes:
        if path == "/v1/health":
            continue
        for headers in ({}, {"x-api-key": "wrong-key"}, {"x-api-key": ""}):
            # A broken body must not matter: authentication comes first.
            reply = httpx.request(
                method, control_plane.url + path, headers=headers, content=b"{not json" if method == "POST" else None
            )
            assert_error(reply, 401, "API key")
            assert control_plane.api_key not in reply.text
            checked += 1
    assert checked == 3 * (len(routes) - 1)


def test_privileges_from_the_api_keys_file(control_plane_factory):
    keys = api_keys_toml(
        {"name": "analyst", "key": "analyst-key-0001", "privileges": ["functions", "jobs"]},
        {"name": "operator", "key": "operator-key-0001", "privileges": ["system_usage"]},
    )
    cp = control_plane_factory(api_keys=keys)
    analyst = {"x-api-key": "analyst-key-0001"}
    operator = {"x-api-key": "operator-key-0001"}
    for path in ("/v1/gpu/classes", "/v1/gpu/usage"):
        assert_error(httpx.get(cp.url + path, headers=analyst), 403, "system_usage")
        assert httpx.get(cp.url + path, headers=operator).status_code == 200
    assert httpx.post(cp.url + "/v1/functions/list", headers=analyst, json={}).status_code == 200
    assert_error(httpx.post(cp.url + "/v1/functions/list", headers=operator, json={}), 403, "functions")
    assert_error(httpx.post(cp.url + "/v1/jobs/list", headers=operator, json={}), 403, "jobs")
    # The admin key from server.json still has every privilege.
    assert httpx.get(cp.url + "/v1/gpu/classes", headers=cp.client_headers).status_code == 200


def test_gpu_classes_and_usage(control_plane_factory):
    cp = control_plane_factory(TWO_CLASSES)
    with cp.http() as http:
        classes = http.get("/v1/gpu/classes").json()["classes"]
        assert [c["name"] for c in classes] == ["default", "big"]
        assert classes[1]["gpu_model"] == "Simulated big GPU" and classes[1]["simulated"] is True
        assert classes[1]["max_gpu_count_per_worker"] == 3
        usage = http.get("/v1/gpu/usage").json()["classes"]
        assert usage == [
            {"name": "default", "gpus_total": 2, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 0},
            {"name": "big", "gpus_total": 4, "gpus_busy": 0, "jobs_running": 0, "jobs_pending": 0},
        ]


# ---------------------------------------------------------------- registration


def test_env_values_cannot_be_guessed_from_digests_and_ids_stay_stable_on_one_server(control_plane_factory):
    body = registration_body(env={"PIN": "123456"})
    runtime = FunctionRegistrationRequest.from_wire(body).runtime
    unkeyed = "sha256:" + hashlib.sha256(runtime.to_canonical_json().encode()).hexdigest()
    cp = control_plane_factory()
    with cp.http() as http:
        first = register(http, body)
        assert register(http, body)["version"] == first["version"]
    assert first["runtime_digest"] != unkeyed  # hashing guessed PINs offline finds nothing
    assert first["version"] != version_id(FunctionRegistrationRequest.from_wire(body))
    assert stat.S_IMODE((cp.home / "digest_key").stat().st_mode) == 0o600
    cp.restart()
    with cp.http() as http:
        again = register(http, body)
    assert (again["version"], again["runtime_digest"]) == (first["version"], first["runtime_digest"])
    with control_plane_factory().http() as http:  # another server (home) keys with its own secret
        elsewhere = register(http, body)
    assert elsewhere["runtime_digest"] != first["runtime_digest"] and elsewhere["version"] != first["version"]
    plain = registration_body()  # no env: the id any server derives, as before
    with cp.http() as http:
        assert register(http, plain)["version"] == version_id(FunctionRegistrationRequest.from_wire(plain))


def test_create_returns_a_done_job_whose_result_is_the_function_version(control_plane):
    body = registration_body()
    with control_plane.http() as http:
        reply = http.post("/v1/functions/create", json=body)
        assert reply.status_code == 202
        assert set(reply.json()) == {"job_id"}
        job = Job.from_wire(http.post("/v1/jobs/describe", json={"job_id": reply.json()["job_id"]}).json())
        assert job.job_type == "create_function" and job.job_state.value == "DONE"
        version = FunctionVersion.from_wire(job.result)
        request = FunctionRegistrationRequest.from_wire(body)
        assert version.name == "double"
        assert version.version == version_id(request)
        assert version.artifact.digest == body["artifact"]["digest"]
        assert version.runtime.resources.num_gpus == 1
        assert version.runtime_digest.startswith("sha256:") and version.environment_digest.startswith("sha256:")
        described = http.post("/v1/functions/describe", json={"name": "double", "version": version.version}).json()
        assert described == {**job.result, "namespace": "default"}  # describe also names the namespace
        # The FunctionVersion never carries the artifact bytes.
        assert "content" not in json.dumps(described)


def test_identical_registration_is_idempotent_and_changes_make_new_versions(control_plane):
    with control_plane.http() as http:
        first = register(http, registration_body())
        again = register(http, registration_body())
        assert again == first  # same version id and same created_at: no new row
        listed = http.post("/v1/functions/list", json={"name": "double"}).json()
        assert listed == {"functions": [{"name": "double", "version": first["version"], "namespace": "default"}]}

        variants = [
            registration_body(num_gpus=2),
            registration_body(packages=("numpy",)),
            registration_body(source="def double(x: int) -> int:\n    return x + x\n"),
            registration_body(gpu_class="default"),
        ]
        versions = {register(http, body)["version"] for body in variants}
        assert len(versions) == 4 and first["version"] not in versions
        listed = http.post("/v1/functions/list", json={"name": "double"}).json()["functions"]
        assert len(listed) == 5
        # Package order and duplicates do not matter (canonical request).
        assert register(http, registration_body(packages=("numpy", "numpy")))["version"] in versions


def test_cpu_function_registers_without_resources(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body(num_gpus=None))
        assert version["runtime"]["kind"] == "python" and "resources" not in version["runtime"]


def test_unknown_gpu_class_and_too_many_gpus_name_classes_and_limits(control_plane_factory):
    cp = control_plane_factory(TWO_CLASSES)
    with cp.http() as http:
        message = assert_error(
            http.post("/v1/functions/create", json=registration_body(gpu_class="h100")), 400, "'h100'", "default", "big"
        )
        assert "max 2" in message and "max 3" in message
        assert_error(
            http.post("/v1/functions/create", json=registration_body(num_gpus=3)),
            400,
            "num_gpus=3",
            "'default'",
            "max_gpu_count_per_worker of 2",
            "big: 3",
        )
        assert_error(
            http.post("/v1/functions/create", json=registration_body(num_gpus=4, gpu_class="big")), 400, "'big'", "of 3"
        )
        assert register(http, registration_body(num_gpus=3, gpu_class="big"))["runtime"]["resources"]["num_gpus"] == 3
        assert len(http.post("/v1/functions/list", json={}).json()["functions"]) == 1


def test_describe_and_run_of_unknown_versions_are_404(control_plane):
    with control_plane.http() as http:
        assert_error(http.post("/v1/functions/describe", json={"name": "double", "version": "0" * 16}), 404, "double@")
        assert_error(http.post("/v1/functions/run", json={"name": "nope", "version": "x", "rows": [{}]}), 404, "nope@x")
        assert_error(http.post("/v1/functions/drop", json={"name": "nope", "version": "x"}), 404)
        assert_error(http.post("/v1/jobs/describe", json={"job_id": "missing"}), 404, "missing")
        assert_error(http.post("/v1/jobs/cancel", json={"job_id": "missing"}), 404)
        assert_error(http.post("/v1/jobs/logs", json={"job_id": "missing"}), 404)
        assert_error(http.post("/v1/jobs/wait", json={"job_id": "missing", "timeout_s": 0}), 404)
        assert_error(http.get("/v1/nothing-here"), 404)


def test_list_pages_through_every_version(control_plane):
    with control_plane.http() as http:
        made = [register(http, registration_body(f"fn{i}"))["version"] for i in range(5)]
        seen, token, pages = [], None, 0
        while True:
            body = {"limit": 2, "include_definition": True, **({"page_token": token} if token else {})}
            reply = http.post("/v1/functions/list", json=body).json()
            pages += 1
            for item in reply["functions"]:
                assert item["definition"]["version"] == item["version"]
                seen.append(item["version"])
            token = reply.get("page_token")
            if token is None:
                break
        assert seen == made and pages == 3
        # Without include_definition, only names and versions.
        assert "definition" not in http.post("/v1/functions/list", json={}).json()["functions"][0]
        assert_error(http.post("/v1/functions/list", json={"page_token": "bogus"}), 400, "page_token")


def test_drop_hides_a_version_and_registering_again_restores_it(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body())["version"]
        keep = register(http, registration_body("other"))["version"]
        ref = {"name": "double", "version": version}
        assert http.post("/v1/functions/drop", json=ref).json() == {"dropped": True}
        assert http.post("/v1/functions/drop", json=ref).json() == {"dropped": False}
        assert_error(http.post("/v1/functions/describe", json=ref), 404, "dropped")
        assert_error(http.post("/v1/functions/run", json={**ref, "rows": [{"x": 1}]}), 404, "dropped")
        assert http.post("/v1/functions/list", json={}).json()["functions"] == [
            {"name": "other", "version": keep, "namespace": "default"}
        ]
        assert register(http, registration_body())["version"] == version
        assert http.post("/v1/functions/describe", json=ref).status_code == 200


# ------------------------------------------------------------------ bad input


def test_run_rows_must_match_the_signature(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body(inputs=(("x", "int64", False), ("y", "int64", True))))["version"]
        ref = {"name": "double", "version": version}
        assert_error(http.post("/v1/functions/run", json={**ref, "rows": []}), 400, "non-empty list")
        assert_error(http.post("/v1/functions/run", json={**ref, "rows": {"x": 1}}), 400, "rows")
        assert_error(http.post("/v1/functions/run", json={**ref, "rows": [5]}), 400, "rows[0]")
        assert_error(
            http.post("/v1/functions/run", json={**ref, "rows": [{"x": 1, "y": 2}, {"x": 1, "z": 3}]}),
            400,
            "rows[1]",
            "missing parameter(s) y",
            "unknown parameter(s) z",
            "(x, y)",
        )
        assert_error(
            http.post("/v1/functions/run", json={**ref, "rows": [{"x": 1, "y": 1}], "timeout_s": 0}), 400, "timeout_s"
        )
        assert_error(
            http.post("/v1/functions/run", json={**ref, "rows": [{"x": 1, "y": 1}], "timeout_s": "5"}), 400, "timeout_s"
        )
        # Nothing was queued by any of these.
        assert http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"] == []


def _bad_registrations() -> list[tuple[dict, list[str]]]:
    def with_runtime(**resources):
        body = registration_body()
        body["runtime"]["resources"] = resources
        return body

    wrong_digest = registration_body()
    wrong_digest["artifact"]["digest"] = "sha256:" + "0" * 64
    bad_b64 = registration_body()
    bad_b64["artifact"]["content"]["data"] = "!!!not base64"
    bad_python = registration_body(source="def double(x: int) -> int\n    return x\n")
    no_entry = registration_body(entrypoint="triple")
    missing_artifact = registration_body()
    del missing_artifact["artifact"]
    bad_name = registration_body("1-bad name")
    v2_without_resources = registration_body()
    del v2_without_resources["runtime"]["resources"]
    unknown_kind = registration_body()
    unknown_kind["runtime"]["kind"] = "python_v9"
    return [
        (with_runtime(num_gpus="1"), ["num_gpus"]),
        (with_runtime(num_gpus=True), ["num_gpus"]),
        (with_runtime(num_gpus=0), ["num_gpus"]),
        (with_runtime(num_gpus=1.5), ["num_gpus"]),
        (with_runtime(num_gpus=-1), ["num_gpus"]),
        (wrong_digest, ["digest"]),
        (bad_b64, ["base64"]),
        (bad_python, ["not valid Python"]),
        (no_entry, ["'triple'"]),
        (missing_artifact, ["artifact"]),
        (bad_name, ["name"]),
        (v2_without_resources, ["resources"]),
        (unknown_kind, ["python_v9"]),
        ([], ["JSON object"]),
        ("double", ["JSON object"]),
    ]


@pytest.mark.parametrize("index", range(len(_bad_registrations())))
def test_bad_registrations_are_400_naming_the_field(shared_control_plane, index):
    body, words = _bad_registrations()[index]
    with shared_control_plane.http() as http:
        assert_error(http.post("/v1/functions/create", json=body), 400, *words)
        # Nothing was registered (this module's other tests don't use the shared server).
        assert http.post("/v1/functions/list", json={}).json()["functions"] == []


BAD_BODIES = [
    ("/v1/functions/describe", b"not json", "not valid JSON"),
    ("/v1/functions/describe", b"", "empty"),
    ("/v1/functions/describe", b"[]", "JSON object"),
    ("/v1/functions/describe", b'{"name": 5, "version": "x"}', "name"),
    ("/v1/functions/describe", b'{"name": "x"}', "version"),
    ("/v1/functions/list", b'{"include_definition": "yes"}', "include_definition"),
    ("/v1/functions/list", b'{"limit": 0}', "limit"),
    ("/v1/functions/run", b'{"name": "x", "version": "y", "rows": [{"x": NaN}]}', "NaN"),
    ("/v1/functions/run", b'{"name": "x", "version": "y", "rows": [], "timeout_s": true}', "timeout_s"),
    ("/v1/functions/create", b"\xff\xfe\x00garbage", "not valid JSON"),
    ("/v1/functions/create", b"[" * 100_000 + b"]" * 100_000, "JSON"),
    ("/v1/jobs/describe", b'{"job_id": 7}', "job_id"),
    ("/v1/jobs/list", b'{"state": "RUNNING"}', "state"),
    ("/v1/jobs/list", b'{"job_type": "x"}', "job_type"),
    ("/v1/jobs/logs", b'{"job_id": "x", "offset": -1}', "offset"),
    ("/v1/jobs/wait", b'{"job_id": "x", "timeout_s": 61}', "timeout_s"),
    ("/v1/jobs/cancel", b'{"job_id": null}', "job_id"),
    ("/v1/jobs/list", b'{"page_token": "@@@"}', "page_token"),
    ("/v1/jobs/logs", b'{"job_id": "x", "offset": 100000000000000000000000}', "offset"),
    ("/v1/functions/run", b'{"name": "x", "version": "y", "rows": [], "timeout_s": 1e300}', "timeout_s"),
    ("/v1/functions/describe", b'{"name": "\\ud800", "version": "x"}', "surrogate"),
    ("/v1/functions/run", b'{"name": "x", "version": "y", "rows": [{"x": "\\udfff"}]}', "surrogate"),
]


@pytest.mark.parametrize("path, raw, word", BAD_BODIES)
def test_malformed_bodies_are_400_with_a_readable_message(shared_control_plane, path, raw, word):
    with shared_control_plane.http() as http:
        reply = http.post(path, content=raw, headers={"content-type": "application/json", "x-request-id": "req-42"})
        assert_error(reply, 400, word)
        assert reply.json()["error"]["request_id"] == "req-42"


def test_bad_last_event_id_is_400(shared_control_plane):
    with shared_control_plane.http() as http:
        assert_error(http.get("/v1/jobs/events", params={"last_event_id": "abc"}), 400, "last_event_id")


def test_secret_env_values_never_appear_in_errors(control_plane):
    body = registration_body(env={"TOKEN": "s3cr3t-value"})
    body["runtime"]["resources"]["num_gpus"] = "two"
    with control_plane.http() as http:
        reply = http.post("/v1/functions/create", json=body)
        assert_error(reply, 400, "num_gpus")
        assert "s3cr3t-value" not in reply.text
    assert "s3cr3t-value" not in control_plane.log_text()


def test_bodies_over_the_limit_are_413(control_plane_factory):
    cp = control_plane_factory(args=["--max-body-bytes", "2000"])
    with cp.http() as http:
        assert_error(http.post("/v1/functions/create", content=b"x" * 5000), 413, "2000 bytes")

        def chunks():  # no content-length: the limit must hold for streamed bodies too
            for _ in range(10):
                yield b"y" * 500

        assert_error(http.post("/v1/functions/create", content=chunks()), 413)
        assert http.post("/v1/functions/list", json={}).status_code == 200


# ----------------------------------------------------------------- fuzzing


def test_random_json_on_every_route_never_gives_5xx_or_a_traceback(shared_control_plane):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**80), max_value=2**80)
        | st.floats(allow_nan=False)
        | st.text(max_size=20)
    )
    keys = st.sampled_from(
        [
            "name",
            "version",
            "rows",
            "job_id",
            "timeout_s",
            "offset",
            "limit",
            "page_token",
            "state",
            "job_type",
            "include_definition",
            "artifact",
            "signature",
            "runtime",
            "x",
            "\x00",
            "é",
        ]
    )
    values = st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4), max_leaves=12
    )
    bodies = st.dictionaries(keys, values, max_size=6) | values
    paths = st.sampled_from(
        [
            "/v1/functions/create",
            "/v1/functions/describe",
            "/v1/functions/list",
            "/v1/functions/drop",
            "/v1/functions/run",
            "/v1/jobs/describe",
            "/v1/jobs/list",
            "/v1/jobs/cancel",
            "/v1/jobs/logs",
            "/v1/jobs/wait",
        ]
    )

    with shared_control_plane.http() as http:

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(path=paths, body=bodies)
        def check(path, body):
            if path == "/v1/jobs/wait" and isinstance(body, dict):
                body = {**body, "timeout_s": 0}  # don't long-poll real jobs
            reply = http.post(path, content=json.dumps(body).encode())
            assert reply.status_code < 500, (path, body, reply.text)
            assert "Traceback" not in reply.text and 'File "' not in reply.text
            if reply.status_code >= 400:
                assert reply.json()["error"]["code"] != "request_failed", (path, body, reply.text)

        check()
