"""The control plane's ASGI app (docs/ARCHITECTURE.md, "REST API (v1)" and "REST details"): the
middleware and error handlers every route shares, composed with the route modules in ``routes/``.

Nothing a client sends may stall the server for others: ``_Guard`` refuses a request
without a known ``x-api-key`` *before* reading its body, bounds the body's size and the time
to send it; the routes run core work on core threads (``routes.common.off_loop``) so health
checks, SSE streams and other clients stay live.

No input may produce a 5xx and no error carries a stack trace: ``_Guard`` (outermost of
our middleware) turns anything unexpected into a 400 ``request_failed`` envelope and logs
the traceback server-side only.  The one 5xx is not caused by input: a full disk answers
507 ``insufficient_storage`` (nothing from that request is saved; retry once space frees).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from lancefn_jupyter.server.common import ApiError
from lancefn_jupyter.server.http.routes import batches, events, functions, jobs, system
from lancefn_jupyter.server.http.routes.common import MISSING_KEY_MESSAGE, DirectRoute, RouteContext, is_arrow
from lancefn_jupyter.server.plane import DEFAULT_MAX_ARTIFACT_BYTES, ControlPlane
from lancefn_jupyter.server.policy.namespaces import PRIVILEGES, ApiKeyError, Principal, load_api_keys
from lancefn_jupyter.server.storage.store import is_storage_full

__all__ = [
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "DEFAULT_MAX_BODY_BYTES",
    "PRIVILEGES",
    "ApiKeyError",
    "create_app",
    "load_api_keys",
]

log = logging.getLogger("lancefn.server")

# A maximum-size artifact (base64: 4/3 of its bytes) plus rows; --max-body-bytes raises it.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0  # --body-timeout-s: the whole body must arrive within this
UNAUTHENTICATED_PATHS = frozenset({"/v1/health"})
DEFAULT_MAX_ARROW_BODY_BYTES = 4 * 1024**3  # Arrow rows stream to a file, never into memory
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces
_STORAGE_FULL_MESSAGE = (
    "the control plane's disk is full, so this request was not saved (nothing changed); "
    "free space on the filesystem of its home directory and retry"
)


# -------------------------------------------------------------------- middleware


def _envelope(status: int, code: str, message: str, request_id: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "request_id": request_id}}, status_code=status)


def _request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


def _known_key(sent: bytes, keys: list[bytes]) -> bool:
    found = False
    for key in keys:  # every key compared: no early exit that times which one matched
        found |= hmac.compare_digest(sent, key)
    return found


class _Guard:
    """Request id, key-before-body, body-size and body-time limits, and last-resort error
    handling (pure ASGI for speed); it also serves the direct routes (``RouteContext.post_direct``).
    The routes still check the key's privileges."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        api_keys: Any = (),
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        routes: RouteContext | None = None,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = [key.encode("utf-8") for key in api_keys]
        self.body_timeout_s = body_timeout_s
        self.routes = routes  # its `direct` routes are served here (RouteContext.post_direct)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        sent_id = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = sent_id if _REQUEST_ID.fullmatch(sent_id) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)

        async def reply(status: int, code: str, message: str, *, close: bool = False) -> None:
            response = _envelope(status, code, message, request_id)
            if close:  # the unread body is not drained: uvicorn closes the connection after this reply
                response.headers["connection"] = "close"
            await response(scope, receive, send_with_id)  # type: ignore[arg-type]

        writes = scope.get("method") in ("POST", "PUT", "PATCH")
        if (
            writes
            and scope.get("path") not in UNAUTHENTICATED_PATHS
            and not _known_key(headers.get(b"x-api-key", b""), self.keys)
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
            direct = self.routes.direct.get(scope["path"]) if self.routes and scope["method"] == "POST" else None
            if direct is not None:
                await self._serve_direct(direct, scope, headers, body, reply, send_with_id)
                return
            inner_receive = _replay(body, receive)
        try:
            await self.app(scope, inner_receive, send_with_id)
        except Exception as error:
            failure = _last_resort(scope, request_id, error)
            if not started:
                await reply(*failure)

    async def _serve_direct(
        self, route: DirectRoute, scope: dict, headers: dict, body: bytes, reply: Any, send: Any
    ) -> None:
        """A direct route's reply, errors as the app's handlers would answer them."""
        assert self.routes is not None
        try:
            caller = self.routes.authorize(headers.get(b"x-api-key"), route.privilege, scope["path"])
            content = await route.handler(caller, body)
        except ApiError as error:
            await reply(error.status, error.code, error.message)
            return
        except Exception as error:
            await reply(*_last_resort(scope, scope["state"]["request_id"], error))
            return
        await JSONResponse(content, status_code=route.status_code)(scope, _no_body, send)

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
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
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


async def _no_body() -> dict:
    return {"type": "http.request", "body": b"", "more_body": False}


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


def _last_resort(scope: dict, request_id: str, error: Exception) -> tuple[int, str, str]:
    """Log an error no handler turned into a reply (call it in the ``except``); the envelope to send."""
    if is_storage_full(error):
        # Not a bug and not the client's fault: 507 Insufficient Storage, and no traceback spam.
        log.error("%s %s (request %s): disk full: %s", scope.get("method"), scope.get("path"), request_id, error)
        return 507, "insufficient_storage", _STORAGE_FULL_MESSAGE
    log.exception("unexpected error handling %s %s (request %s)", scope.get("method"), scope.get("path"), request_id)
    return (
        400,
        "request_failed",
        f"the server could not process this request (request id {request_id}); "
        "check the request against the API reference or see the server log",
    )


# --------------------------------------------------------------------------- app


def create_app(
    core: ControlPlane,
    *,
    api_keys: dict[str, Principal],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    on_shutdown: Any = None,
    max_arrow_body_bytes: int = DEFAULT_MAX_ARROW_BODY_BYTES,
) -> FastAPI:
    """The ASGI app; ``api_keys`` maps each accepted key to its :class:`Principal`."""
    core.max_artifact_bytes = max_artifact_bytes

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        core.attach_loop(asyncio.get_running_loop())
        core.start()
        try:
            yield
        finally:
            core.begin_shutdown()
            await asyncio.get_running_loop().run_in_executor(None, core.shutdown)
            core.attach_loop(None)

    app = FastAPI(
        title="lancefn control plane",
        version=core.version,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # no unauthenticated routes besides /v1/health
        lifespan=lifespan,
    )
    app.state.core = core
    ctx = RouteContext(core, api_keys, body_timeout_s, max_arrow_body_bytes)
    app.add_middleware(
        _Guard, max_body_bytes=max_body_bytes, api_keys=list(api_keys), body_timeout_s=body_timeout_s, routes=ctx
    )
    _add_error_handlers(app)
    for module in (system, functions, jobs, batches, events):
        module.add_routes(app, ctx)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as the envelope ``{"error": {code, message, request_id}}``, never a stack trace."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _envelope(error.status, error.code, error.message, _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        parts = []
        for item in error.errors():
            loc = ".".join(str(p) for p in item.get("loc", ()))
            parts.append(f"{loc}: {item.get('msg', 'invalid')}")
        return _envelope(400, "invalid_request", "invalid request: " + "; ".join(parts), _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if 400 <= error.status_code < 500 else 400
        code = ApiError.CODES.get(status, "invalid_request" if status != 405 else "method_not_allowed")
        message = "no such endpoint; see the API reference for /v1 routes" if status == 404 else str(error.detail)
        return _envelope(status, code, message, _request_id(request))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        rid = _request_id(request)
        if is_storage_full(error):
            return _envelope(507, "insufficient_storage", _STORAGE_FULL_MESSAGE, rid)
        log.error("unexpected error (request %s): %s", rid, type(error).__name__)
        return _envelope(
            400,
            "request_failed",
            f"the server could not process this request (request id {rid}); see the server log",
            rid,
        )
