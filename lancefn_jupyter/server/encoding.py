"""Text as the control plane stores and sends it: compact JSON (stored rows, specs, events) and
text made storable.  Runs in the control plane; pure, so the store, the batches and the control
parts share one encoding."""

from __future__ import annotations

import json
from typing import Any


def dumps(value: Any) -> str:
    """Compact JSON; NaN and Infinity raise (they are not JSON)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def clean_text(text: str) -> str:
    """``text`` made storable: lone surrogates (from a worker's output) become U+FFFD-ish '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
