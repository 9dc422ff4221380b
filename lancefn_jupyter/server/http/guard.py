"""The guard: the outermost ASGI middleware of the control plane's app (docs/ARCHITECTURE.md,
"REST details").  Runs in the control plane's server process, on the event loop.

Nothing a client sends may stall the server for others: the guard refuses a write without a
known ``x-api-key`` *before* reading its body, bounds the body's size and the time to send it,
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
from lancefn_jupyter.server.http.errors import envelope, last_resort
from lancefn_jupyter.server.http.fastpath import FastPath

# A maximum-size artifact (base64: 4/3 of its bytes) plus rows; --max-body-bytes raises it.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0  # --body-timeout-s: the whole body must arrive within this
UNAUTHENTICATED_PATHS = frozenset({"/v1/health"})
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces


class Guard:
    """Request id, key-before-body, body-size and body-time limits, and last-resort error
    handling (pure ASGI for speed); it also serves the direct routes (``fastpath.FastPath``).
    The routes still check the key's privileges."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keys: KeyRing | None = None,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        fastpath: FastPath | None = None,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = keys or KeyRing({})
        self.body_timeout_s = body_timeout_s
        self.fastpath = fastpath  # its direct routes are served here

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

        writes = scope.get("method") in ("POST", "PUT", "PATCH")
        if (
            writes
            and scope.get("path") not in UNAUTHENTICATED_PATHS
            and self.keys.principal(headers.get(b"x-api-key")) is None
        ):
            await reply(401, "unauthorized", MISSING_KEY_MESSAGE, close=True)
            return
        inner_receive = receive
        # Arrow rows bodies are streamed to disk by their route (own size limit), never buffered here.
        if writes and not is_arrow(headers.get(b"content-type")):
            body = await self._read_body(headers, receive)
            if isinstance(body, tuple):
                await reply(*body, close=True)
            if not isinstance(body, bytes):
                return
            fastpath = self.fastpath
            direct = fastpath.route(scope["method"], scope["path"]) if fastpath is not None else None
            if fastpath is not None and direct is not None:
                await fastpath.serve(direct, scope, headers, body, reply, send_with_id)
                return
            inner_receive = _replay(body, receive)
        try:
            await self.app(scope, inner_receive, send_with_id)
        except Exception as error:
            failure = last_resort(scope, request_id, error)
            if not started:
                await reply(*failure)

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
