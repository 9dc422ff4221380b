"""Page tokens and page sizes of the list requests (``functions/list``, ``jobs/list``): a token is
an opaque form of the last row's sequence number.  Runs in the control plane; pure."""

from __future__ import annotations

import base64
import binascii

from lancefn_jupyter.server.errors import ApiError

PAGE_LIMIT_MAX = 1000


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
