"""Bad input, generated: property-based tests (hypothesis) at every edge that takes user input.

* magic lines through the real ``%%gpu_function`` magic in an IPython shell: only ``UsageError``,
  nothing registered on error (test_options.py fuzzes the pure parser; this goes through the magic,
  the packaging and the control plane);
* cell sources, from garbage text to Python built from tricky fragments: only ``UsageError`` from
  the magic (or the cell's own error shown by IPython), only ``PackagingError`` from packaging;
* wire models: valid registration requests with one part broken, decoded and sent to the server:
  ``ValidationError`` / a 400 whose message names the broken field (test_models.py fuzzes arbitrary
  JSON);
* an OpenAPI-driven generator (schemathesis) against a real control plane: the app's own OpenAPI
  document, completed with the request-body schemas its routes parse by hand; no 5xx, no hang, every
  error the readable envelope.

Example counts are kept modest for a 2-core CI (derandomized, so runs are repeatable).
The GPU-class and API-key files (random TOML) are fuzzed in test_fuzz_config.py.
"""

from __future__ import annotations

import base64
import copy

import httpx
import pytest
from conftest import registration_body
from helpers import OPTION_LINE_TOKENS, fuzz
from hypothesis import given
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
from pydantic import ValidationError

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.packaging import PackagingError, package_cell
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.wire.models import FunctionRegistrationRequest

# Cells without a trailing newline make IPython's transformer warn; that is the input under test.
pytestmark = pytest.mark.filterwarnings("ignore:`make_tokens_by_line`:UserWarning")


def versions(cp) -> set[tuple[str, str]]:
    with cp.http() as http:
        reply = http.post("/v1/functions/list", json={"limit": 1000}).json()
    return {(f["name"], f["version"]) for f in reply["functions"]}


@pytest.fixture(scope="module")
def shell(shared_control_plane):
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "lancefn_jupyter")
    api.connect(shared_control_plane.url, shared_control_plane.api_key)
    kernel_session.profiles.clear()
    api.gpu_profile("p", num_gpus=2, pip=["numpy"])
    ip.user_ns["NOTEBOOK_FRAME"] = object()  # a notebook value that cannot be packaged
    ip.user_ns["LIMIT"] = 7  # one that can (a literal)
    yield ip
    kernel_session.profiles.clear()
    ip.reset()


def run_magic(shell, line: str, cell: str):
    """The real cell magic; returns the exception it raised (None if none)."""
    with capture_output():
        try:
            shell.run_cell_magic("gpu_function", line, cell)
        except Exception as error:
            return error
    return None


# ------------------------------------------------------------------------ magic lines

_TOKENS = st.sampled_from(
    [
        *OPTION_LINE_TOKENS,
        "2",
        "yes",
        "no",
        "A=1",
        "numpy",
        "default",
        "big",
        "p",
        "nan",
        "inf",
        "1e309",
        "$HOME",
        "{x}",
        "é",
        "\t",
        "#",
        ";",
        "%%gpu_function",
        "plain",
    ]
)
LINES = st.one_of(
    st.text(max_size=30), st.lists(_TOKENS, max_size=10).map("".join), st.lists(_TOKENS, max_size=6).map(" ".join)
)
CELL = "def fuzzed(x: int) -> int:\n    return x + LIMIT\n"


@fuzz(120)
@given(line=LINES)
def test_random_magic_lines_raise_only_usage_error_and_register_nothing_on_error(shell, shared_control_plane, line):
    before = versions(shared_control_plane)
    error = run_magic(shell, line, CELL)
    if error is None:
        return  # a valid line (registered, or register=no)
    assert isinstance(error, UsageError), (line, repr(error))
    assert str(error).strip(), line
    assert versions(shared_control_plane) == before, line


# ----------------------------------------------------------------------- cell sources

