"""The client's HTTP transport (`client/_http.py`, standard-library `http.client`) against a real server:
keep-alive connections the server closed, an early error reply to a large body, errors mapped to the
typed exceptions, and the event stream's socket (docs/ARCHITECTURE.md, "Client and API")."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from conftest import register, registration_body
from helpers import DEADLINE_S


def _client(cp):
    from lancefn_jupyter.kernel.client import Client

    return Client(cp.url, cp.api_key)


def test_a_run_after_the_server_closed_the_idle_connection_is_sent_once_and_answered(control_plane):
    """uvicorn closes an idle keep-alive connection after 5 s; the pooled socket is dropped before use,
    so even `functions/run` (never sent twice) goes through, once."""
    with control_plane.http() as http:
        version = register(http, registration_body())["version"]
    client = _client(control_plane)
    try:
        assert client.functions.run_job("double", version, [{"x": 1}], wait_s=DEADLINE_S).result == [2]
        time.sleep(6.5)
        job = client.functions.run_job("double", version, [{"x": 2}], wait_s=DEADLINE_S)
        assert job.result == [4]
        assert len(client.jobs.list(name="double", job_type="run_function")) == 2  # neither was sent twice
    finally:
        client.close()


def test_an_oversized_body_gets_the_servers_413_not_a_connection_error(control_plane_factory):
    """The server answers 413 and closes without reading the body; the client reads that answer."""
    from lancefn_jupyter.kernel.client import PayloadTooLarge
    from lancefn_jupyter.wire.models import FunctionRegistrationRequest

    cp = control_plane_factory(args=["--max-body-bytes", "65536"])
    source = "# " + "x" * (4 << 20) + "\n\ndef double(x: int) -> int:\n    return 2 * x\n"
    request = FunctionRegistrationRequest.from_wire(registration_body(source=source))
    client = _client(cp)
    try:
        with pytest.raises(PayloadTooLarge) as raised:
            client.functions.create(request)
        assert "--max-body-bytes" in raised.value.message and raised.value.request_id
        assert client.health()["status"] == "ok"  # the pool goes on with a fresh connection
    finally:
        client.close()


def test_errors_map_to_typed_exceptions_with_the_servers_message(control_plane):
    from lancefn_jupyter.kernel.client import Client, ControlPlaneUnreachable, NotFound, Unauthorized

    client = _client(control_plane)
    try:
        with pytest.raises(NotFound) as missing:
            client.jobs.describe("no-such-job")
        assert missing.value.status == 404 and missing.value.request_id
    finally:
        client.close()
    wrong = Client(control_plane.url, "not-the-key")
    with pytest.raises(Unauthorized):
        wrong.jobs.list()
    wrong.close()
    port = control_plane.url.rsplit(":", 1)[1]
    control_plane.stop()
    gone = Client(f"http://127.0.0.1:{port}", control_plane.api_key)
    with pytest.raises(ControlPlaneUnreachable) as unreachable:
        gone.health()
    assert "ConnectionRefusedError" in unreachable.value.reason and "%lancefn local" in str(unreachable.value)


def test_the_event_stream_ends_at_once_when_its_socket_is_shut_down(control_plane):
    import socket

    client = _client(control_plane)
    stream = client.open_event_stream(read_timeout=DEADLINE_S)
    try:
        assert stream.status_code == 200 and isinstance(stream.socket, socket.socket)
        lines = stream.iter_lines()
        assert next(lines).startswith(("id:", "event:"))  # the opening usage event
        ended = threading.Event()

        def drain() -> None:
            try:
                for _ in lines:
                    pass
            except OSError:
                pass
            ended.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        time.sleep(0.2)  # blocked in a read: the server sends nothing more
        assert not ended.is_set()
        stream.socket.shutdown(socket.SHUT_RDWR)
        assert ended.wait(5.0)  # not the 15 s keepalive or the read timeout
    finally:
        stream.close()
        client.close()


def test_the_client_never_imports_httpx():
    code = (
        "import sys\n"
        "from lancefn_jupyter.kernel.client import Client\n"
        "from lancefn_jupyter.kernel.client import listener\n"
        "from lancefn_jupyter import embedded\n"
        "assert 'httpx' not in sys.modules, sorted(m for m in sys.modules if m.startswith('httpx'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _replies_from_a_raw_server(packets: list[list[bytes]]) -> list:
    """What ``_Connection.exchange`` reads from a server that answers each request with its list of packets (sent
    apart, so a head may come whole, in pieces or with its body)."""
    import socket

    from lancefn_jupyter.kernel.client._http import _Connection

    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for reply in packets:
                conn.recv(65536)
                for packet in reply:
                    conn.sendall(packet)
                    time.sleep(0.02)  # its own read on the client's side

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    connection = _Connection("127.0.0.1", listener.getsockname()[1], False, DEADLINE_S)
    try:
        return [connection.exchange("GET", "/", None, {})[0] for _ in packets]
    finally:
        connection.close()
        thread.join(DEADLINE_S)
        listener.close()


def test_reply_heads_read_whole_in_pieces_with_bare_line_feeds_or_with_no_header():
    body = b'{"a": 1}'
    whole = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Two: a\r\nx-two: b\r\n\r\n" + body
    replies = _replies_from_a_raw_server(
        [
            [whole],  # head and body in one packet: the head is taken from the buffer at once
            [whole[:20], whole[20:45], whole[45:]],  # a head that comes in pieces is read line by line
            [b"HTTP/1.1 201 Created\nContent-Length: 8\nX-Two: c\n\n" + body],  # bare line feeds
            [b"HTTP/1.1 202 Accepted\r\n\r\n", b"ignored"],  # no header: framed by the connection's end
        ]
    )
    for reply in replies[:2]:
        assert (reply.status, reply.headers["x-two"], reply.content, reply.will_close) == (200, "a, b", body, False)
    assert (replies[2].status, replies[2].headers["x-two"], replies[2].content) == (201, "c", body)
    assert (replies[3].status, dict(replies[3].headers), replies[3].content, replies[3].will_close) == (
        202,
        {},
        b"ignored",
        True,
    )
