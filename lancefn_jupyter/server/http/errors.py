"""The error envelope every reply shares, ``{"error": {code, message, request_id}}``, never a
stack trace (docs/ARCHITECTURE.md, "REST details"): FastAPI's exception handlers and the guard's
last resort.  Runs in the control plane's server process.

No input may produce a 5xx: anything unexpected is a 400 ``request_failed`` envelope and its
traceback goes to the server log only.  The one 5xx is not caused by input: a full disk answers
507 ``insufficient_storage`` (nothing from that request is saved; retry once space frees).
"""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.storage.store import is_storage_full

log = logging.getLogger("lancefn.server")

STORAGE_FULL_MESSAGE = (
    "the control plane's disk is full, so this request was not saved (nothing changed); "
    "free space on the filesystem of its home directory and retry"
)


def envelope(status: int, code: str, message: str, request_id: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "request_id": request_id}}, status_code=status)


def last_resort(scope: dict, request_id: str, error: Exception) -> tuple[int, str, str]:
    """Log an error no handler turned into a reply (call it in the ``except``); the envelope to send."""
    if is_storage_full(error):
        # Not a bug and not the client's fault: 507 Insufficient Storage, and no traceback spam.
        log.error("%s %s (request %s): disk full: %s", scope.get("method"), scope.get("path"), request_id, error)
        return 507, "insufficient_storage", STORAGE_FULL_MESSAGE
    log.exception("unexpected error handling %s %s (request %s)", scope.get("method"), scope.get("path"), request_id)
    return (
        400,
        "request_failed",
        f"the server could not process this request (request id {request_id}); "
        "check the request against the API reference or see the server log",
    )


def _request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


def add_error_handlers(app: FastAPI) -> None:
    """Every error FastAPI sees as the envelope."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return envelope(error.status, error.code, error.message, _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        parts = []
        for item in error.errors():
            loc = ".".join(str(p) for p in item.get("loc", ()))
            parts.append(f"{loc}: {item.get('msg', 'invalid')}")
        return envelope(400, "invalid_request", "invalid request: " + "; ".join(parts), _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if 400 <= error.status_code < 500 else 400
        code = ApiError.CODES.get(status, "invalid_request" if status != 405 else "method_not_allowed")
        message = "no such endpoint; see the API reference for /v1 routes" if status == 404 else str(error.detail)
        return envelope(status, code, message, _request_id(request))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        rid = _request_id(request)
        if is_storage_full(error):
            return envelope(507, "insufficient_storage", STORAGE_FULL_MESSAGE, rid)
        log.error("unexpected error (request %s): %s", rid, type(error).__name__)
        return envelope(
            400,
            "request_failed",
            f"the server could not process this request (request id {rid}); see the server log",
            rid,
        )
