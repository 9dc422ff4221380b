"""A failed job's remote frames: each artifact frame's function, line and locals as short reprs (docs/ARCHITECTURE.md,
"Debugging a failure"). Pure: the worker summarizes with it, the control plane bounds what a worker sent with it,
the kernel shows it. Never a secret, never a huge object: values are summarized, not printed."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

__all__ = [
    "FAILING_ROWS_MAX_BYTES",
    "FRAMES_MAX",
    "LOCALS_MAX",
    "NAME_MAX",
    "REDACTED",
    "REPR_MAX",
    "bounded_frames",
    "capture_frames",
    "frames_text",
    "short_repr",
]

FRAMES_MAX = 8  # the innermost frames of the artifact kept
LOCALS_MAX = 24  # locals kept per frame, in definition order
REPR_MAX = 160  # characters of one local's repr, its cut marked with "…"
NAME_MAX = 64  # characters of a function's or a local's name
FAILING_ROWS_MAX_BYTES = 64 * 1024  # JSON of the failing rows kept with a failure (jobs/describe stays small)
REDACTED = "<redacted>"
_MIN_SECRET_CHARS = 4  # as executors.base.redact_env: shorter values are flags, not secrets
# A local whose name says it holds a secret is never shown, whatever it holds.
SECRET_NAME = re.compile(r"secret|token|passw|api_?key|credential|private_?key|auth", re.IGNORECASE)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, REPR_MAX, REPR_MAX, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 8


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_repr(value: object) -> str:
    """At most ``REPR_MAX`` characters saying what ``value`` is; arrays and tensors by type, dtype and shape (their
    repr would print data), containers bounded (``reprlib``), a repr that raises as its type."""
    kind = type(value)
    shape = getattr(value, "shape", None) if not isinstance(value, type) else None
    if shape is not None and hasattr(value, "dtype"):
        try:
            return _cut(f"{kind.__module__}.{kind.__qualname__}(dtype={value.dtype}, shape={tuple(shape)})", REPR_MAX)
        except Exception:  # a shape that is no sequence: said by type below
            pass
    try:
        return _cut(_REPR.repr(value), REPR_MAX)
    except Exception:
        return f"<{kind.__qualname__} (its repr raised)>"


def _redact(text: str, secrets: Iterable[str]) -> str:
    for value in sorted({s for s in secrets if len(s) >= _MIN_SECRET_CHARS}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def _locals(f_locals: Mapping[str, object], secrets: Iterable[str]) -> dict[str, str]:
    shown: dict[str, str] = {}
    for name, value in f_locals.items():
        if len(shown) == LOCALS_MAX:
            break
        if name.startswith("__") or type(value).__name__ == "module":
            continue
        text = REDACTED if SECRET_NAME.search(name) else _redact(short_repr(value), secrets)
        shown[_cut(name, NAME_MAX)] = text
    return shown


def capture_frames(tb: TracebackType | None, filenames: Iterable[str], secrets: Iterable[str] = ()) -> list[dict]:
    """The innermost ``FRAMES_MAX`` frames of ``tb`` whose code is in one of ``filenames`` (the artifact), outermost
    first: ``{"function", "line", "locals": {name: short repr}}``; values in ``secrets`` (the function's env) are
    replaced by ``<redacted>``."""
    files, secrets = set(filenames), list(secrets)
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in files:
            frames.append(
                {
                    "function": _cut(code.co_name, NAME_MAX),
                    "line": tb.tb_lineno,
                    "locals": _locals(tb.tb_frame.f_locals, secrets),
                }
            )
        tb = tb.tb_next
    return frames[-FRAMES_MAX:]


def bounded_frames(value: Any, secrets: Iterable[str] = ()) -> list[dict] | None:
    """What a worker sent as ``frames``, within the bounds whatever it claims (the control plane's check): frames of a
    string function, a whole line and a mapping of string locals; anything else is left out. None when nothing is
    left. ``secrets`` are redacted again (the control plane knows the job's env)."""
    if not isinstance(value, list):
        return None
    secrets = list(secrets)
    kept: list[dict] = []
    for frame in reversed(value):  # the innermost valid ones
        if len(kept) == FRAMES_MAX:
            break
        if not isinstance(frame, dict):
            continue
        function, line, local = frame.get("function"), frame.get("line"), frame.get("locals")
        if not isinstance(function, str) or type(line) is not int or not isinstance(local, dict):
            continue
        shown = {
            _cut(name, NAME_MAX): _redact(_cut(text, REPR_MAX), secrets)
            for name, text in list(local.items())[:LOCALS_MAX]
            if isinstance(name, str) and isinstance(text, str)
        }
        kept.append({"function": _cut(function, NAME_MAX), "line": max(line, 0), "locals": shown})
    return kept[::-1] or None


def frames_text(frames: Iterable[Any], where: Any = None) -> str:
    """The frames as lines: ``function (line N):`` then ``    name = repr`` per local. ``where(line)`` says a line
    the user's way (the kernel: "cell line 4"); by default "line N"."""
    lines = []
    for frame in frames:
        function, line, local = (
            (frame["function"], frame["line"], frame["locals"])
            if isinstance(frame, dict)
            else (frame.function, frame.line, frame.locals)
        )
        lines.append(f"{function} ({where(line) if where is not None else f'line {line}'}):")
        lines.extend(f"    {name} = {text}" for name, text in local.items())
    return "\n".join(lines)
