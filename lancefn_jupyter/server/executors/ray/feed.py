"""The Ray bridge's event lines, read by the control plane's event loop (``RayExecutor``; docs/ARCHITECTURE.md,
"REST details"). Runs in the control plane's server process: on its event loop, except :meth:`BridgeFeed.let_go`
and the feed's thread.

The loop reads the bridge's stdout when it is readable (``add_reader``) and handles each event there while the
core's locks are free now (``ExecutorCallbacks.hold_now``): a quick job's outcome is saved, and its request woken,
with no thread in between. What could take a while goes to the feed's thread instead, in order: log and progress
lines (each is a commit), an Arrow result (its file is checked), a line over ``LOOP_EVENT_BYTES``, a bundle of more
than ``LOOP_EVENTS`` events, and every event while a lock is busy. Once one event is queued there, the ones after it
follow it until the queue is empty. The pipe's end is handled after the last event, on the thread."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from lancefn_jupyter.server.executors.loop_follow import LET_GO_WAIT_S, LOOP_EVENT_BYTES
from lancefn_jupyter.wire.jsontext import loads
from lancefn_jupyter.worker.process import ProtocolLines
from lancefn_jupyter.worker.protocol import LineTooLong

__all__ = ["LOOP_EVENTS", "BridgeFeed"]

log = logging.getLogger("lancefn.server")

LOOP_EVENTS = 8  # a job's bundle of more events (its last log lines, its outcome) is saved on the feed's thread

_END = object()  # queued after the last event: the pipe ended, or the loop let go of it


class BridgeFeed:
    """``handle(event)`` applies one bridge event (on the loop with the core's locks held, or on the feed's thread);
    ``hold_now()`` takes the core's locks if they are free now, returning their release; ``on_loop(event)``: whether
    the executor lets the loop handle it (a job whose outcome is cheap to save). :attr:`ended` is set once every event
    read has been handled and the loop no longer reads the pipe."""

    def __init__(
        self,
        lines: ProtocolLines,
        loop: asyncio.AbstractEventLoop,
        *,
        hold_now: Callable[[], Callable[[], None] | None],
        handle: Callable[[dict], None],
        on_loop: Callable[[dict], bool] = lambda event: True,
    ) -> None:
        self._lines, self._loop = lines, loop
        self._hold_now, self._handle, self._on_loop = hold_now, handle, on_loop
        self._turn = threading.Lock()  # guards the queue and who has the turn
        self._queue: collections.deque[Any] = collections.deque()
        self._draining = False  # the thread has the turn: events go after what it holds
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._watching = False  # on the loop only
        self._ending = False  # on the loop only: the end is queued
        self._released = threading.Event()  # the loop reads the pipe no more
        self.ended = threading.Event()

    # ------------------------------------------------------------------ any thread

    def start(self) -> None:
        """The loop reads the pipe from now on (and first what the buffer holds)."""
        try:
            self._loop.call_soon_threadsafe(self._watch)
        except RuntimeError:  # the loop is closed: nobody will read
            self._released.set()
            self.ended.set()

    def let_go(self) -> None:
        """The loop stops reading (what it read is still handled), so the pipe may be closed; then :attr:`ended`."""
        if self._released.is_set():
            return
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._stop()
            return
        try:
            self._loop.call_soon_threadsafe(self._stop)
        except RuntimeError:  # the loop is closed: it watches nothing
            self._released.set()
            self.ended.set()
            return
        self._released.wait(LET_GO_WAIT_S)

    # ------------------------------------------------------------------ the event loop

    def _watch(self) -> None:
        if self._released.is_set():  # let go before it began
            return
        try:
            self._loop.add_reader(self._lines.fileno(), self._readable)
        except (OSError, ValueError):  # already closed: its end
            self._stop()
            return
        self._watching = True
        self._take_buffered()

    def _readable(self) -> None:
        more = self._lines.fill()
        self._take_buffered()
        if not more:
            self._stop()

    def _take_buffered(self) -> None:
        while True:
            try:
                line = self._lines.buffered_line()
            except LineTooLong as error:  # the bridge sends none (it fails the job instead): never buffered whole
                log.warning("ray executor: the bridge sent %s; dropped", error)
                continue
            if line is None:
                return
            self._lines.drop_line()
            try:
                self._take(line)
            except Exception:  # a bug of ours: the next events must still be handled
                log.exception("ray executor: could not handle a bridge event on the event loop")

    def _take(self, line: bytes) -> None:
        if not line.strip():
            return
        if self._thread_has_turn() or len(line) > LOOP_EVENT_BYTES:
            self._push(line)
            return
        event = _parse(line)
        if event is None:
            return
        if not (_quick(event) and self._on_loop(event)):
            self._push(event)
            return
        release = self._hold_now()
        if release is None:
            self._push(event)
            return
        try:
            self._handle(event)
        finally:
            release()

    def _stop(self) -> None:
        """Read no more; the end goes after the events read so far."""
        if self._watching:
            self._watching = False
            try:
                self._loop.remove_reader(self._lines.fileno())
            except (OSError, ValueError):
                pass
        self._released.set()
        if not self._ending:
            self._ending = True
            self._push(_END)

    def _thread_has_turn(self) -> bool:
        with self._turn:
            return self._draining

    def _push(self, item: Any) -> None:
        """To the feed's thread, after what it holds."""
        with self._turn:
            self._queue.append(item)
            if self._draining:
                return
            self._draining = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="lancefn-ray-events", daemon=True)
                self._thread.start()
        self._wake.set()

    # ------------------------------------------------------------------ the feed's thread

    def _drain(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._turn:
                    if not self._queue:
                        self._draining = False  # the loop has the turn again
                        break
                    item = self._queue.popleft()
                if item is _END:
                    self.ended.set()
                    return
                event = _parse(item) if isinstance(item, bytes) else item
                if event is None:
                    continue
                try:
                    self._handle(event)
                except Exception:  # a bug of ours: the next events must still be handled
                    log.exception("ray executor: could not handle %s event", event.get("event"))


def _parse(line: bytes) -> dict | None:
    try:
        event = loads(line)
    except ValueError:
        log.warning("ray bridge sent a malformed line: %r", line[:200])
        return None
    return event if isinstance(event, dict) else None


def _quick(event: dict) -> bool:
    """Whether the loop may handle ``event`` now: nothing in it commits more than once or reads a file."""
    kind = event.get("event")
    if kind in ("log", "progress"):
        return False
    if kind == "events":
        inner = event.get("events") or ()
        return len(inner) <= LOOP_EVENTS and all(
            isinstance(each, dict) and each.get("event") not in ("log", "progress") and "result_file" not in each
            for each in inner
        )
    return "result_file" not in event
