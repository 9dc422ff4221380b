"""Security: the privilege rule on every route, API keys and function env values never leaking
(replies, headers, the event stream, the server log at debug level, worker environments), private
state files, loopback-only embedded server, no cross-origin access.

Already covered elsewhere and not repeated here: 401 for every route without a key or with a
wrong one (test_server_functions.py::test_every_route_but_health_rejects_missing_and_wrong_keys),
the CLI's loopback bind and 0600 files (test_server_durability.py), and the Jupyter proxy never
sending the key to the browser (test_jupyter_extension.py::test_the_api_key_never_reaches_the_browser).
"""

from __future__ import annotations

import json
import os
import stat

import httpx
import pytest
from conftest import register, registration_body
from helpers import api_keys_toml, submit, text_body
from test_server_functions import all_routes, assert_error

ANALYST = "analyst-key-0001-aaaa"
OPERATOR = "operator-key-0001-bbbb"
JOBS_ONLY = "jobs-only-key-0001-cccc"
NOBODY = "no-privilege-key-0001-dddd"
KEYS_TOML = api_keys_toml(
    {"name": "analyst", "key": ANALYST, "privileges": ["functions"]},
    {"name": "operator", "key": OPERATOR, "privileges": ["system_usage"]},
    {"name": "jobs-only", "key": JOBS_ONLY, "privileges": ["jobs"]},
    {"name": "nobody", "key": NOBODY, "privileges": []},
)
GRANTS = {ANALYST: "functions", OPERATOR: "system_usage", JOBS_ONLY: "jobs", NOBODY: None}


def privilege_of(path: str) -> str:
    """The privilege rule (docs/ARCHITECTURE.md, REST details) by path."""
    # Starting work (like functions/run) needs `functions`; reading it, `jobs`.
    if path.startswith(("/v1/batches/", "/v1/backfills/")):
        return "functions" if path in ("/v1/batches/create", "/v1/batches/retry", "/v1/backfills/create") else "jobs"
    # LanceDB 0.40's function, namespace-list and secret routes: `functions`, as ours.
    lancedb = (("/v1/function/", "functions"), ("/v1/namespace/", "functions"), ("/v1/secret/", "functions"))
    for prefix, privilege in (
        ("/v1/functions/", "functions"),
        ("/v1/jobs/", "jobs"),
        ("/v1/gpu/", "system_usage"),
        ("/v1/secrets/", "functions"),  # local_env: a version's bound values for .local() (and `jobs` too: below)
        *lancedb,
    ):
        if path.startswith(prefix):
            return privilege
    raise AssertionError(f"route {path} is not covered by the privilege rule; classify it here and in the app")


def request(cp, method: str, path: str, key: str) -> httpx.Response:
    headers = {"x-api-key": key}
    if path == "/v1/jobs/events":  # a stream: read the status and headers only
        with httpx.stream(method, cp.url + path, headers=headers, timeout=30) as reply:
            if reply.status_code >= 400:
                reply.read()
            return reply
    return httpx.request(method, cp.url + path, headers=headers, json={} if method == "POST" else None, timeout=30)


@pytest.fixture
def cp_with_keys(control_plane_factory):
    return control_plane_factory(api_keys=KEYS_TOML, args=["--log-level", "debug"])


def test_every_route_enforces_its_privilege(cp_with_keys):
    cp = cp_with_keys
    routes = [(m, p) for m, p in all_routes() if p != "/v1/health"]
    assert len(routes) >= 13
    for method, path in routes:
        needed = privilege_of(path)
        for key, granted in GRANTS.items():
            reply = request(cp, method, path, key)
            if path == "/v1/secrets/local_env" and granted == needed:  # secret values: a key that could run them
                assert_error(reply, 403, "'jobs' privilege too")
            elif granted == needed:
                assert reply.status_code not in (401, 403), (method, path, key, reply.status_code)
            else:
                assert_error(reply, 403, needed, path)
        # The admin key has every privilege.
        assert request(cp, method, path, cp.api_key).status_code not in (401, 403)


