"""A worker's protocol pipe followed by the event loop: the local executor's quick job that the loop itself runs
(``LocalExecutor._follow_on_loop``; docs/ARCHITECTURE.md, "REST details"). Runs in the control plane's server
process, on its event loop, except :meth:`LoopFollow.let_go`.

The loop reads what the pipe has when it is readable (``add_reader``), into the worker's own buffer, and hands each
whole event to ``take``; whatever ``take`` declines, and the pipe's end, the deadline or a bug, goes to a task thread
(``to_task_thread``), which reads on from that same buffer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from lancefn_jupyter.worker.process import WorkerProcess

__all__ = ["LET_GO_WAIT_S", "LOOP_EVENT_BYTES", "LoopFollow"]

LET_GO_WAIT_S = 2.0  # how long a stop waits for the event loop to let go of the pipe (``let_go``)
# The longest event line the loop parses and hands to ``take``: a longer one (a large JSON result, whose check and
# save take a while) goes to a task thread.
LOOP_EVENT_BYTES = 64 * 1024


class LoopFollow:
    """``take(event)``: True when the run ended with it, False when it goes on, None when a task thread must take
    it (left in the buffer). ``to_task_thread()``: a task thread follows the run on. ``failed(error)``: a bug of ours
    while following; the run must still end."""

    def __init__(
        self,
        worker: WorkerProcess,
        loop: asyncio.AbstractEventLoop,
        *,
        take: Callable[[dict], bool | None],
        to_task_thread: Callable[[], None],
        failed: Callable[[Exception], None],
    ) -> None:
        self._worker, self._loop = worker, loop
        self._take, self._to_task_thread, self._failed = take, to_task_thread, failed
        self._fd: int | None = None
        self._timer: asyncio.TimerHandle | None = None
        # From the start, so a stop that comes before :meth:`start` (on the same pass of the loop) still has the loop
        # let go first: its passing to a task thread runs on the loop after that pass.
        self._active = True

    def start(self, deadline: float) -> None:
        """Watch the pipe until the run ends or ``deadline`` (``time.monotonic()``) passes."""
        try:
            self._fd = self._worker.events_fd()
            self._loop.add_reader(self._fd, self._readable)
        except (OSError, ValueError):  # a concurrent kill closed the pipe already
            self._fd = None
            self._pass_to_task_thread()
            return
        self._timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), self._pass_to_task_thread)

    def _readable(self) -> None:
        try:
            more = self._worker.fill_events()
            while True:
                try:
                    event = self._worker.buffered_event(LOOP_EVENT_BYTES)
                except ValueError:  # too long for the loop, or no protocol event: a task thread reads it
                    event, more = None, False
                if event is None:
                    break
                taken = self._take(event)
                if taken is None:
                    self._pass_to_task_thread()
                    return
                if taken:
                    self._detach()
                    return
            if not more:  # the pipe's end (the worker died, or is being killed): a task thread says why
                self._pass_to_task_thread()
        except Exception as error:  # a bug of ours: the run must still end
            self._detach()
            self._failed(error)

    def _detach(self) -> None:
        self._active = False
        if self._fd is not None:
            # Watching it made the pipe non-blocking (uvloop), and it stays so: a task thread's reads wait for the
            # worker all the same (``ProtocolLines``), and the next job the loop follows needs no change back.
            self._loop.remove_reader(self._fd)
            self._fd = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _pass_to_task_thread(self) -> None:
        if not self._active:  # ended, or passed on already
            return
        self._detach()
        self._to_task_thread()

    def let_go(self) -> None:
        """(Any thread but the loop's.) Hand the run to a task thread before its worker is killed, so the loop never
        watches a pipe the kill closes."""
        if not self._active:
            return
        handed = threading.Event()

        def pass_on() -> None:
            try:
                self._pass_to_task_thread()
            finally:
                handed.set()

        try:
            self._loop.call_soon_threadsafe(pass_on)
        except RuntimeError:  # the loop is closed: it watches nothing any more
            return
        handed.wait(LET_GO_WAIT_S)
