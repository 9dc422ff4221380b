"""The client-visible error of the control plane (docs/ARCHITECTURE.md, "REST details"): every
user-facing problem is an :class:`ApiError` with a 4xx status and a message saying what is wrong
and how to fix it.  Runs in the control plane; pure (no other server module is imported here)."""

from __future__ import annotations

from typing import ClassVar

from lancefn_jupyter.wire.errors import format_validation_error

__all__ = ["ApiError", "format_validation_error"]


class ApiError(Exception):
    """A client-visible error: HTTP status, stable code, readable message.

    No input may produce a 5xx: every user-facing problem raises this with a 4xx status and a
    message saying what is wrong and how to fix it."""

    CODES: ClassVar[dict[int, str]] = {
        400: "invalid_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        409: "conflict",
        413: "payload_too_large",
        429: "too_many_requests",  # a client or key past a cap; a namespace's quota says "quota_exceeded"
    }

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code or self.CODES.get(status, "error")
        self.message = message
