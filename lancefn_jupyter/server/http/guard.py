"""The guard: the outermost ASGI middleware of the control plane's app (docs/ARCHITECTURE.md,
"REST details").  Runs in the control plane's server process, on the event loop.

Nothing a client sends may stall the server for others: the guard refuses a write without a
known ``x-api-key`` *before* reading its body, bounds the body's size and the time to send it,
bounds the requests in progress per key, and the bodies being received and the event streams open per key and
per peer (``caps.Holds``),
hands buffered JSON bodies of the direct routes to the fast path (``fastpath.py``), and turns
anything unexpected into a 400 ``request_failed`` envelope (``errors.py``).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from lancefn_jupyter.server.http.auth import MISSING_KEY_MESSAGE, KeyRing
from lancefn_jupyter.server.http.bodies import is_arrow
from lancefn_jupyter.server.http.caps import ClientCaps, Holds
from lancefn_jupyter.server.http.errors import envelope, last_resort
from lancefn_jupyter.server.http.fastpath import FastPath

# A maximum-size artifact (base64: 4/3 of its bytes) plus rows; --max-body-bytes raises it.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0  # --body-timeout-s: the whole body must arrive within this
UNAUTHENTICATED_PATHS = frozenset({"/v1/health"})
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces


class Guard:
    """Request id, key-before-body, body-size and body-time limits, per-key caps on requests and per-key and
    per-peer caps on bodies and streams, and last-resort error handling (pure ASGI for speed); it also serves the direct routes
    (``fastpath.FastPath``).  The routes still check the key's privileges.  ``stream_paths``: the GET routes that
    answer with a stream held open (the event stream)."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keys: KeyRing | None = None,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        fastpath: FastPath | None = None,
        caps: ClientCaps | None = None,
        stream_paths: frozenset[str] = frozenset(),
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = keys or KeyRing({})
        self.body_timeout_s = body_timeout_s
        self.fastpath = fastpath  # its direct routes are served here
        caps = caps or ClientCaps()
        self.bodies = Holds(
            "request bodies being received",
            caps.bodies_per_key,
            "--max-bodies-per-key",
            caps.bodies_per_peer,
            "--max-bodies-per-peer",
        )
        self.streams = Holds(
            "event streams",
            caps.streams_per_key,
            "--max-streams-per-key",
            caps.streams_per_peer,
            "--max-streams-per-peer",
        )
        self.stream_paths = stream_paths
        # Every request with a known key, long polls included: one key cannot hold all of --limit-concurrency.
        self.requests = Holds("requests", caps.requests_per_key, "--max-requests-per-key")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        sent_id = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = sent_id if _REQUEST_ID.fullmatch(sent_id) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        request_id_bytes = request_id.encode("latin-1")
        started = False

        async def send_with_id(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                # Replaces one the app may have set, as MutableHeaders would, without building one per reply.
                headers = [item for item in message.get("headers", ()) if item[0].lower() != b"x-request-id"]
                message["headers"] = [*headers, (b"x-request-id", request_id_bytes)]
            await send(message)

        async def reply(status: int, code: str, message: str, *, close: bool = False) -> None:
            response = envelope(status, code, message, request_id)
            if close:  # the unread body is not drained: uvicorn closes the connection after this reply
                response.headers["connection"] = "close"
            await response(scope, receive, send_with_id)  # type: ignore[arg-type]

        method, path = scope["method"], scope["path"]
        writes = method in ("POST", "PUT", "PATCH")
        sent_key = headers.get(b"x-api-key")
        key = self.keys.principal(sent_key) if sent_key is not None else None  # None: none, or an unknown one
        if key is None and writes and path not in UNAUTHENTICATED_PATHS:
            await reply(401, "unauthorized", MISSING_KEY_MESSAGE, close=True)
            return
        peer = scope["state"].get("peer", "")  # uvicorn's protocol (connections.py) names it
        if key is not None:
            refusal = self.requests.take(key, peer)
            if refusal is not None:
                await reply(429, "too_many_requests", refusal, close=writes)
                return
        held: _Held | None = None
        try:
            inner_receive = receive
            if writes:
                refusal = self.bodies.take(key, peer)  # after the key, before a byte of the body is read
                if refusal is not None:
                    await reply(429, "too_many_requests", refusal, close=True)
                    return
                if is_arrow(headers.get(b"content-type")):
                    # Arrow rows bodies are streamed to disk by their route (own size limit), never buffered here:
                    # counted until their last part is in.
                    held = _Held(self.bodies, key, peer)
                    inner_receive = held.receiving(receive)
                else:
                    try:
                        body = await self._read_body(headers, receive)
                    finally:
                        self.bodies.give(key, peer)
                    if isinstance(body, tuple):
                        await reply(*body, close=True)
                    if not isinstance(body, bytes):
                        return
                    fastpath = self.fastpath
                    direct = fastpath.route(method, path) if fastpath is not None else None
                    if fastpath is not None and direct is not None:
                        await fastpath.serve(direct, scope, headers, body, reply, send_with_id)
                        return
                    inner_receive = _replay(body, receive)
            elif key is not None and path in self.stream_paths and method == "GET":
                refusal = self.streams.take(key, peer)
                if refusal is not None:
                    await reply(429, "too_many_requests", refusal)
                    return
                held = _Held(self.streams, key, peer)
            try:
                await self.app(scope, inner_receive, send_with_id)
            except Exception as error:
                failure = last_resort(scope, request_id, error)
                if not started:
                    await reply(*failure)
        finally:
            if held is not None:
                held.give()
            if key is not None:
                self.requests.give(key, peer)

    async def _read_body(self, headers: dict, receive: Any) -> bytes | tuple[int, str, str] | None:
        """The whole body, bounded in size and in time (so the limit also holds for chunked
        uploads); else the refusal to answer with, or None when the client went away."""
        too_large = (
            413,
            "payload_too_large",
            f"the request body is larger than the server's limit of {self.max_body_bytes} bytes; "
            "send fewer rows per job, or start lancefn-server with a larger --max-body-bytes",
        )
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body_bytes:
            return too_large
        chunks, size, more = [], 0, True
        # One deadline for the whole body; ``asyncio.timeout_at`` arms a timer on this task, where
        # ``wait_for`` would wrap every receive in a task of its own.
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while more:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                return (
                    408,
                    "request_timeout",
                    f"the request body did not arrive within {self.body_timeout_s:g}s; send it at once, "
                    "or start lancefn-server with a larger --body-timeout-s",
                )
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)


class _Held:
    """One count taken from ``holds`` for a request, given back once: at the request's end, or (``receiving``) once
    its body's last part is in."""

    def __init__(self, holds: Holds, key: Any, peer: str) -> None:
        self._holds: Holds | None = holds
        self._key, self._peer = key, peer

    def give(self) -> None:
        if self._holds is not None:
            self._holds.give(self._key, self._peer)
            self._holds = None

    def receiving(self, receive: Any) -> Callable[[], Awaitable[dict]]:
        """``receive``, giving the count back with the body's last part (or the client's disconnect)."""

        async def counted() -> dict:
            message = await receive()
            if not message.get("more_body", False):
                self.give()
            return message

        return counted


def _replay(body: bytes, receive: Any) -> Callable[[], Awaitable[dict]]:
    """An ASGI ``receive`` that gives the buffered ``body`` first, then the client's later messages."""
    replayed = False

    async def replay() -> dict:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