FRAGMENTS = [
    "def inc(x: int) -> int:\n    return x + 1\n",
    "def bare(x):\n    return x\n",
    "def _private(x: int) -> int:\n    return x\n",
    "import math\n",
    "import numpy as np\n",
    "from math import sqrt\n",
    "import not_a_module_xyz\n",
    "K = 3\n",
    "K = [1, 2]\n",
    "h = lambda x: x\n",
    "def uses_frame(x: int) -> int:\n    return x + NOTEBOOK_FRAME\n",
    "def uses_limit(x: int) -> int:\n    return x + LIMIT\n",
    "def uses_undefined(x: int) -> int:\n    return x + UNDEFINED_NAME_XYZ\n",
    "def dyn(x: int) -> int:\n    return eval('x')\n",
    "def gl(x: int) -> int:\n    return globals()['K']\n",
    "class C:\n    pass\n",
    "async def coro(x: int) -> int:\n    return x\n",
    "def star(*args: int) -> int:\n    return 0\n",
    "def kwonly(*, x: int) -> int:\n    return x\n",
    "def default(x: int = 1) -> int:\n    return x\n",
    "def optional(x: 'int | None') -> int:\n    return 0\n",
    "def nested(x: list[list[int]]) -> dict:\n    return {}\n",
    "def weird(x: 'not a type') -> 'nor this':\n    return x\n",
    "def gen(x: int) -> int:\n    yield x\n",
    "def closure(x: int) -> int:\n    def inner() -> int:\n        return x\n    return inner()\n",
    "x = 1\nx += 1\n",
    "print('hi')\n",
    "inc(1)\n",
    "raise ValueError('boom')\n",
    "del K\n",
    "if True:\n    def cond(x: int) -> int:\n        return x\n",
    "for i in range(2):\n    pass\n",
    "try:\n    import not_a_module_xyz\nexcept ImportError:\n    pass\n",
    "global Z\nZ = 1\n",
    "%time 1\n",
    "!true\n",
    "def broken(x: int) -> int:\n    return x +\n",
    "    indented = 1\n",
    "\n\n# only a comment\n",
    "@staticmethod\ndef decorated(x: int) -> int:\n    return x\n",
    "def shadow(int: int) -> int:\n    return int\n",
    "def inc(x: str) -> str:\n    return x\n",
]
CELLS = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5).map("".join),
    st.text(max_size=60),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
ENTRY_LINES = st.sampled_from(["", "register=no", "name=inc", "name=missing", "name=coro register=no", "num_gpus=1"])


@fuzz(150)
@given(cell=CELLS, line=ENTRY_LINES)
def test_random_cells_through_the_magic_raise_only_usage_error(shell, shared_control_plane, cell, line):
    before = versions(shared_control_plane)
    error = run_magic(shell, line, cell)
    if error is not None:
        assert isinstance(error, UsageError), (cell, line, repr(error))
        assert "Traceback" not in str(error)
        assert versions(shared_control_plane) == before, (cell, line)


@fuzz(400)
@given(cell=CELLS)
def test_packaging_random_cells_raises_only_packaging_error(cell):
    namespace: dict = {"NOTEBOOK_FRAME": object(), "LIMIT": 7, "K": 3}
    try:
        exec(compile(cell, "<cell>", "exec"), namespace)  # the magic runs the cell before packaging it
    except BaseException:
        return
    try:
        packaged = package_cell(cell, namespace)
    except PackagingError as error:
        assert str(error).strip() and "line None" not in str(error)
        return
    assert packaged.entrypoint in namespace
    compile(packaged.source.decode("utf-8"), "<artifact>", "exec")  # what it emits is valid Python


# ------------------------------------------------------------------------- wire models


