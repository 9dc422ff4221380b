"""The error envelope every reply shares, ``{"error": {code, message, request_id}}``, never a
stack trace (docs/ARCHITECTURE.md, "REST details"): the router's and the guard's replies and the
guard's last resort.  Runs in the control plane's server process.

No input may produce a 5xx: anything unexpected is a 400 ``request_failed`` envelope and its
traceback goes to the server log only.  The one 5xx is not caused by input: a full disk answers
507 ``insufficient_storage`` (nothing from that request is saved; retry once space frees).
"""

from __future__ import annotations

import logging
import uuid

from starlette.responses import JSONResponse

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


def request_id(scope: dict) -> str:
    """The request's id, which the guard set (a made-up one if the guard was not in front)."""
    return scope.get("state", {}).get("request_id") or uuid.uuid4().hex
