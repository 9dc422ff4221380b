"""What every part of the control plane shares: the client-visible error, job states, compact
JSON, the clock and page tokens.  Pure; no other server module is imported here."""

from __future__ import annotations

import base64
import binascii
import json
import time
from typing import Any, ClassVar

from pydantic import ValidationError

from lancefn_jupyter.wire.models import TERMINAL_STATES, JobState

__all__ = ["ApiError", "format_validation_error"]

PENDING, IN_PROGRESS = JobState.PENDING.value, JobState.IN_PROGRESS.value
DONE, FAILED = JobState.DONE.value, JobState.FAILED.value
CANCELLED, TIMED_OUT = JobState.CANCELLED.value, JobState.TIMED_OUT.value
TERMINAL = frozenset(state.value for state in TERMINAL_STATES)
ACTIVE = (PENDING, IN_PROGRESS)
PAGE_LIMIT_MAX = 1000


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
    }

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code or self.CODES.get(status, "error")
        self.message = message


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """Readable pydantic errors naming each field; never echoes input values (they may be secrets)."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or 'body'}: {message}" if loc else message)
    return "; ".join(parts[:10]) + (f"; and {len(parts) - 10} more" if len(parts) > 10 else "")


def now_ms() -> int:
    return int(time.time() * 1000)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def clean_text(text: str) -> str:
    """``text`` made storable: lone surrogates (from a worker's output) become U+FFFD-ish '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def clamp_limit(limit: int) -> int:
    return max(1, min(limit, PAGE_LIMIT_MAX))


def encode_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"lancefn:{seq}".encode()).decode().rstrip("=")


def decode_token(token: str | None) -> int | None:
    if token is None or token == "":
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        prefix, _, seq = text.partition(":")
        # SQLite integers are 64-bit: a bigger number is no token of ours (and must not reach SQLite).
        if prefix == "lancefn" and seq.isascii() and seq.isdigit() and len(seq) <= 18:
            return int(seq)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    raise ApiError(
        400, "page_token is not a token this server issued; pass the page_token from the previous reply or omit it"
    )
