"""Typed errors raised by the control-plane client.

Every error carries what a user needs to act on it: the HTTP status, the server's error code and
message (which says how to fix the input), and the request id to quote when reporting a problem.
"""

from __future__ import annotations

from lancefn_jupyter.wire.errors import LancefnError


class ControlPlaneUnreachable(LancefnError):
    """The control plane could not be reached (connection refused, DNS, timeout)."""

    def __init__(self, url: str, reason: str):
        self.url = url
        self.reason = reason
        super().__init__(
            f"control plane at {url} is unreachable ({reason}); check `%lancefn` for the server in use, "
            "or `%lancefn local` to start the embedded one"
        )


class LancefnEnvironmentWarning(UserWarning):
    """The control plane cannot honour a version's environment as declared (docs/ARCHITECTURE.md, "Environments"):
    its jobs will fail in phase ``environment`` with the same message. Raised (as a warning) at registration."""


class ApiError(LancefnError):
    """The control plane answered with an error envelope."""

    status: int = 0

    def __init__(self, status: int, code: str, message: str, request_id: str | None):
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        suffix = f" (request id {request_id})" if request_id else ""
        super().__init__(f"{status} {code}: {message}{suffix}")


class InvalidRequest(ApiError):
    """The input is wrong (a bad field, a limit passed); the message says what to change."""

    status = 400


class Unauthorized(ApiError):
    """No API key, or one the control plane does not know."""

    status = 401


class Forbidden(ApiError):
    """The key lacks the privilege the route needs (the message names it)."""

    status = 403


class NotFound(ApiError):
    """No such function, version, job or batch, or one of another namespace (which a key never sees)."""

    status = 404


class Conflict(ApiError):
    """The request clashes with what is there (e.g. a second unfinished backfill of one column)."""

    status = 409


class PayloadTooLarge(ApiError):
    """A body over the server's limit; the message names the limit and its flag."""

    status = 413


_BY_STATUS = {cls.status: cls for cls in (InvalidRequest, Unauthorized, Forbidden, NotFound, Conflict, PayloadTooLarge)}


def error_for_status(status: int, code: str, message: str, request_id: str | None) -> ApiError:
    return _BY_STATUS.get(status, ApiError)(status, code, message, request_id)
