"""Core threads: the daemon threads that run control-plane work (JSON parsing, hashing, SQLite)
for the event loop, so health checks, SSE streams and other clients stay live while a request
waits on the job table's lock or the disk (docs/ARCHITECTURE.md, "REST details").  Runs in the
control plane's server process."""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any


class CoreThreads:
    """Daemon threads running core work for the event loop, at most ``limit`` at once (as many as
    Starlette's threadpool).  Plainer than its anyio hop (no capacity limiter, cancel scope or
    context copy): about half the event loop's time per call, and every request makes one."""

    def __init__(self, limit: int = 40) -> None:
        self._work: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future, Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = self._unfinished = 0  # a call needs a new thread when every thread has one
        self._limit = limit

    def run(self, call: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            spawn = self._unfinished >= self._threads and self._threads < self._limit
            self._threads += spawn
            self._unfinished += 1
        if spawn:
            threading.Thread(target=self._serve, name="lancefn-core", daemon=True).start()
        self._work.put((loop, future, call))
        return future

    def _serve(self) -> None:
        while True:
            loop, future, call = self._work.get()
            try:
                outcome, failed = call(), False
            except BaseException as error:  # handed to the awaiting request, like any result
                outcome, failed = error, True
            with self._lock:
                self._unfinished -= 1
            try:
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            except RuntimeError:  # the loop closed meanwhile: nobody awaits it
                pass


def _settle(future: asyncio.Future, outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


_CORE_THREADS = CoreThreads()


async def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run core work (parsing, hashing, SQLite) on a core thread so the event loop stays live."""
    return await _CORE_THREADS.run(functools.partial(fn, *args, **kwargs))
