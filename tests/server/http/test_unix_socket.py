"""The server's Unix socket for clients on its machine (docs/ARCHITECTURE.md, "Local clients"): private to the
server's user, the same API and keys as the TCP port, gone with the server; a client uses it while it can reach it
and the port otherwise."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
from conftest import register, registration_body


def _over(path: str | Path, key: str | None = None) -> httpx.Client:
    """httpx on the Unix socket alone (its URL names no reachable port)."""
    headers = {"x-api-key": key} if key else {}
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://lancefn", headers=headers)


def test_the_unix_socket_is_private_needs_the_key_and_goes_with_the_server(control_plane_factory):
    cp = control_plane_factory()
    path = Path(cp.info()["unix_socket"])
    assert path == cp.home / "server.sock"
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    with _over(path) as anonymous:
        assert anonymous.get("/v1/health").json()["status"] == "ok"  # the one route without a key
        refused = anonymous.post("/v1/jobs/list", json={})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    with _over(path, "not-a-key") as wrong:
        assert wrong.post("/v1/jobs/list", json={}).status_code == 401
    with _over(path, cp.api_key) as http:
        version = register(http, registration_body("double"))["version"]

    from lancefn_jupyter.kernel.client import Client

    # Port 1: nothing listens there, so this client's requests can only have gone over the socket.
    client = Client("http://127.0.0.1:1", cp.api_key, unix_socket=str(path))
    try:
        job = client.functions.run_job("double", version, [{"x": 21}], wait_s=30.0)
        assert (job.job_state.value, job.result) == ("DONE", [42])
    finally:
        client.close()

    cp.kill()  # no clean-up: the socket file stays behind, and the next server replaces it
    assert path.exists()
    cp.start()
    with _over(path, cp.api_key) as http:
        jobs = http.post("/v1/jobs/list", json={}).json()["jobs"]
        assert sorted((job["job_type"], job["job_state"]) for job in jobs) == [
            ("create_function", "DONE"),
            ("run_function", "DONE"),
        ]
    cp.stop()
    assert not path.exists() and not cp.server_json.exists()


def test_without_the_socket_clients_use_the_port(control_plane_factory, tmp_path):
    off = control_plane_factory(args=["--unix-socket", "off"])
    assert "unix_socket" not in off.info() and not (off.home / "server.sock").exists()
    too_long = control_plane_factory(args=["--unix-socket", str(tmp_path / ("s" * 120))])
    assert "unix_socket" not in too_long.info()
    assert "longer than a socket path may be" in too_long.log_text()

    from lancefn_jupyter.kernel.client import Client

    for cp in (off, too_long):
        with cp.http() as http:
            version = register(http, registration_body("double"))["version"]
        # A socket that is not there (the server's is off, or moved): the client goes to the URL's port.
        client = Client(cp.url, cp.api_key, unix_socket=str(tmp_path / "no-such.sock"))
        try:
            assert client.functions.run_job("double", version, [{"x": 2}], wait_s=30.0).result == [4]
        finally:
            client.close()


def test_the_embedded_server_is_reached_on_its_socket(tmp_path, monkeypatch):
    from lancefn_jupyter.embedded import read_server_info, stop_server
    from lancefn_jupyter.kernel import session

    monkeypatch.setenv("LANCEFN_DISABLE_NVML", "1")
    home = tmp_path / "home"
    client = session.use_local(str(home))
    try:
        info = read_server_info(home)
        assert info is not None and info.unix_socket == str(home / "server.sock")
        assert client.health()["status"] == "ok"
        # Still set after a request: the socket was reached (a pool that could not reach it drops it for the port).
        assert client._transport._pool._unix_socket == info.unix_socket
    finally:
        session.stop_local(str(home))
        stop_server(home)


def test_a_socket_another_server_listens_on_is_left_alone(control_plane_factory):
    first = control_plane_factory()
    path = first.info()["unix_socket"]
    second = control_plane_factory(args=["--unix-socket", path])  # another home, told to use the first's socket
    assert "unix_socket" not in second.info()
    assert "another process listens on it" in second.log_text()
    with _over(path, first.api_key) as http:  # still the first server's
        assert http.post("/v1/jobs/list", json={}).status_code == 200
    second.stop()
    assert Path(path).exists()
