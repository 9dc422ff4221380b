"""Nothing idle holds resources: a server with ``--idle-exit-s`` stops once no connection is open and no job is
pending or running for that long (the embedded server: ``LANCEFN_EMBEDDED_IDLE_S``), and the kernel's next use starts
it again (docs/ARCHITECTURE.md, "Embedded server idle exit")."""

from __future__ import annotations

import time

import httpx
from helpers import wait_until

from lancefn_jupyter.embedded import ensure_server, read_server_info, stop_server


def test_a_server_stops_when_idle_but_not_while_a_client_listens(control_plane_factory):
    cp = control_plane_factory(args=["--idle-exit-s", "1"])
    with httpx.stream("GET", cp.url + "/v1/jobs/events", headers=cp.client_headers, timeout=30) as events:
        assert events.status_code == 200
        time.sleep(2.0)  # twice the idle time, with a kernel's event stream open
        assert cp.proc.poll() is None
    wait_until(lambda: cp.proc.poll() is not None, "the idle server to stop")
    assert cp.proc.returncode == 0
    assert not cp.server_json.exists()
    assert "no connection and no job; stopping (--idle-exit-s)" in cp.log_text()


def test_the_embedded_server_stops_when_idle_and_comes_back_on_next_use(tmp_path, monkeypatch):
    monkeypatch.setenv("LANCEFN_EMBEDDED_IDLE_S", "1")
    home = tmp_path / "home"
    try:
        first = ensure_server(home)
        wait_until(lambda: read_server_info(home) is None, "the idle embedded server to stop")
        again = ensure_server(home)
        assert again.pid != first.pid
        assert httpx.get(again.url + "/v1/health").json()["status"] == "ok"
    finally:
        stop_server(home)
