"""Long polls (``jobs/wait``, ``batches/wait``) waiting for the next change of a job or batch."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Any

from lancefn_jupyter.server.control.loop_calls import running_loop


class Waiters:
    """Futures by the id they wait on.  ``add`` runs under the owner's lock (so a change cannot
    slip between the check and the wait); ``wake`` may run on any thread."""

    def __init__(self, lock: AbstractContextManager[Any]):  # the owner's lock (the job table's)
        self._lock = lock
        self._futures: dict[str, list[asyncio.Future]] = {}

    def keys(self) -> list[str]:
        return list(self._futures)

    def add(self, key: str, loop: asyncio.AbstractEventLoop) -> asyncio.Future:
        future = loop.create_future()
        self._futures.setdefault(key, []).append(future)
        return future

    def waiting(self, key: str) -> bool:
        return key in self._futures

    async def wait(self, key: str, future: asyncio.Future, timeout_s: float) -> Any:
        """Until ``future`` is woken (its value: what ``wake`` was given) or ``timeout_s`` passes
        (None); then it is no longer waiting."""
        try:
            # Each waiter has a future of its own: it may be cancelled by the timeout (``wake`` skips a done
            # one), so it needs no shield, nor ``wait_for``'s task.
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            return None
        finally:
            with self._lock:
                futures = self._futures.get(key)
                if futures and future in futures:
                    futures.remove(future)
                    if not futures:
                        del self._futures[key]

    def wake(self, key: str, loop: asyncio.AbstractEventLoop | None, value: Any = None) -> None:
        futures = self._futures.pop(key, None)
        if not futures or loop is None:
            return

        def wake() -> None:
            for future in futures:
                if not future.done():
                    future.set_result(value)

        try:
            if running_loop() is loop:  # woken on the loop itself (a job it ran): at once, no pass of the loop between
                wake()
            else:
                loop.call_soon_threadsafe(wake)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass
