"""Error text at the user's lines: every reference to the packaged module becomes ``cell line N`` (pure).

The worker compiles an artifact as ``<gpu_function NAME@VERSION>``, a module the user never sees, with
``ast.unparse``'s re-formatted text. Errors name it in several forms, all rewritten here:

* Python frames and ``SyntaxError``: ``File "<gpu_function …>", line N[, in f]`` followed by the echoed
  source line (and, from 3.11, a caret line);
* numba's source locations: ``File "<gpu_function …>", line N:`` followed by a snippet of the packaged
  function (its ``def`` line, maybe ``<source elided>``, the line, a caret) up to a blank line;
* numba's ``at <gpu_function …> (N)`` (``During: typing of … at …``, lowering errors) and
  ``<gpu_function …>:N``.

Echoes and snippets of the packaged text are replaced by the user's own line as typed; a caret is kept
only when that line reads the same as the packaged one (otherwise its columns would point elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.packaging import PackagedFunction

__all__ = ["map_error_text", "map_traceback", "say_once"]

_FILE = re.compile(r'File "<gpu_function [^>]*>", line (\d+)(:?)')
_AT = re.compile(r"<gpu_function [^>]*> \((\d+)\)|<gpu_function [^>]*>:(\d+)")
_CARET = re.compile(r"^\s*[\^~]+\s*$")


def map_error_text(
    text: str,
    user_line: Callable[[int], int | None],
    cell_lines: Sequence[str],
    *,
    line_offset: int = 0,
    where: str = "cell line {}",
) -> str:
    """Rewrite ``text`` (a message or a traceback); ``user_line(artifact_line)`` gives the user's line or None."""
    if not text:
        return text or ""

    def label(artifact_line: str) -> str | None:
        line = user_line(int(artifact_line))
        return None if line is None else where.format(line + line_offset)

    def own(artifact_line: str) -> str | None:
        line = user_line(int(artifact_line))
        return cell_lines[line - 1] if line is not None and 0 < line <= len(cell_lines) else None

    def at(match: re.Match) -> str:
        mapped = label(match.group(1) or match.group(2))
        return mapped if mapped is not None else match.group(0)

    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        match = _FILE.search(line)
        mapped = label(match.group(1)) if match else None
        if match is None or mapped is None:
            out.append(_AT.sub(at, line))
            continue
        out.append(_AT.sub(at, line[: match.start()] + mapped + match.group(2) + line[match.end() :]))
        typed = own(match.group(1))
        if match.group(2):  # numba's snippet: the packaged function's lines up to a blank line
            while i < len(lines) and lines[i].strip():
                i += 1
            if typed is not None:
                out.append("    " + typed.strip())
            continue
        echoed = lines[i] if i < len(lines) and lines[i].startswith("    ") and not _CARET.match(lines[i]) else None
        if echoed is not None:
            i += 1
        if typed is None:
            if echoed is not None:
                out.append(echoed)
            continue
        out.append("    " + typed.strip())
        if i < len(lines) and _CARET.match(lines[i]):
            if echoed is not None and echoed.strip() == typed.strip():
                out.append(lines[i])
            i += 1
    return "\n".join(out)


def say_once(message: str, traceback: str) -> str:
    """The header message, shortened to the exception's name (and the worker's ``(row i of n)``) when
    the traceback already ends with the full text, so a long compiler error is shown once."""
    head, sep, body = message.partition(": ")
    if not sep or not traceback or len(message.splitlines()) < 2:
        return message
    body = re.sub(r" \(row \d+ of \d+\)$", "", body)
    if body.strip() and body.strip() in traceback:
        row = re.search(r" \(row \d+ of \d+\)$", message)
        return f"{head}{row.group(0) if row else ''} (message below)"
    return message


def _user_line(packaged: PackagedFunction, artifact_line: int) -> int | None:
    """The user's line for an artifact line; inside a multi-line statement, the statement's line."""
    line = packaged.user_line(artifact_line)
    if line is None:
        starts = [k for k in packaged.line_map if k <= artifact_line]
        line = packaged.user_line(max(starts)) if starts else None
    return line


def map_traceback(
    text: str,
    packaged: PackagedFunction | None,
    cell_source: str | None,
    *,
    line_offset: int = 0,
    where: str = "cell line {}",
) -> str:
    """Rewrite every reference to the artifact (Python frames, SyntaxError, numba's forms) to the user's
    cell lines, with the cell's own source line in place of the packaged one (see `tracebacks`).

    `line_offset` is 1 for `%%gpu_function` cells: the magic line is the notebook cell's first line.
    """
    if not text or packaged is None:
        return text or ""
    cell_lines = cell_source.splitlines() if cell_source else []
    return map_error_text(text, lambda n: _user_line(packaged, n), cell_lines, line_offset=line_offset, where=where)