def test_no_unauthenticated_schema_docs_or_cross_origin_access(control_plane):
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        reply = httpx.get(control_plane.url + path)
        assert reply.status_code in (401, 404), (path, reply.status_code)
        assert "openapi" not in reply.text.lower() or reply.status_code == 404
    # A web page on another origin can neither preflight nor read replies (no CORS headers).
    origin = {"Origin": "https://evil.example"}
    preflight = httpx.options(
        control_plane.url + "/v1/jobs/list",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-api-key"},
    )
    assert preflight.status_code >= 400
    for reply in (preflight, httpx.get(control_plane.url + "/v1/health", headers=origin)):
        assert not any(name.lower().startswith("access-control-") for name in reply.headers), reply.headers


def test_api_key_lookalikes_and_other_carriers_are_rejected(control_plane):
    key, url = control_plane.api_key, control_plane.url + "/v1/gpu/usage"
    for wrong in (key + "x", key[:-1], key.swapcase(), key[: len(key) // 2], "é" * 8, key.encode().hex()):
        assert_error(
            httpx.get(url, headers={"x-api-key": wrong.encode("utf-8")}), 401, "API key"
        )  # raw bytes, UTF-8 included
    for carrier in (
        {"headers": {"authorization": f"Bearer {key}"}},
        {"headers": {"cookie": f"x-api-key={key}"}},
        {"params": {"x-api-key": key}},
        {"params": {"api_key": key}},
    ):
        reply = httpx.get(url, **carrier)
        assert_error(reply, 401, "API key")
        assert key not in reply.text


def test_api_keys_never_appear_in_replies_headers_or_the_debug_log(cp_with_keys):
    cp = cp_with_keys
    secrets = [cp.api_key, ANALYST, OPERATOR, JOBS_ONLY, NOBODY, cp.api_key[:-1] + "Z"]
    seen: list[str] = []

    def record(reply: httpx.Response) -> httpx.Response:
        seen.append(reply.text)
        seen.extend(f"{k}: {v}" for k, v in reply.headers.items())
        return reply

    with cp.http() as http:
        version = register(http, registration_body("double"))["version"]
        job = submit(http, "double", version, [{"x": 2}])
        record(http.post("/v1/jobs/wait", json={"job_id": job, "timeout_s": 30}))
        for method, path in all_routes():
            if path != "/v1/jobs/events":  # read below, as a stream
                record(http.request(method, path, json={} if method == "POST" else None))
        # Failing requests of every kind.
        record(http.post("/v1/functions/create", content=b"{not json"))
        record(http.post("/v1/jobs/describe", json={"job_id": "0" * 32}))  # 404
        record(http.post("/v1/functions/run", json={"name": "double", "version": "nope", "rows": [{"x": 1}]}))
        record(http.post("/v1/functions/list", json={"page_token": "bogus"}))
        record(http.get("/v1/jobs/list"))  # 405
        record(http.get("/v1/nowhere"))
        record(http.get("/v1/jobs/events", params={"last_event_id": "x"}))
        record(http.post("/v1/functions/create", content=b"x" * (65 * 1024 * 1024)))  # 413
        # A key sent where it does not belong may be echoed back to its sender (a 404 names the
        # job id it was given), but must not reach the log; those replies are not checked.
        http.post("/v1/jobs/describe", json={"job_id": cp.api_key})
        http.post("/v1/functions/run", json={"name": cp.api_key, "version": ANALYST, "rows": [{"x": 1}]})
        http.post("/v1/functions/list", json={"page_token": cp.api_key})
        http.get("/v1/nowhere", params={"api_key": cp.api_key})
        http.get("/v1/jobs/events", params={"last_event_id": cp.api_key})
    for key in secrets:
        record(httpx.get(cp.url + "/v1/gpu/usage", headers={"x-api-key": key, "x-request-id": "probe"}))
        record(httpx.post(cp.url + "/v1/jobs/list", headers={"x-api-key": key}, json={}))
    with httpx.stream(
        "GET", cp.url + "/v1/jobs/events", headers={"x-api-key": cp.api_key, "Last-Event-ID": "0"}, timeout=30
    ) as stream:
        seen.extend(f"{k}: {v}" for k, v in stream.headers.items())
        for line in stream.iter_lines():
            seen.append(line)
            if '"job_state":"DONE"' in line and '"run_function"' in line:
                break
    cp.stop()  # flush the log
    log = cp.log_text()
    assert "DEBUG" in log or "lancefn-server listening" in log
    for key in secrets:
        assert key not in log, f"a key reached the server log: {key[:6]}…"
        for text in seen:
            assert key not in text, f"a key reached a reply: {key[:6]}… in {text[:200]}"
    # Nor the process command line (the embedded server gets its key from its home, not argv).
    assert all(key not in " ".join(cp.command) for key in secrets)


ENV_VALUE = "tok-SECRET-9f8e7d6c5b4a"
PROBE = """from __future__ import annotations

import os


def probe(name: str) -> str:
    if name == "raise":
        raise ValueError(f"failed on purpose with {os.environ['SECRET_TOKEN']}")
    print("probing", name)
    value = os.environ.get(name)
    return "unset" if value is None else ("match" if value == EXPECTED else "other")
"""


def test_function_env_values_never_echoed_but_reach_the_worker(control_plane_factory):
    cp = control_plane_factory(args=["--log-level", "debug"], env={"LANCEFN_API_KEY": "server-admin-key-0123456789"})
    source = PROBE.replace("EXPECTED", repr(ENV_VALUE))
    body = text_body("probe", source, arg="name", env={"SECRET_TOKEN": ENV_VALUE})
    seen: list[str] = []

    def record(reply: httpx.Response) -> dict:
        seen.append(reply.text)
        seen.extend(f"{k}: {v}" for k, v in reply.headers.items())
        return reply.json()

    with cp.http() as http:
        created = record(http.post("/v1/functions/create", json=body))
        version = record(http.post("/v1/jobs/describe", json={"job_id": created["job_id"]}))["result"]
        assert version["runtime"]["env"] == {"SECRET_TOKEN": "<redacted>"}  # names kept, values hidden
        # A different value is a different version (the digest covers values), also redacted.
        other = dict(body, runtime={**body["runtime"], "env": {"SECRET_TOKEN": ENV_VALUE + "2"}})
        other_version = register(http, other)
        assert other_version["version"] != version["version"] and ENV_VALUE not in json.dumps(other_version)

        ok = submit(http, "probe", version["version"], [{"name": "SECRET_TOKEN"}, {"name": "LANCEFN_API_KEY"}])
        failing = submit(http, "probe", version["version"], [{"name": "raise"}])
        # The worker gets the real value; the server's admin key is not in its environment.
        assert record(http.post("/v1/jobs/wait", json={"job_id": ok, "timeout_s": 60}))["result"] == ["match", "unset"]
        failed = record(http.post("/v1/jobs/wait", json={"job_id": failing, "timeout_s": 60}))
        assert failed["job_state"] == "FAILED"
        # The user's own error quoted the value: the failure shows where it was, not what it is.
        assert "failed on purpose with <redacted>" in failed["failure"]["message"], failed["failure"]
        name, vid = version["name"], version["version"]
        record(http.post("/v1/functions/describe", json={"name": name, "version": vid}))
        record(http.post("/v1/functions/list", json={"include_definition": True}))
        record(http.post("/v1/functions/list", json={"include_definition": False, "name": name}))
        record(http.post("/v1/jobs/list", json={}))
        record(http.post("/v1/jobs/list", json={"job_type": "create_function"}))
        for job_id in (created["job_id"], ok, failing):
            record(http.post("/v1/jobs/describe", json={"job_id": job_id}))
            record(http.post("/v1/jobs/logs", json={"job_id": job_id}))
        # Errors about this function: bad rows, a bad registration carrying the env.
        record(http.post("/v1/functions/run", json={"name": name, "version": vid, "rows": [{"nope": 1}]}))
        bad = dict(body, runtime={**body["runtime"], "env": {"SECRET_TOKEN": ENV_VALUE, "1BAD": ENV_VALUE}})
        assert record(http.post("/v1/functions/create", json=bad))["error"]["code"] == "invalid_request"
        with http.stream("GET", "/v1/jobs/events", headers={"Last-Event-ID": "0"}) as stream:
            for line in stream.iter_lines():
                seen.append(line)
                if failing in line and '"FAILED"' in line:
                    break
    cp.stop()
    assert "probing SECRET_TOKEN" in "\n".join(seen)  # the logs were read
    for text in [*seen, cp.log_text()]:
        assert ENV_VALUE not in text, text[:300]


def test_env_values_not_shown_by_the_magic_or_the_handle(control_plane):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    from lancefn_jupyter.kernel import api

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "lancefn_jupyter")
    api.connect(control_plane.url, control_plane.api_key)
    try:
        with capture_output() as shown:
            result = shell.run_cell(
                f"%%gpu_function num_gpus=1 env=SECRET_TOKEN={ENV_VALUE}\ndef plain(x: int) -> int:\n    return x\n"
            )
        assert result.success
        handle = shell.user_ns["plain"]
        texts = [shown.stdout, shown.stderr, repr(handle), repr(handle.version), *(str(o.data) for o in shown.outputs)]
        assert "SECRET_TOKEN" in "".join(texts)  # the name is shown
        for text in texts:
            assert ENV_VALUE not in text
    finally:
        shell.reset()


def test_embedded_home_is_private_and_its_server_listens_on_loopback_only(tmp_path, monkeypatch):
    from lancefn_jupyter.embedded import ensure_server, stop_server

    monkeypatch.setenv("LANCEFN_DISABLE_NVML", "1")
    home = tmp_path / "home"
    info = ensure_server(home)
    try:
        with httpx.Client(base_url=info.url, headers={"x-api-key": info.api_key}) as http:
            register(http, registration_body("double", env={"TOKEN": ENV_VALUE}))
        assert httpx.URL(info.url).host == "127.0.0.1"
        port = httpx.URL(info.url).port
        listening = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = open(table).read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    listening.add(local.rsplit(":", 1)[0])
        assert listening == {"0100007F"}, listening  # 127.0.0.1 only, not 0.0.0.0 or ::
        assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
        for name in ("server.json", "api_key", "lancefn.sqlite3", "lancefn.sqlite3-wal", "lancefn.sqlite3-shm"):
            path = home / name
            if path.exists():
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, name
        assert (home / "lancefn.sqlite3").exists() and (home / "server.json").exists()
        # The key is in no file but server.json and api_key (e.g. not the log).
        for path in home.iterdir():
            if (
                path.is_file()
                and path.name not in ("server.json", "api_key")
                and not path.name.startswith("lancefn.sqlite3")
            ):
                assert info.api_key not in path.read_text(errors="replace"), path.name
    finally:
        stop_server(home)


def test_redact_env_replaces_values_longest_first_and_leaves_flags():
    from lancefn_jupyter.server.executors.base import redact_env

    envs = [{"A": "secret-abc", "B": "secret-abc-longer"}, {"FLAG": "1", "MODE": "on"}]
    text = "A=secret-abc B=secret-abc-longer FLAG=1 MODE=on"
    assert redact_env(text, envs) == "A=<redacted> B=<redacted> FLAG=1 MODE=on"
    assert redact_env(text, []) == text
