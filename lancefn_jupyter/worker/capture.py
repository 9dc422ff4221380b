"""Capture of a worker process's fds 1 and 2 (docs/ARCHITECTURE.md, "Worker protocol"): each is
re-pointed at a pipe whose lines become ``log`` events, and :func:`flush_output` waits until every
line written so far has gone out. Used by the local worker (``main.py``) and by the Ray job actor
(``server/executors/ray/task.py``), in the process that runs user code; standard library only.

Row tags ("Live output"): the runner says which row runs (:func:`set_row`); the first write of a row to
``sys.stdout`` / ``sys.stderr`` (:func:`tag_rows` wraps them) puts a marker before it, in the same buffered text,
so a row that prints nothing costs nothing; the reader tags each line with the last marker's row. Output written to
fds 1/2 directly (C code, child processes) carries the row of the stream's last marker.
"""

from __future__ import annotations

import array
import os
import re
import select
import sys
import threading
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

from lancefn_jupyter.worker.protocol import flush_stdio

__all__ = ["Capture", "EventSink", "flush_output", "set_row", "tag_rows"]


class EventSink(Protocol):
    """Where captured lines go: the worker's ``Protocol``, or the Ray actor's output router."""

    def send(self, **event: Any) -> None: ...


_SYNC = b"\x00lancefn-log-sync\x00"  # written into the log pipes to know every earlier line was sent
_ROW = re.compile(rb"\x00lancefn-row:(\d*)\x00")  # the lines after it on its stream are that row's ("": none)
_row: list[int | None] = [None]  # the row the task runs now


def set_row(row: int | None) -> None:
    """The row running from now on (None: none, e.g. setup or between tasks)."""
    _row[0] = row


class _RowTagged:
    """``sys.stdout`` / ``sys.stderr`` as they were, but a row's first write is preceded by its marker."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._marked: int | None = None

    def write(self, text: str) -> int:
        row = _row[0]
        if row != self._marked and text:
            self._marked = row
            self._stream.write(f"\x00lancefn-row:{'' if row is None else row}\x00")
        return self._stream.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tag_rows() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` so what a row prints is tagged with it (once per process)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _RowTagged):
            setattr(sys, name, _RowTagged(stream))


class Capture(threading.Thread):
    """Points ``fd`` (1 or 2) at a pipe and forwards what is written there as ``log`` events.

    The thread reads and forwards a chunk while holding ``lock``, so whoever holds the lock and
    finds the pipe empty and no partial line kept knows that everything written so far is out."""

    def __init__(self, proto: EventSink, stream: str, fd: int) -> None:
        super().__init__(name=f"lancefn-{stream}", daemon=True)
        self._proto, self._stream, self.fd = proto, stream, fd
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self._pending = b""  # a partial line, sent once its newline (or a sync marker) comes
        self._row: int | None = None  # the row of this stream's last row marker
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        while True:
            poller.poll()  # readable, or the write end closed: read it under the lock
            with self.lock:
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    return
                self._forward(chunk)

    def _forward(self, chunk: bytes) -> None:
        *complete, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > 65536:  # e.g. "\r" progress bars: never buffer a whole task's output
            complete.append(self._pending)
            self._pending = b""
        lines, rows, synced = [], [], False
        for line in complete:
            if line.endswith(_SYNC):  # a partial line before the marker still counts as a line
                line, synced = line[: -len(_SYNC)], True
                if not line:
                    continue
            if b"\x00lancefn-row:" in line:
                for found in _ROW.finditer(line):
                    self._row = int(found.group(1)) if found.group(1) else None
                line = _ROW.sub(b"", line)
            lines.append(line.decode("utf-8", "replace"))
            rows.append(self._row)
        if lines and any(row is not None for row in rows):
            self._proto.send(event="log", stream=self._stream, lines=lines, rows=rows)
        elif lines:
            self._proto.send(event="log", stream=self._stream, lines=lines)
        if synced:
            self.synced.set()

    def drained(self) -> bool:
        """Everything written to the pipe so far has gone out (checked without waking the thread)."""
        with self.lock:
            return not self._pending and _unread_bytes(self._read_fd) == 0


def _unread_bytes(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD); -1 where that cannot be asked."""
    try:
        import fcntl
        import termios

        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]
    except (ImportError, OSError):
        return -1


def flush_output(captures: Sequence[Capture]) -> None:
    """Return once everything user code wrote so far has gone out as ``log`` events.

    Called before ``result``/``failed`` so a task's logs always precede its outcome.  A task that
    printed nothing (most small jobs) costs no round trip through the capture threads.
    """
    flush_stdio()
    waiting = [capture for capture in captures if not capture.drained()]
    for capture in waiting:
        capture.synced.clear()
        os.write(capture.fd, _SYNC + b"\n")
    for capture in waiting:
        capture.synced.wait(2.0)  # bounded: user code may have re-pointed fd 1/2 elsewhere
