"""Hostile but plausible input against a real control plane: nothing a client sends stalls the
server for others, bad input gets a readable 4xx (no traceback in the log), and a home is
trusted only when it is safe.  Also the scripts' newcomer paths (quickstart --headless, test.sh).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import SERVER_CMD, make_env, register, registration_body
from helpers import http_head, raw_socket, read_reply, read_response

from lancefn_jupyter.embedded import ensure_server, read_server_info, stop_server

REPO = Path(__file__).resolve().parents[2]


def assert_4xx(reply: httpx.Response, status: int, *words: str) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["code"] != "request_failed", error
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error


# ------------------------------------------------------------------ the loop stays live


def test_artifact_over_the_cap_is_413_naming_the_flag(control_plane_factory):
    cp = control_plane_factory(args=["--max-artifact-bytes", "3000"])
    source = "# " + "x" * 4000 + "\n\ndef double(x: int) -> int:\n    return 2 * x\n"
    with cp.http() as http:
        assert_4xx(
            http.post("/v1/functions/create", json=registration_body(source=source)),
            413,
            "--max-artifact-bytes",
            "3000",
        )
        register(http, registration_body())  # a small one still registers


def test_default_artifact_cap_is_a_few_mib(control_plane):
    source = "# " + "x" * (5 << 20) + "\n\ndef double(x: int) -> int:\n    return 2 * x\n"
    with control_plane.http() as http:
        assert_4xx(
            http.post("/v1/functions/create", json=registration_body(source=source)), 413, "--max-artifact-bytes"
        )


def test_health_answers_while_a_large_artifact_is_parsed(control_plane):
    # ~3.5 MiB of list literal: seconds of ast.parse holding the GIL; the server parses it elsewhere.
    source = "def double(x: int) -> int:\n    return 2 * x\n\nX = [" + "0," * (1800 << 10) + "0]\n"
    replies: dict = {}

    def register_big() -> None:
        with control_plane.http(timeout=120) as http:
            replies["create"] = http.post("/v1/functions/create", json=registration_body(source=source))

    worker = threading.Thread(target=register_big)
    worker.start()
    answered = 0
    with httpx.Client(base_url=control_plane.url, timeout=60) as http:
        while worker.is_alive():
            assert http.get("/v1/health").status_code == 200
            answered += 1
    worker.join()
    assert replies["create"].status_code == 202, replies["create"].text
    # While the registration was in flight the loop kept answering (old code: none during the parse).
    assert answered >= 50, answered
    with control_plane.http() as http:
        job = http.post("/v1/jobs/describe", json={"job_id": replies["create"].json()["job_id"]}).json()
    assert job["job_state"] == "DONE", job


def test_large_artifacts_are_still_checked(control_plane):
    filler = "# " + "y" * (64 << 10) + "\n"
    with control_plane.http() as http:
        assert_4xx(
            http.post("/v1/functions/create", json=registration_body(source=filler + "def double(x:\n")),
            400,
            "not valid Python",
        )
        assert_4xx(
            http.post(
                "/v1/functions/create",
                json=registration_body(source=filler + "def other(x: int) -> int:\n    return x\n"),
            ),
            400,
            "'double' is not defined",
        )
        register(http, registration_body(source=filler + "def double(x: int) -> int:\n    return 2 * x\n"))


def test_deeply_nested_unary_operators_are_a_400_not_a_parser_crash(control_plane):
    with control_plane.http() as http:
        for depth in (3_000, 10_000, 100_000):  # RecursionError, MemoryError in-process; the child parses the last
            source = f"X = {'-' * depth}1\n\n\ndef double(x: int) -> int:\n    return 2 * x\n"
            error = assert_4xx(http.post("/v1/functions/create", json=registration_body(source=source)), 400, "nested")
            assert error["code"] == "invalid_request", error
    log = control_plane.log_text()
    assert "MemoryError" not in log and "RecursionError" not in log and "Traceback" not in log, log[-2000:]


def test_the_key_is_checked_before_the_body_is_read(control_plane):
    sock = raw_socket(control_plane.url)
    with sock:
        # Announce 50 MB and send none of it: the 401 must come without waiting for the body.
        sock.sendall(
            b"POST /v1/functions/create HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50000000\r\n\r\n{"
        )
        reply = read_reply(sock)  # old code: waits for the body until the socket timeout
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401"), head
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "unauthorized"
    # A wrong key is no better than none.
    with httpx.Client(base_url=control_plane.url, headers={"x-api-key": "wrong-key-123"}) as http:
        assert_4xx(http.post("/v1/jobs/list", json={}), 401, "x-api-key")


def test_a_body_that_trickles_is_cut_off_with_408(control_plane_factory):
    cp = control_plane_factory(args=["--body-timeout-s", "1"])
    sock = raw_socket(cp.url)
    with sock:
        sock.sendall(
            b"POST /v1/jobs/list HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n"
            + f"x-api-key: {cp.api_key}\r\n\r\n".encode()
            + b"{"
        )
        reply = read_reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert "--body-timeout-s" in json.loads(body)["error"]["message"]


def test_headers_that_trickle_are_cut_off(control_plane_factory):
    cp = control_plane_factory(args=["--header-timeout-s", "1"])
    sock = raw_socket(cp.url)
    with sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        assert read_reply(sock) == b""  # closed by the server (old code: the socket timeout)
    with httpx.Client(base_url=cp.url) as http:
        assert http.get("/v1/health").status_code == 200


def test_a_second_head_that_trickles_on_a_kept_alive_connection_is_cut_off_too(control_plane_factory):
    """The deadline runs from a head's first byte; uvicorn's keep-alive timeout stops counting once a byte came."""
    cp = control_plane_factory(args=["--header-timeout-s", "1"])
    sock = raw_socket(cp.url)
    with sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        assert read_reply(sock) == b""  # closed by the server, not by the 20 s socket timeout


def test_oversized_headers_get_400_and_a_closed_connection_but_a_big_body_is_fine(control_plane):
    from lancefn_jupyter.server.http.connections import MAX_HEAD_BYTES

    head = f"POST /v1/jobs/list HTTP/1.1\r\nhost: x\r\nx-api-key: {control_plane.api_key}\r\n"
    with raw_socket(control_plane.url) as sock:
        sock.sendall(head.encode() + b"x-pad: " + b"a" * MAX_HEAD_BYTES + b"\r\n")  # no end of headers yet
        reply = read_reply(sock)  # the server closes the connection
    assert reply.startswith(b"HTTP/1.1 400") and b"larger than 16384 bytes" in reply, reply[:300]
    # Head and a body far bigger than the head limit in one packet: only the head counts.
    body = json.dumps({"name": "x" * (4 * MAX_HEAD_BYTES)}).encode()
    request = head + f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    with raw_socket(control_plane.url) as sock:
        sock.sendall(request.encode() + body)
        status = sock.recv(65536).split(b"\r\n", 1)[0]
    assert status == b"HTTP/1.1 200 OK", status
    with control_plane.http() as http:  # the hot routes the guard serves itself still refuse other methods
        for path in ("/v1/functions/run", "/v1/jobs/wait"):
            reply = http.get(path)
            assert reply.status_code == 405 and reply.json()["error"]["code"] == "method_not_allowed", reply.text


def test_an_oversized_head_sent_in_one_write_is_refused_too(control_plane):
    from lancefn_jupyter.server.http.connections import MAX_HEAD_BYTES

    for size in (MAX_HEAD_BYTES + 1024, 40_000, 60_000):
        head = f"GET /v1/health HTTP/1.1\r\nhost: x\r\nx-pad: {'a' * size}\r\n\r\n".encode()
        with raw_socket(control_plane.url) as sock:
            sock.sendall(head)  # the whole head at once, end of headers included
            reply = read_reply(sock)  # the server closes the connection
        assert reply.startswith(b"HTTP/1.1 400") and b"larger than 16384 bytes" in reply, (size, reply[:300])
    with httpx.Client(base_url=control_plane.url) as http:
        assert http.get("/v1/health", headers={"x-pad": "a" * (MAX_HEAD_BYTES - 1024)}).status_code == 200
    assert "Traceback" not in control_plane.log_text()


def test_concurrency_is_bounded(control_plane_factory):
    """Requests in progress hold --limit-concurrency's slots; connections waiting for a request head (new ones, and
    kept-alive ones between requests) do not (each peer has a share of those instead:
    tests/server/http/test_pending_share.py, test_client_caps.py), and /v1/health is never refused."""
    cp = control_plane_factory(args=["--limit-concurrency", "3", "--header-timeout-s", "60"])
    silent = [raw_socket(cp.url) for _ in range(3)]
    kept_alive, streams = [], []
    try:
        for _ in range(5):  # connections that sent a request and were answered: idle now, no slot held
            sock = raw_socket(cp.url, http_head("GET", "/v1/health"))
            assert read_response(sock)[0] == 200
            kept_alive.append(sock)
        with httpx.Client(base_url=cp.url, headers={"x-api-key": cp.api_key}) as http:
            assert http.post("/v1/jobs/list", json={}).status_code == 200
            for _ in range(3):  # requests in progress: event streams held open fill the three slots
                streams.append(raw_socket(cp.url, http_head("GET", "/v1/jobs/events", cp.api_key)))
                assert read_response(streams[-1])[0] == 200
            assert_4xx(http.post("/v1/jobs/list", json={}), 503, "--limit-concurrency")
            assert http.get("/v1/health").status_code == 200  # never refused
    finally:
        for sock in silent + kept_alive + streams:
            sock.close()


# ------------------------------------------------------------ readable 4xx, clean log


def test_page_tokens_beyond_64_bits_are_invalid_tokens(control_plane):
    for number in (2**63, 10**30):
        token = base64.urlsafe_b64encode(f"lancefn:{number}".encode()).decode().rstrip("=")
        with control_plane.http() as http:
            for route in ("/v1/jobs/list", "/v1/functions/list"):
                assert_4xx(http.post(route, json={"page_token": token}), 400, "page_token is not a token")
    log = control_plane.log_text()
    assert "OverflowError" not in log and "Traceback" not in log, log[-2000:]


SURROGATE = b"\xed\xa0\x80"
# One body per route, ``~`` standing for a raw surrogate (UTF-8-encoded, so not valid UTF-8).
SURROGATE_BODIES = {
    "/v1/jobs/describe": '{"job_id": "a~"}',
    "/v1/jobs/logs": '{"job_id": "a~"}',
    "/v1/jobs/wait": '{"job_id": "a~", "timeout_s": 0}',
    "/v1/jobs/cancel": '{"job_id": "a~"}',
    "/v1/jobs/list": '{"name": "a~"}',
    "/v1/functions/describe": '{"name": "a~", "version": "1"}',
    "/v1/functions/list": '{"name": "a~"}',
    "/v1/functions/drop": '{"name": "a~", "version": "1"}',
    "/v1/functions/artifact": '{"name": "a~", "version": "1"}',
    "/v1/functions/history": '{"name": "a~"}',
    "/v1/functions/diff": '{"name": "a~", "old": "1", "new": "2"}',
    "/v1/functions/create": '{"name": "a~"}',
    "/v1/functions/run": '{"name": "double", "version": "1", "rows": [{"x": "~"}]}',
}


@pytest.mark.parametrize(
    "route, body", [(route, body.encode().replace(b"~", SURROGATE)) for route, body in SURROGATE_BODIES.items()]
)
def test_raw_surrogates_in_a_body_are_a_400_naming_utf8(shared_control_plane, route, body):
    with shared_control_plane.http() as http:
        error = assert_4xx(http.post(route, content=body, headers={"content-type": "application/json"}), 400, "UTF-8")
    assert "NaN" not in error["message"]
    log = shared_control_plane.log_text()
    assert "UnicodeEncodeError" not in log and "Traceback" not in log, log[-2000:]


# --------------------------------------------------------------- home and processes


def start_server(home: Path, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run lancefn-server on ``home`` expecting it to refuse; a server that starts is stopped and fails the test."""
    proc = subprocess.Popen(
        [*SERVER_CMD, "--home", str(home), "--port", "0", *args],
        env=make_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate()
        pytest.fail(f"the server started on an unsafe home: {out}{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_home_others_can_write_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    done = start_server(home)
    assert done.returncode == 1
    assert f"chmod 700 {home}" in done.stderr, done.stderr
    assert not (home / "server.json").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the home to another user")
def test_a_home_owned_by_someone_else_is_refused(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    os.chown(home, 65534, 65534)
    done = start_server(home)
    assert done.returncode == 1 and "not by you" in done.stderr, done.stderr


def test_a_planted_api_key_is_not_trusted(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "api_key").write_text("planted-by-someone-else\n")
    (home / "api_key").chmod(0o666)
    done = start_server(home)
    assert done.returncode == 1
    assert "api_key" in done.stderr and "chmod 600" in done.stderr, done.stderr


KEYS_FILE = '[[api_keys]]\nname = "ann"\nkey = "ann-key-00000001"\nprivileges = ["jobs"]\n'


def test_an_api_key_file_others_can_read_is_refused(tmp_path, control_plane_factory):
    home, keys = tmp_path / "home", tmp_path / "keys.toml"
    home.mkdir(mode=0o700)
    keys.write_text(KEYS_FILE)
    for mode in (0o644, 0o660, 0o606):
        keys.chmod(mode)
        done = start_server(home, "--api-keys", str(keys))
        assert done.returncode == 2, done.stderr
        assert f"chmod 600 {keys}" in done.stderr and "Traceback" not in done.stderr, done.stderr
    keys.chmod(0o600)
    cp = control_plane_factory(args=["--api-keys", str(keys)])
    with httpx.Client(base_url=cp.url, headers={"x-api-key": "ann-key-00000001"}) as http:
        assert http.post("/v1/jobs/list", json={}).status_code == 200


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give the file to another user")
def test_an_api_key_file_owned_by_someone_else_is_refused(tmp_path):
    home, keys = tmp_path / "home", tmp_path / "keys.toml"
    home.mkdir(mode=0o700)
    keys.write_text(KEYS_FILE)
    keys.chmod(0o600)
    os.chown(keys, 65534, 65534)
    done = start_server(home, "--api-keys", str(keys))
    assert done.returncode == 2 and "owned by uid 65534" in done.stderr and f"chmod 600 {keys}" in done.stderr


def test_a_symlink_planted_at_the_lock_is_not_followed(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    target = tmp_path / "precious"
    target.write_text("keep me")
    (home / "server.lock").symlink_to(target)
    done = start_server(home)
    assert done.returncode == 1 and "server.lock" in done.stderr, done.stderr
    assert target.read_text() == "keep me"


def test_private_files_are_0600(tmp_path):
    home = tmp_path / "home"
    info = ensure_server(home)
    try:
        for name in ("server.json", "api_key", "server.lock", "server.log"):
            mode = stat.S_IMODE(os.stat(home / name).st_mode)
            assert mode == 0o600, (name, oct(mode))
        assert not list(home.glob(".*.tmp"))
    finally:
        stop_server(home)
    assert info.pid


def test_stop_never_signals_a_pid_that_is_not_this_homes_server(tmp_path):
    home = tmp_path / "home"
    info = ensure_server(home)
    stop_server(home)
    # A stale server.json whose pid now belongs to an unrelated process.
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        data = {"url": info.url, "api_key": "k" * 20, "pid": bystander.pid, "home": str(home)}
        (home / "server.json").write_text(json.dumps(data))
        assert read_server_info(home).pid == bystander.pid
        assert stop_server(home, timeout=2) is False
        time.sleep(0.2)
        assert bystander.poll() is None, "stop_server killed an unrelated process"
    finally:
        bystander.kill()
        bystander.wait()


def test_stop_still_stops_the_real_server(tmp_path):
    home = tmp_path / "home"
    info = ensure_server(home)
    assert stop_server(home) is True
    for _ in range(200):
        try:
            os.kill(info.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the server is still running")


# ---------------------------------------------------------------------------- scripts


def fake_tree(tmp_path: Path, script: str, python_body: str) -> Path:
    """A copy of ``scripts/<script>`` (and ``install_venv.sh``) in a tree whose ``.venv/bin/python`` is ``python_body`` (bash)
    and whose ``.venv/bin/lint-imports`` passes."""
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    for name in (script, "install_venv.sh"):  # the script and the venv install it sources
        shutil.copy(REPO / "scripts" / name, root / "scripts" / name)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/usr/bin/env bash\n" + python_body)
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "lint-imports").write_text("#!/bin/sh\n")  # test.sh's import contracts: pass
    (bin_dir / "lint-imports").chmod(0o755)
    (root / "fakebin").mkdir()
    (root / "fakebin" / "chromium").write_text("#!/bin/sh\n")  # test.sh installs it otherwise
    (root / "fakebin" / "chromium").chmod(0o755)
    return root


def run_script(root: Path, script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**make_env(env), "PATH": f"{root / 'fakebin'}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(root / "scripts" / script), *args], env=full_env, capture_output=True, text=True, timeout=120
    )


def test_test_sh_fails_when_arguments_collect_nothing(tmp_path):
    # pytest exit 5 = "no tests collected"; everything else the fake python does succeeds.
    root = fake_tree(tmp_path, "test.sh", 'if [ "$1 $2" = "-m pytest" ]; then exit 5; fi\nexit 0\n')
    bare = run_script(root, "test.sh")
    assert bare.returncode == 0, bare.stderr
    filtered = run_script(root, "test.sh", "-k", "no_such_test")
    assert filtered.returncode == 5, filtered.stdout
    assert "no_such_test" in filtered.stderr


def test_quickstart_headless_uses_a_throwaway_home_and_stops_its_server(tmp_path):
    real = sys.executable
    record = tmp_path / "record"
    # The fake python: pip is a no-op, no GPU, and the notebook run starts a real embedded server
    # in $LANCEFN_HOME (as the quickstart's first cell does); anything else runs for real.
    root = fake_tree(
        tmp_path,
        "quickstart.sh",
        f"""case "$*" in
  "-m pip"*) exit 0 ;;
  *pynvml*) exit 1 ;;
  scripts/run_notebook.py*)
    echo "$LANCEFN_HOME" > {record}
    exec {real} -c "from lancefn_jupyter.embedded import ensure_server; print(ensure_server().pid, flush=True)" ;;
  *) exec {real} "$@" ;;
esac
""",
    )
    mine = tmp_path / "my-home"
    done = run_script(root, "quickstart.sh", "--headless", env={"LANCEFN_HOME": str(mine), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stdout + done.stderr
    used = Path(record.read_text().strip())
    assert used != mine and not mine.exists()  # not the user's home
    assert not used.exists()  # removed afterwards
    pid = int(done.stdout.strip().splitlines()[-1])
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        pytest.fail("quickstart --headless left its control plane running")


def test_quickstart_takes_a_port_and_passes_the_rest_to_jupyter_lab(tmp_path):
    """README's `scripts/quickstart.sh --port N`: JupyterLab on port N, any other argument handed on."""
    root = fake_tree(tmp_path, "quickstart.sh", 'case "$*" in\n  *pynvml*) exit 1 ;;\nesac\nexit 0\n')
    record = tmp_path / "jupyter-args"
    jupyter = root / ".venv" / "bin" / "jupyter"
    jupyter.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    jupyter.chmod(0o755)
    done = run_script(root, "quickstart.sh", "--port", "8890", "--no-browser")
    assert done.returncode == 0, done.stdout + done.stderr
    args = record.read_text().split()
    assert args[:2] == ["lab", "--ip"] and "--port=8890" in args and "--no-browser" in args
    assert args[-1] == "notebooks/01-quickstart.ipynb"
    missing = run_script(root, "quickstart.sh", "--port")
    assert missing.returncode == 2 and "--port needs a number" in missing.stderr


def test_the_kernel_side_trusts_no_server_json_in_an_unsafe_home(tmp_path, control_plane):
    from lancefn_jupyter.embedded import EmbeddedServerError

    # A server.json planted by someone else, pointing at a live server that is not ours to use.
    planted = {"url": control_plane.url, "api_key": control_plane.api_key, "pid": control_plane.proc.pid, "home": "x"}
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "server.json").write_text(json.dumps(planted))
    shared.chmod(0o777)
    with pytest.raises(EmbeddedServerError, match=f"chmod 700 {shared}"):
        ensure_server(shared)
    # In a private home, a server.json others may have written (not 0600) is not reused either.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "server.json").write_text(json.dumps(planted))
    (mine / "server.json").chmod(0o644)
    try:
        info = ensure_server(mine)
        assert info.url != control_plane.url and info.pid != control_plane.proc.pid
    finally:
        stop_server(mine)
