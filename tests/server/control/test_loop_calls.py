"""``control/loop_calls.py``: a callback for the event loop from the loop's own thread or any other, in call order, and a
loop asleep in its selector woken by one from another thread (the server's loop is uvloop's)."""

from __future__ import annotations

import asyncio
import threading

import uvloop

from lancefn_jupyter.server.control.loop_calls import call_on_loop, running_loop


def test_calls_run_in_order_from_the_loop_and_wake_it_from_another_thread():
    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        assert running_loop() is loop
        seen: list[str] = []
        done = asyncio.Event()
        call_on_loop(loop, seen.append, "loop 1")
        loop.call_soon_threadsafe(seen.append, "threadsafe")  # the same queue: order kept across both ways
        call_on_loop(loop, seen.append, "loop 2")
        await asyncio.sleep(0)
        assert seen == ["loop 1", "threadsafe", "loop 2"]

        def other() -> None:
            assert running_loop() is None
            call_on_loop(loop, seen.append, "other thread")
            call_on_loop(loop, done.set)

        # The loop sleeps in its selector with no timer due: only the other thread's call can wake it.
        threading.Timer(0.05, other).start()
        await asyncio.wait_for(done.wait(), 10.0)
        return seen

    assert uvloop.run(scenario()) == ["loop 1", "threadsafe", "loop 2", "other thread"]
