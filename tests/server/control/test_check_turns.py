"""Turns at the artifact checker's children (``artifact_check.CheckTurns``): at most ``children`` at once, waiting keys
served round robin, a key past its cap refused with a 429 naming the flag, and a cancelled waiter never loses a
turn for the others."""

from __future__ import annotations

import asyncio

import pytest

from lancefn_jupyter.server.control.artifact_check import CheckTurns
from lancefn_jupyter.server.errors import ApiError

pytestmark = pytest.mark.unit


async def _taker(turns: CheckTurns, key: str, order: list[str], release: asyncio.Event) -> None:
    async with turns.turn(key):
        order.append(key)
        await release.wait()


def test_waiting_keys_take_turns_and_a_key_past_its_cap_gets_a_429():
    async def scenario() -> tuple[list[str], str]:
        turns = CheckTurns(per_key=6, flag="--max-bodies-per-key", children=2)
        order: list[str] = []
        releases = [asyncio.Event() for _ in range(9)]
        # A's burst of six arrives first, then B's two: B need not wait for the whole burst.
        keys = ["a"] * 6 + ["b"] * 2
        tasks = [asyncio.create_task(_taker(turns, key, order, releases[i])) for i, key in enumerate(keys)]
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as refused:
            async with turns.turn("a"):  # A's seventh: past its cap of six waiting or running
                pass
        for release in releases[:8]:  # end the turns one at a time, oldest first
            release.set()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert refused.value.status == 429
        return order, refused.value.message

    order, message = asyncio.run(scenario())
    assert order == ["a", "a", "a", "b", "a", "b", "a", "a"], order
    assert "--max-bodies-per-key" in message and "6" in message, message


def test_a_cancelled_waiter_passes_its_turn_on():
    async def scenario() -> list[str]:
        turns = CheckTurns(per_key=4, flag="--max-bodies-per-key", children=1)
        order: list[str] = []
        first, later = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(_taker(turns, "a", order, first))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_taker(turns, "b", order, later))  # its client goes away while it waits
        waiting = asyncio.create_task(_taker(turns, "c", order, later))
        await asyncio.sleep(0)
        gone.cancel()
        first.set()
        later.set()
        await asyncio.gather(running, waiting)
        return order

    assert asyncio.run(scenario()) == ["a", "c"]