def _paths(value, prefix=()):
    """Every (path) into a JSON value, containers included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


VALID = registration_body("fuzzed", env={"TOKEN": "t"}, packages=("numpy",))
PATHS = [path for path in _paths(VALID) if path]
REPLACEMENTS = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        2**64,
        "",
        " ",
        "x" * 300,
        "\x00",
        "é",
        [],
        [1],
        {},
        {"k": "v"},
        "sha256:00",
        "python_v2",
        "pip",
    ]
)
MUTATIONS = st.tuples(st.sampled_from(PATHS), st.sampled_from(["replace", "delete", "add"]), REPLACEMENTS)


def mutate(body: dict, path: tuple, how: str, value):
    body = copy.deepcopy(body)
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "delete":
        if isinstance(parent, dict):
            del parent[last]
        else:
            parent.pop(last)
    elif how == "add" and isinstance(parent, dict):
        parent["unknown_" + str(last)] = value
    else:
        parent[last] = value
    return body


def _names(path: tuple) -> set[str]:
    return {str(part) for part in path if isinstance(part, str)}


@fuzz(250)
@given(MUTATIONS)
def test_broken_registration_requests_fail_naming_the_field(shared_control_plane, mutation):
    path, how, value = mutation
    body = mutate(VALID, path, how, value)
    try:
        FunctionRegistrationRequest.from_wire(body)
        decoded = True
    except ValidationError as error:
        decoded = False
        locations = {str(part) for item in error.errors() for part in item["loc"]}
        # The error points into the broken part: the field itself, or (for a broken container or a
        # cross-field rule such as "python_v2 needs resources") one of its ancestors.
        assert locations & _names(path) or any(not item["loc"] for item in error.errors()) or len(path) == 1, (
            path,
            how,
            value,
            error.errors(),
        )
    with shared_control_plane.http() as http:
        reply = http.post("/v1/functions/create", json=body)
    assert reply.status_code in (202, 400), (path, how, value, reply.text)
    if reply.status_code == 400:
        error = reply.json()["error"]
        assert error["code"] == "invalid_request" and error["message"]
        assert "Traceback" not in reply.text
        # A readable message naming what to fix: a field of the broken path or the artifact digest.
        named = _names(path) | {"digest", "artifact", "runtime", "body", "request"}
        assert any(name in error["message"] for name in named), (path, how, value, error["message"])
    else:
        assert decoded, (path, how, value, reply.text)


# ------------------------------------------------------------- OpenAPI-driven (schemathesis)


def openapi_document() -> dict:
    """The control plane's OpenAPI document (the app generates it; it is not served, so that no
    route but /v1/health answers without a key), with the request bodies its routes parse by
    hand described from the same pydantic models, and the x-api-key scheme."""
    import tempfile

    from lancefn_jupyter.server.http import app as app_module
    from lancefn_jupyter.server.http.routes import backfills, batches, functions, jobs, secrets
    from lancefn_jupyter.server.plane import ControlPlane
    from lancefn_jupyter.server.policy.gpu_classes import simulated_default
    from lancefn_jupyter.server.storage.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"{tmp}/db.sqlite3")
        app = app_module.create_app(ControlPlane(store=store, classes=simulated_default(), executor=None), api_keys={})
        document = app.openapi()
        store.close()
    bodies = {
        "/v1/functions/create": FunctionRegistrationRequest,
        "/v1/functions/describe": functions.NameVersion,
        "/v1/functions/list": functions.ListFunctions,
        "/v1/functions/drop": functions.NameVersion,
        "/v1/functions/artifact": functions.NameVersion,
        "/v1/functions/history": functions.History,
        "/v1/functions/diff": functions.Diff,
        "/v1/functions/run": functions.Run,
        "/v1/jobs/describe": jobs.JobId,
        "/v1/jobs/list": jobs.ListJobs,
        "/v1/jobs/cancel": jobs.JobId,
        "/v1/jobs/logs": jobs.Logs,
        "/v1/jobs/wait": jobs.Wait,
        "/v1/batches/create": batches.BatchCreate,
        "/v1/batches/describe": batches.BatchDescribe,
        "/v1/batches/list": batches.ListBatches,
        "/v1/batches/cancel": batches.BatchId,
        "/v1/batches/retry": batches.BatchId,
        "/v1/batches/wait": batches.BatchWait,
        "/v1/backfills/create": backfills.BackfillCreate,
        "/v1/backfills/errors": backfills.BackfillErrors,
        "/v1/batches/pause": batches.BatchId,
        "/v1/batches/resume": batches.BatchId,
        "/v1/jobs/pause": jobs.JobId,
        "/v1/jobs/resume": jobs.JobId,
        "/v1/jobs/query_events": jobs.QueryEvents,
        # LanceDB 0.40's routes ("LanceDB 0.40 dialect"): the function's or secret's id is the path's segment
        "/v1/function/{id}/create": FunctionRegistrationRequest,
        "/v1/function/{id}/describe": functions.LanceVersion,
        "/v1/function/{id}/drop": functions.LanceVersion,
        "/v1/secret/{id}/create": secrets.SecretValue,
        "/v1/secret/{id}/alter": secrets.SecretValue,
        "/v1/secret/{id}/describe": secrets.NoFields,
        "/v1/secret/{id}/drop": secrets.NoFields,
        "/v1/secrets/local_env": secrets.LocalEnv,
    }
    posts = {path for path, ops in document["paths"].items() if "post" in ops}
    assert posts == set(bodies), f"describe the body of every POST route here: {sorted(posts ^ set(bodies))}"
    components = document.setdefault("components", {}).setdefault("schemas", {})
    for path, model in bodies.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        if path in ("/v1/jobs/wait", "/v1/batches/wait"):
            schema["properties"]["timeout_s"]["maximum"] = 0.2  # no long polls in a fuzz run
        document["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    document["components"]["securitySchemes"] = {"apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}
    document["security"] = [{"apiKey": []}]
    del document["paths"]["/v1/jobs/events"]  # an endless stream; its errors are tested in test_server_*.py
    return document


def check_reply(case, response, key: str) -> None:
    where = f"{case.method} {case.path} {case.body!r}"[:400]
    assert response.status_code < 500, (where, response.status_code, response.content[:300])
    if response.status_code == 200 and "arrow" in str(response.headers.get("content-type", "")):
        return  # an Arrow IPC stream (``jobs/query_events``): binary, checked in test_lancedb_dialect.py
    assert "Traceback" not in response.text and 'File "' not in response.text, where
    assert key not in response.text
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "request_id"}, (where, body)
        assert body["error"]["message"] and body["error"]["code"], where
        sent_id = response.headers["x-request-id"]
        assert body["error"]["request_id"] == (sent_id[0] if isinstance(sent_id, list) else sent_id), where


def aim(case, real: dict, use_real: bool):
    """Point a generated body at things that exist (so generation reaches past the 404s), and give a
    generated artifact its true digest (so it reaches past the digest check)."""
    body = case.body
    if not isinstance(body, dict):
        return case
    if use_real:
        for field, value in real.items():
            if field in body:
                body[field] = value
    artifact = body.get("artifact")
    if isinstance(artifact, dict) and isinstance(artifact.get("content"), dict):
        try:
            data = base64.b64decode(artifact["content"].get("data", ""), validate=True)
            artifact["digest"] = "sha256:" + __import__("hashlib").sha256(data).hexdigest()
        except (ValueError, TypeError):
            pass
    return case


def test_openapi_generated_requests_get_no_5xx_and_readable_errors(control_plane):
    import schemathesis
    from schemathesis import GenerationMode

    key = control_plane.api_key
    with control_plane.http() as http:  # something real to describe, run and cancel
        created = http.post("/v1/functions/create", json=registration_body("fuzzed")).json()
        version = http.post("/v1/jobs/describe", json={"job_id": created["job_id"]}).json()["result"]["version"]
        run = http.post("/v1/functions/run", json={"name": "fuzzed", "version": version, "rows": [{"x": 1}]}).json()
    real = st.fixed_dictionaries(
        {
            "name": st.just("fuzzed"),
            "version": st.just(version),
            "job_id": st.sampled_from([created["job_id"], run["job_id"]]),
        }
    )

    schema = schemathesis.openapi.from_dict(openapi_document())
    operations = [result.ok() for result in schema.get_all_operations()]
    # Destructive operations last, so the others keep finding the real version and jobs.
    operations.sort(key=lambda op: op.path in ("/v1/functions/drop", "/v1/jobs/cancel"))
    assert len(operations) >= 13
    session = __import__("requests").Session()
    checked = 0
    for operation in operations:
        # 12 + 12 per operation (41 of them, with the LanceDB dialect's routes): ~1,000 requests, each operation both ways
        for mode, examples in ((GenerationMode.POSITIVE, 12), (GenerationMode.NEGATIVE, 12)):

            @fuzz(examples)
            @given(case=operation.as_strategy(generation_mode=mode), real=real, use_real=st.booleans())
            def check(case, real, use_real):
                case = aim(case, real, use_real)
                nonlocal checked
                response = case.call(
                    base_url=control_plane.url, session=session, headers={"x-api-key": key}, timeout=30
                )
                check_reply(case, response, key)
                checked += 1

            check()
    assert checked >= 200
    # After all that, the server is healthy and still serves the real data.
    with control_plane.http() as http:
        assert http.get("/v1/health").status_code == 200
        described = http.post("/v1/functions/describe", json={"name": "fuzzed", "version": version})
        assert described.status_code in (200, 404)  # a generated drop may have hit it
        assert http.get("/v1/gpu/usage").status_code == 200


def test_raw_bytes_on_every_route_get_readable_errors(shared_control_plane):
    """Not JSON at all: random bytes, wrong content types, huge numbers, deep nesting."""
    key = shared_control_plane.api_key
    routes = [path for path, ops in openapi_document()["paths"].items() if "post" in ops]
    payloads = st.one_of(
        st.binary(max_size=64),
        st.sampled_from(
            [
                b"[" * 5000 + b"]" * 5000,
                b'{"a":' * 3000 + b"1" + b"}" * 3000,
                b"1e999999",
                b'"\\ud800"',
                b"\xef\xbb\xbf{}",
                b"{}" * 10,
            ]
        ),
        st.text(max_size=40).map(str.encode),
    )

    with httpx.Client(base_url=shared_control_plane.url, headers={"x-api-key": key}, timeout=30) as http:

        @fuzz(150)
        @given(
            path=st.sampled_from(routes),
            payload=payloads,
            content_type=st.sampled_from(["application/json", "text/plain", "", "application/x-www-form-urlencoded"]),
        )
        def check(path, payload, content_type):
            headers = {"content-type": content_type} if content_type else {}
            reply = http.post(path, content=payload, headers=headers)
            assert reply.status_code < 500, (path, payload[:80], reply.text[:200])
            if reply.status_code >= 400:
                error = reply.json()["error"]
                assert error["message"] and error["request_id"] == reply.headers["x-request-id"]
                assert error["code"] != "request_failed", (path, payload[:80], error)

        check()


# Invalid UTF-8 inside an otherwise valid JSON body: UTF-8-encoded surrogates (ED A0 80 … ED BF BF),
# stray continuation bytes, overlong forms, truncated sequences.
BAD_UTF8 = st.one_of(
    st.integers(0xA0, 0xBF).flatmap(lambda b: st.integers(0x80, 0xBF).map(lambda c: bytes([0xED, b, c]))),
    st.sampled_from([b"\x80", b"\xff", b"\xc0\xaf", b"\xe2\x82", b"\xf4\x90\x80\x80", b"\xfe\xfe"]),
    st.binary(min_size=1, max_size=8).filter(lambda b: not _is_utf8(b)),
)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_invalid_utf8_inside_json_on_every_route_is_a_400_naming_utf8(shared_control_plane):
    routes = [path for path, ops in openapi_document()["paths"].items() if "post" in ops]
    fields = ["name", "version", "job_id", "page_token", "state"]

    with shared_control_plane.http(timeout=30) as http:

        @fuzz(150)
        @given(
            path=st.sampled_from(routes),
            bad=BAD_UTF8,
            field=st.sampled_from(fields),
            prefix=st.text(alphabet="ab1", max_size=3),
        )
        def check(path, bad, field, prefix):
            body = b'{"%s": "%s%s", "rows": [{"x": "%s"}], "timeout_s": 0}' % (
                field.encode(),
                prefix.encode(),
                bad,
                bad,
            )
            reply = http.post(path, content=body, headers={"content-type": "application/json"})
            assert reply.status_code == 400, (path, body, reply.text[:300])
            error = reply.json()["error"]
            assert error["code"] == "invalid_request" and "UTF-8" in error["message"], (path, body, error)

        check()
    assert "Traceback" not in shared_control_plane.log_text()


# Header values a browser or script may send: any visible byte, Latin-1 and UTF-8 included.
HEADER_VALUES = st.lists(st.sampled_from([*range(0x21, 0x7F), *range(0x80, 0x100), 0x20]), min_size=1, max_size=40).map(
    lambda codes: bytes(codes).strip()
)


@pytest.fixture(scope="module")
def jupyter_proxy(shared_control_plane, tmp_path_factory):
    from browser_util import running_jupyter

    env = {"LANCEFN_URL": shared_control_plane.url, "LANCEFN_API_KEY": shared_control_plane.api_key}
    with running_jupyter(tmp_path_factory.mktemp("fuzz-jupyter"), app="server", env=env) as server:
        yield server


def test_jupyter_proxy_headers_get_no_5xx(jupyter_proxy):
    auth = jupyter_proxy.auth_headers()
    urls = [
        jupyter_proxy.url("lancefn/status"),
        jupyter_proxy.url("lancefn/api/v1/health"),
        jupyter_proxy.url("lancefn/api/v1/gpu/usage"),
    ]
    events = jupyter_proxy.url("lancefn/api/v1/jobs/events")

    with httpx.Client(timeout=30) as http:

        @fuzz(120)
        @given(
            url=st.sampled_from([*urls, events]),
            header=st.sampled_from(["x-request-id", "last-event-id"]),
            value=HEADER_VALUES,
        )
        def check(url, header, value):
            if not value:
                return
            with http.stream("GET", url, headers={**auth, header: value}) as reply:
                assert reply.status_code < 500, (url, header, value, reply.status_code)
                if reply.status_code >= 400:
                    reply.read()
                    error = reply.json()["error"]
                    assert error["message"] and error["request_id"].isascii(), (url, header, value, error)
                    ascii_id = header == "x-request-id" and value.isascii()
                    assert not ascii_id or len(value) > 200 or b" " in value, (url, header, value, error)

        check()
