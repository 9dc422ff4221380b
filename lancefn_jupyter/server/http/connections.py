"""uvicorn's HTTP/1.1 protocol on ``httptools`` (a C parser) with a deadline and a size limit for
a request's line and headers, and a reply's head and body sent together.

Why httptools rather than uvicorn's pure-Python h11 protocol: parsing the request and writing the
reply took about 40 % of the event loop's time per small request (docs/ARCHITECTURE.md, "REST
details").  uvicorn bounds idle keep-alive connections but not one that trickles its headers (or
sends nothing at all), so a handful of slow clients could hold the ``--limit-concurrency`` slots
for ever; and httptools, unlike h11, does not bound the size of the headers.  Both limits are
here.  The body has its own deadline (``--body-timeout-s``, in ``guard.Guard``).

Only requests in progress count against ``--limit-concurrency`` (``/v1/health`` never is refused by it), not
connections waiting for a request head: new ones that sent none yet, and kept-alive ones between requests.  Each
peer (``peers.peer_of``: its address, and on this machine the user owning its socket) instead has a share of each
kind (``caps.Waiting``): ``pending_share`` new ones, ``--max-idle-per-peer`` kept-alive ones, and its new one past a
share closes its own oldest of that kind.  So 300 half-sent unauthenticated requests, or 300 idle keep-alive
connections, cannot answer every team 503, and a slow client on the same address as a quick one (loopback) only
pushes out its own stale connections (docs/ARCHITECTURE.md, "REST details").
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lancefn_jupyter.server.http.caps import ClientCaps, Waiting
from lancefn_jupyter.server.http.errors import envelope
from lancefn_jupyter.server.http.peers import peer_of

__all__ = ["MAX_HEAD_BYTES", "header_timeout_protocol", "pending_share"]

MAX_HEAD_BYTES = 16 * 1024  # request line + headers, as uvicorn's h11 protocol allowed
_TOO_LARGE = f"the request line and headers are larger than {MAX_HEAD_BYTES} bytes; send smaller headers"


class _HeadTooLarge(Exception):
    """Raised in a parser callback: httptools reports it as a parse error, which uvicorn answers with a 400."""


class _OneSendTransport:
    """The connection's transport, sending what is written within one event-loop step in one
    ``send``: uvicorn writes a reply's head and its body separately, which made two packets and
    woke the client twice for a small JSON reply."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        """Send what was written (at the latest in the next loop step; at once when a reply is complete)."""
        data, self._pending = b"".join(self._pending), []
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()  # what was written before close still goes out, as with the transport itself
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)


def pending_share(limit_concurrency: int | None) -> int:
    """How many connections one peer may hold before their first request head is in."""
    return max(8, (limit_concurrency or 256) // 8)


def _is_health(url: bytes) -> bool:
    return url == b"/v1/health" or url.startswith(b"/v1/health?")


def _busy_message(limit: int) -> str:
    return (
        f"the server has {limit} requests in progress, its limit (--limit-concurrency); retry shortly, or start "
        "lancefn-server with a larger --limit-concurrency"
    )


def header_timeout_protocol(
    header_timeout_s: float, limit_concurrency: int | None = None, caps: ClientCaps | None = None
) -> type[HttpToolsProtocol]:
    """The protocol class for one server: it holds that server's connections waiting for a request head."""
    pending: Waiting[Any] = Waiting(pending_share(limit_concurrency))  # no request head yet
    idle: Waiting[Any] = Waiting((caps or ClientCaps()).idle_per_peer)  # kept alive between requests

    async def busy(scope: dict, receive: Any, send: Any) -> None:
        """The reply past ``--limit-concurrency`` (uvicorn's own is a bare 503 that names no limit)."""
        await envelope(503, "service_unavailable", _busy_message(limit_concurrency or 0), uuid.uuid4().hex)(
            scope, receive, send
        )

    class _HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes received since the last request ended, while its head is incomplete
        _head_done = False
        _head_too_large = False
        _peer = ""
        _sender: _OneSendTransport | None = None
        _waiting: Waiting[Any] | None = None  # pending or idle while the connection waits for a request head

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # checked in on_headers_complete: requests in progress only

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._sender = _OneSendTransport(transport, self.loop)
            self.transport = self._sender  # type: ignore[assignment]  # what replies use
            self._peer = peer_of(transport)
            self._wait_in(pending)
            self._first_head()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope["state"]["peer"] = self._peer  # the guard's per-peer caps count under it

        def on_response_complete(self) -> None:
            if self._sender is not None:  # the whole reply is written: it goes out now, not a loop step later
                self._sender.flush()
            super().on_response_complete()
            # The next request on this connection gets the same deadline, from its first byte (``data_received``):
            # until then uvicorn's keep-alive timeout bounds the idle connection.
            self._head_done, self._head_bytes = False, 0
            if self.cycle.response_complete and not self.transport.is_closing():  # kept alive, none pipelined
                self._wait_in(idle)

        def data_received(self, data: bytes) -> None:
            if not self._head_done:
                self._head_bytes += len(data)
            super().data_received(data)
            # A head that came whole in this read (most do) needs no timer; one still coming has its deadline.
            if not self._head_done and self._header_timer is None and not self.transport.is_closing():
                self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)
            # Counted before parsing, checked after: a body sent with its head in one packet is fine.
            if not self._head_done and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.send_400_response(_TOO_LARGE)

        def on_headers_complete(self) -> None:
            self._stop_waiting()
            self._head_done = True
            if self._header_timer is not None:
                self._header_timer.cancel()  # the request line and headers are in
                self._header_timer = None
            # A head that arrived whole in one read (with its body, or other requests) is measured here.
            if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > MAX_HEAD_BYTES:
                self._head_too_large = True
                raise _HeadTooLarge
            # Requests in progress (the server's tasks) against --limit-concurrency; /v1/health is never refused.
            if limit_concurrency is not None and len(self.tasks) >= limit_concurrency and not _is_health(self.url):
                app, self.app = self.app, busy
                try:
                    super().on_headers_complete()
                finally:
                    self.app = app
            else:
                super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            super().send_400_response(_TOO_LARGE if self._head_too_large else msg)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._stop_waiting()
            super().connection_lost(exc)

        def _wait_in(self, waiting: Waiting[Any]) -> None:
            """Count this connection as its peer's newest of ``waiting``'s kind; past the peer's share of that kind
            its oldest one is closed."""
            self._waiting = waiting
            pushed_out = waiting.add(self, self._peer)
            if pushed_out is not None:
                pushed_out.push_out()

        def push_out(self) -> None:
            """Close this waiting connection: its peer opened one more of its kind than its share."""
            self._waiting = None
            self.transport.close()

        def _stop_waiting(self) -> None:
            if self._waiting is not None:
                self._waiting.discard(self, self._peer)
                self._waiting = None

        def _first_head(self) -> None:
            """A new connection's first head has ``header_timeout_s`` from the connection (one that sends nothing)."""
            self._head_done, self._head_bytes = False, 0
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            answering = self.cycle is not None and not self.cycle.response_complete
            if not answering and not self._head_done and not self.transport.is_closing():
                self.transport.close()

    return _HeaderTimeoutProtocol
