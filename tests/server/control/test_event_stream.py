"""The SSE generator's catch-up step, in process: a usage or queue event that arrives while the
stream reads its opening snapshots must still reach the client (it once was cleared with the job
items the backlog re-reads, so a widget could miss a job's start for good)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lancefn_jupyter.server.control.events import EventBus, event_stream

pytestmark = pytest.mark.unit


class _Core:
    """The snapshots and the event log ``event_stream`` reads; usage changes while its first snapshot is read."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.busy = 0

    def gpu_usage(self) -> dict:
        seen = self.busy
        if seen == 0:  # a job starts while this snapshot is being read
            self.busy = 1
            self.bus.publish("usage", None, json.dumps({"busy": 1}))
        return {"busy": seen}

    def queue_snapshot(self, scope):
        return None

    def events_after(self, last, limit, scope):
        return []


async def _frames(count: int) -> list[tuple[str, dict]]:
    bus = EventBus()
    bus.attach(asyncio.get_running_loop())
    core = _Core(bus)

    async def off_loop(fn, *args):  # as the server's: the loop runs (and fans out) while fn does
        value = fn(*args)
        await asyncio.sleep(0)
        return value

    stream = event_stream(bus, core, core.events_after, 0, None, off_loop, keepalive_s=0.05)
    frames = []
    async for text in stream:
        if text.startswith(":"):
            break  # a keepalive: nothing more is coming
        lines = dict(line.split(": ", 1) for line in text.strip().splitlines())
        frames.append((lines["event"], json.loads(lines["data"])))
        if len(frames) == count:
            break
    await stream.aclose()
    return frames


def test_a_usage_event_published_during_the_opening_snapshot_is_delivered_after_it():
    frames = asyncio.run(_frames(2))
    assert frames == [("usage", {"busy": 0}), ("usage", {"busy": 1})]
