"""A protocol pipe read with a line limit (docs/ARCHITECTURE.md, "Worker protocol"): a line past it is dropped as it
comes, the rest of it skipped, and the next line read whole; a reader's own smaller limit leaves the line for
another reader. Real pipes, a small limit."""

from __future__ import annotations

import os
import threading

import pytest

from lancefn_jupyter.worker.process import ProtocolLines
from lancefn_jupyter.worker.protocol import LineTooLong

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

LIMIT = 1000


def pipe_with(data: bytes) -> ProtocolLines:
    """A reader on a pipe a thread writes ``data`` to, then closes."""
    read_fd, write_fd = os.pipe()

    def write() -> None:
        with os.fdopen(write_fd, "wb") as out:
            out.write(data)

    threading.Thread(target=write, daemon=True).start()
    return ProtocolLines(os.fdopen(read_fd, "rb", buffering=0), limit=LIMIT)


def test_readline_drops_a_line_past_the_limit_and_reads_the_next_whole():
    lines = pipe_with(b"a" * (50 * LIMIT) + b"\n" + b"next\n" + b"b" * LIMIT + b"\n")
    with pytest.raises(LineTooLong):
        lines.readline()
    assert lines.readline() == b"next\n"
    with pytest.raises(LineTooLong):  # exactly the limit, without its newline: one byte too long
        lines.readline()
    assert lines.readline() == b""


def test_a_line_of_exactly_the_limit_is_read():
    line = b"c" * (LIMIT - 1) + b"\n"
    lines = pipe_with(line + b"after\n")
    assert lines.readline() == line and lines.readline() == b"after\n"


def test_the_event_loops_reads_drop_a_long_line_as_it_comes_and_keep_the_next():
    lines = pipe_with(b"d" * (50 * LIMIT) + b"\nnext\n")
    dropped, found = 0, None
    while found is None and lines.fill():  # as the feed reads: what the pipe has, then the whole lines in it
        try:
            found = lines.buffered_line()
        except LineTooLong:
            dropped += 1
    while found is None:
        found = lines.buffered_line()
    assert dropped == 1 and found == b"next\n"


def test_a_readers_own_smaller_limit_leaves_the_line_for_another_reader():
    line = b"e" * 500 + b"\n"
    lines = pipe_with(line)
    while lines.fill():
        pass
    with pytest.raises(ValueError):
        lines.buffered_line(100)
    assert lines.buffered_line() == line
