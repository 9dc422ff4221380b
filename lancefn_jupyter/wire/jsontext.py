"""JSON text read quickly and exactly, in every process that reads our lines and replies (the kernel's client, the
control plane, workers, the Ray bridge): orjson where the interpreter has it (a version's built environment of
another Python may not), the standard library for what orjson would misread or refuses. Standard library only
besides orjson."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:
    orjson = None  # type: ignore[assignment]

__all__ = ["has_long_integer", "loads"]

# The text's bytes with each digit as "0", "." kept and all else a space: an integer past 64 bits, which orjson reads
# as a float, is then " " and 19 or more "0" (a float's fraction follows a "."); a third of a regex's time.
_NUMBER_SHAPE = bytes(48 if 48 <= byte <= 57 else 46 if byte == 46 else 32 for byte in range(256))
_LONG_INTEGER = b" " + b"0" * 19


def has_long_integer(data: bytes) -> bool:
    """Whether ``data`` may hold an integer of 19 digits or more (or such a run of digits in a string)."""
    return _LONG_INTEGER in (b" " + data).translate(_NUMBER_SHAPE)


def loads(data: bytes) -> Any:
    """The value of the JSON text ``data``: orjson's reading (a sixth of the standard library's time) unless the text
    holds an integer past 64 bits or what orjson refuses (a NaN literal, which the control plane then reports as not
    JSON); the standard library's then, and where there is no orjson."""
    if orjson is not None and not has_long_integer(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)
