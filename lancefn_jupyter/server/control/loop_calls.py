"""A callback for the control plane's event loop from any thread. Runs in the server process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["call_on_loop", "running_loop"]


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The loop this thread runs, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # not on a loop's thread
        return None


def call_on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """``callback(*args)`` on ``loop`` soon, in order with every other call made either way: from the loop's own
    thread a plain ``call_soon`` (a quick job's run is on the loop), which spares the self-pipe write that wakes the
    loop for one more pass; from any other thread ``call_soon_threadsafe``. ``RuntimeError`` once the loop is closed."""
    if running_loop() is loop:
        loop.call_soon(callback, *args)
    else:
        loop.call_soon_threadsafe(callback, *args)
