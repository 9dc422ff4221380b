"""Text as the control plane stores and sends it: compact JSON (stored rows, specs, events) and
text made storable.  Runs in the control plane; pure, so the store, the batches and the control
parts share one encoding."""

from __future__ import annotations

import json
from typing import Any

import orjson

# The failure text cap is the worker protocol's (the worker caps what it sends): one rule, shared.
from lancefn_jupyter.worker.protocol import FAILURE_TEXT_LIMIT, cap_text

__all__ = ["FAILURE_TEXT_LIMIT", "cap_text", "checked_json", "clean_text", "dumps"]


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
