"""Slow unauthenticated clients cannot starve authenticated ones: connections that have not sent a request head
do not count against --limit-concurrency, and each peer holds at most its share of them (the oldest goes first),
so 100 half-sent requests leave every team's requests answered.  What does count: tests/e2e/test_hardening.py,
``test_concurrency_is_bounded``; the other kinds of connection: test_client_caps.py."""

from __future__ import annotations

import socket

from lancefn_jupyter.server.http.connections import pending_share

LIMIT = 32
HALF_SENT = b"POST /v1/jobs/describe HTTP/1.1\r\nHost: x\r\nx-api-key: "


def _half_open(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(HALF_SENT)
        sockets.append(s)
    return sockets


def _closed_by_server(s: socket.socket, wait_s: float = 5.0) -> bool:
    s.settimeout(wait_s)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_half_sent_requests_do_not_take_the_slots_of_authenticated_ones(control_plane_factory):
    cp = control_plane_factory(args=["--limit-concurrency", str(LIMIT), "--header-timeout-s", "60"])
    port = int(cp.url.rsplit(":", 1)[1])
    share = pending_share(LIMIT)
    slow = _half_open(port, 100)  # three times the limit, from one address
    try:
        with cp.http(timeout=30.0) as http:
            codes = [http.get("/v1/gpu/usage").status_code for _ in range(20)]
        assert codes == [200] * 20
        # The address's share: its oldest pending connections were closed, its newest still wait.
        assert _closed_by_server(slow[0]) and _closed_by_server(slow[100 - share - 1])
        assert not _closed_by_server(slow[-1], wait_s=0.5)
    finally:
        for s in slow:
            s.close()
