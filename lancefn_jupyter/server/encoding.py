"""Text as the control plane stores and sends it: compact JSON (stored rows, specs, events) and
text made storable.  Runs in the control plane; pure, so the store, the batches and the control
parts share one encoding."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """Compact JSON of a document built from values already checked (``checked_json``): orjson, about
    twenty times the standard library's speed (a quick job writes about ten: its events, its row in the
    store, the reply); the standard library for what orjson refuses (integers over 64 bits, lone
    surrogates, keys that are not strings). orjson writes NaN as null, so check user values first."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def checked_json(value: Any) -> str:
    """Compact JSON of a user's value (rows, results) that must be JSON: NaN and Infinity raise
    ``ValueError`` (they are not JSON), what is no JSON value ``TypeError``."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def clean_text(text: str) -> str:
    """``text`` made storable: lone surrogates (from a worker's output) become U+FFFD-ish '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


#: The most of a failure's message or traceback kept (characters); the rest is noted as cut
#: (docs/ARCHITECTURE.md, "Limits").
FAILURE_TEXT_LIMIT = 64 * 1024


def cap_text(text: str, limit: int = FAILURE_TEXT_LIMIT) -> str:
    """``text`` up to ``limit`` characters, the rest replaced by a note of how much was cut."""
    if len(text) <= limit:
        return text
    cut = len(text[limit:].encode("utf-8", "replace"))
    size = f"{cut / 1e6:.1f} MB" if cut >= 100_000 else f"{cut / 1e3:.1f} kB"
    return f"{text[:limit]} … [cut {size}]"
