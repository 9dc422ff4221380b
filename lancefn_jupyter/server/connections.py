"""uvicorn's HTTP/1.1 protocol with a deadline for a request's line and headers.

uvicorn bounds idle keep-alive connections but not one that trickles its headers (or sends
nothing at all), so a handful of slow clients could hold the ``--limit-concurrency`` slots
for ever.  The body has its own deadline (``--body-timeout-s``, in ``app._Guard``).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["header_timeout_protocol"]


def header_timeout_protocol(header_timeout_s: float) -> type[H11Protocol]:
    class _HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()  # the next request on this connection gets the same deadline

        def handle_events(self) -> None:
            super().handle_events()
            if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
                self._header_timer.cancel()  # the request line and headers are in
                self._header_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            self._header_timer = self.loop.call_later(header_timeout_s, self._headers_too_slow)

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return _HeaderTimeoutProtocol
