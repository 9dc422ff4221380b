"""Page tokens and page sizes of the list requests (``functions/list``, ``jobs/list``): a token is
an opaque form of the last row's sequence number (``jobs/list``: one per table it reads, jobs and batches).
Runs in the control plane; pure."""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Callable, Sequence
from typing import Any

from lancefn_jupyter.server.errors import ApiError

PAGE_LIMIT_MAX = 1000


def clamp_limit(limit: int) -> int:
    return max(1, min(limit, PAGE_LIMIT_MAX))


def encode_token(seq: int) -> str:
    return _encode(str(seq))


def decode_token(token: str | None) -> int | None:
    return decode_tokens(token, 1)[0]


def encode_tokens(seqs: Sequence[int | None]) -> str:
    """One token holding a position in each of several tables (None: none of that table's rows listed yet)."""
    return _encode(",".join("" if seq is None else str(seq) for seq in seqs))


def decode_tokens(token: str | None, count: int) -> tuple[int | None, ...]:
    """``encode_tokens``' positions, ``count`` of them (a token of fewer tables: the rest from the top)."""
    if token is None or token == "":
        return (None,) * count
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        prefix, _, joined = text.partition(":")
        parts = joined.split(",")
        # SQLite integers are 64-bit: a bigger number is no token of ours (and must not reach SQLite).
        if prefix == "lancefn" and len(parts) <= count and any(parts) and all(_seq(part) for part in parts):
            seqs = tuple(int(part) if part else None for part in parts)
            return seqs + (None,) * (count - len(seqs))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    raise ApiError(
        400, "page_token is not a token this server issued; pass the page_token from the previous reply or omit it"
    )


def merge_newest(
    pages: Sequence[Sequence[tuple[int, dict[str, Any]]]],
    before: Sequence[int | None],
    limit: int,
    newness: Callable[[dict[str, Any]], int],
) -> tuple[list[dict[str, Any]], str | None]:
    """Rows of several tables' pages (each ``(seq, row)`` newest first, up to ``limit + 1`` rows) as one page of
    at most ``limit`` rows, newest (``newness``) first, and the token of the next page (None: this is the last). A
    table's position moves to its last row listed here; one with none listed keeps ``before``'s."""
    tagged = [[(newness(row), t, seq, row) for seq, row in page] for t, page in enumerate(pages)]
    merged = list(heapq.merge(*tagged, key=lambda item: item[0], reverse=True))
    kept = merged[:limit]
    positions = list(before)
    for _, t, seq, _ in kept:
        positions[t] = seq
    return [row for *_, row in kept], encode_tokens(positions) if len(merged) > limit else None


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(f"lancefn:{text}".encode()).decode().rstrip("=")


def _seq(part: str) -> bool:
    return part == "" or (part.isascii() and part.isdigit() and len(part) <= 18)
