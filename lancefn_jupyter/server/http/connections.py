"""uvicorn's HTTP/1.1 protocol on ``httptools`` (a C parser) with a deadline and a size limit for
a request's line and headers, and a reply's head and body sent together.

Why httptools rather than uvicorn's pure-Python h11 protocol: parsing the request and writing the
reply took about 40 % of the event loop's time per small request (docs/ARCHITECTURE.md, "REST
details").  uvicorn bounds idle keep-alive connections but not one that trickles its headers (or
sends nothing at all), so a handful of slow clients could hold the ``--limit-concurrency`` slots
for ever; and httptools, unlike h11, does not bound the size of the headers.  Both limits are
here.  The body has its own deadline (``--body-timeout-s``, in ``guard.Guard``).

Connections before their first request head is in (nothing authenticated yet) are not counted against
``--limit-concurrency``, which counts connections that sent a request and requests in progress; each client
address instead has a share of such connections (``pending_share``), and a new one past it closes that address's
oldest pending one.  So 300 half-sent unauthenticated requests cannot answer every team 503, and a slow client
on the same address as a quick one (loopback) only pushes out its own stale connections (docs/ARCHITECTURE.md,
"REST details").
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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
    """How many connections one client address may hold before its first request head is in."""
    return max(8, (limit_concurrency or 256) // 8)


def header_timeout_protocol(header_timeout_s: float, limit_concurrency: int | None = None) -> type[HttpToolsProtocol]:
    """The protocol class for one server: it holds that server's pending and served connections."""
    share = pending_share(limit_concurrency)
    pending: dict[Any, OrderedDict[Any, None]] = {}  # client address -> its connections with no head yet, oldest first
    served: set[Any] = set()  # connections that sent at least one request head

    class _HeaderTimeoutProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes received since the last request ended, while its head is incomplete
        _head_done = False
        _head_too_large = False
        _peer: Any = None
        _sender: _OneSendTransport | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.limit_concurrency = None  # checked in on_headers_complete, without the pending connections

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._sender = _OneSendTransport(transport, self.loop)
            self.transport = self._sender  # type: ignore[assignment]  # what replies use
            peer = transport.get_extra_info("peername")
            self._peer = peer[0] if isinstance(peer, tuple) and peer else peer
            mine = pending.setdefault(self._peer, OrderedDict())
            mine[self] = None
            if len(mine) > share:  # past this address's share: its oldest pending connection goes
                oldest = next(iter(mine))
                del mine[oldest]
                oldest.transport.close()
            self._first_head()

        def on_response_complete(self) -> None:
            if self._sender is not None:  # the whole reply is written: it goes out now, not a loop step later
                self._sender.flush()
            super().on_response_complete()
            # The next request on this connection gets the same deadline, from its first byte (``data_received``):
            # until then uvicorn's keep-alive timeout bounds the idle connection.
            self._head_done, self._head_bytes = False, 0

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
            if self not in served:
                self._leave_pending()
                served.add(self)
            # uvicorn's own check, counting what sent a request (not pending connections): 0 makes it answer 503.
            if limit_concurrency is not None and (
                len(served) >= limit_concurrency or len(self.tasks) >= limit_concurrency
            ):
                self.limit_concurrency = 0
            else:
                self.limit_concurrency = None
            self._head_done = True
            if self._header_timer is not None:
                self._header_timer.cancel()  # the request line and headers are in
                self._header_timer = None
            # A head that arrived whole in one read (with its body, or other requests) is measured here.
            if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > MAX_HEAD_BYTES:
                self._head_too_large = True
                raise _HeadTooLarge
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            super().send_400_response(_TOO_LARGE if self._head_too_large else msg)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._leave_pending()
            served.discard(self)
            super().connection_lost(exc)

        def _leave_pending(self) -> None:
            mine = pending.get(self._peer)
            if mine is not None:
                mine.pop(self, None)
                if not mine:
                    del pending[self._peer]

        def _first_head(self) -> None:
            """A new connection's first head has ``header_timeout_s`` from the connection (one that sends nothing)."""
            self._head_done, self._head_bytes = False, 0
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete  # no request being answered
            if idle and not self._head_done and not self.transport.is_closing():
                self.transport.close()

    return _HeaderTimeoutProtocol
