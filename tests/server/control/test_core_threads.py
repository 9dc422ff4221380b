"""``offload.off_loop``: core work runs on core threads, several at once, and its outcome
(value or exception) comes back to the awaiting coroutine while the event loop stays free."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.errors import ApiError

pytestmark = pytest.mark.unit


def test_calls_run_off_the_loop_at_once_and_return_values_and_errors():
    release = threading.Event()
    started: list[str] = []

    def blocking(name: str) -> str:
        started.append(threading.current_thread().name)
        assert release.wait(10)
        return name.upper()

    def failing() -> None:
        raise ApiError(404, "no such job")

    async def scenario() -> tuple[list[str], list[str], str]:
        loop_thread = threading.current_thread().name
        calls = [asyncio.ensure_future(off_loop(blocking, name)) for name in ("a", "b", "c")]
        ticks = 0
        while len(started) < 3:  # all three block at once: none waits for another's thread
            await asyncio.sleep(0.01)  # the loop keeps running meanwhile
            ticks += 1
            assert ticks < 1000, "the calls did not all start"
        release.set()
        values = await asyncio.gather(*calls)
        with pytest.raises(ApiError) as caught:
            await off_loop(failing)
        assert caught.value.status == 404
        return values, started, loop_thread

    values, threads, loop_thread = asyncio.run(scenario())
    assert values == ["A", "B", "C"]
    assert loop_thread not in threads and all(name == "lancefn-core" for name in threads)
