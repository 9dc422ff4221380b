"""The Ray bridge's event lines read by the event loop (``BridgeFeed``), on a real pipe and uvloop, as the server
runs it: quick events are handled on the loop under the core's locks; what could take a while, and everything while
a lock is busy, goes to the feed's thread in order, after which the loop takes its turn again; the pipe's end comes
after the last event; a let-go stops the reading before the pipe is closed."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest
import uvloop

from lancefn_jupyter.server.executors.loop_follow import LOOP_EVENT_BYTES
from lancefn_jupyter.server.executors.ray.feed import LOOP_EVENTS, BridgeFeed
from lancefn_jupyter.worker.process import ProtocolLines

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Core:
    """Records each handled event with the thread that handled it; grants the core's locks."""

    def __init__(self) -> None:
        self.handled: list[tuple[str, int]] = []

    def hold_now(self):
        return lambda: None

    def on_loop(self, event: dict) -> bool:
        return not event["id"].startswith("chunk")  # the executor keeps a batch chunk's outcome off the loop

    def handle(self, event: dict) -> None:
        self.handled.append((event["id"], threading.get_ident()))


def line(event_id: str, kind: str = "started", **fields) -> bytes:
    return (json.dumps({"event": kind, "id": event_id, **fields}) + "\n").encode()


def run_feed(writes: list[bytes], *, before: bytes = b"", let_go_after: int | None = None):
    """A feed on a pipe: ``before`` is read by the blocking reader first (as the ``ready`` line is); each of
    ``writes`` is written once what came before is handled; then the write end closes (the bridge's exit), or, with
    ``let_go_after``, the feed is let go from a thread after that many writes and one more line is written. The core,
    the loop's thread id, and whether the feed ended."""
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb")
    lines = ProtocolLines(reader)
    core = Core()

    async def main():
        if before:
            os.write(write_fd, before)
            assert json.loads(lines.readline())["event"] == "ready"
        feed = BridgeFeed(
            lines, asyncio.get_running_loop(), hold_now=core.hold_now, handle=core.handle, on_loop=core.on_loop
        )
        await asyncio.to_thread(feed.start)
        events = before.count(b"{") - 1
        await wait_for(lambda: len(core.handled) >= events)  # what was buffered, before anything more comes
        for index, data in enumerate(writes):
            await asyncio.to_thread(os.write, write_fd, data)  # a long line fills the pipe: the loop must read on
            events += data.startswith(b"{")
            await wait_for(lambda events=events: len(core.handled) >= events)
            if let_go_after is not None and index + 1 == let_go_after:
                await asyncio.to_thread(feed.let_go)
                os.write(write_fd, line("after-let-go"))
                await asyncio.sleep(0.1)
                return threading.get_ident(), feed.ended.is_set()
        os.close(write_fd)
        return threading.get_ident(), await asyncio.to_thread(feed.ended.wait, 10)

    try:
        loop_thread, ended = uvloop.run(main())
    finally:
        reader.close()
        if let_go_after is not None:
            os.close(write_fd)
    return core, loop_thread, ended


async def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_quick_events_are_handled_on_the_loop_in_order_and_the_end_comes_after_the_last():
    bundle = line("bundle", "events", events=[{"event": "started"}, {"event": "result", "results": [1]}])
    core, loop_thread, ended = run_feed([line("a"), line("b", "result", results=[2]), bundle])
    assert ended
    assert [event_id for event_id, _ in core.handled] == ["a", "b", "bundle"]
    assert {thread for _, thread in core.handled} == {loop_thread}


def test_what_could_take_a_while_goes_to_the_thread_in_order_and_the_loop_takes_its_turn_again():
    slow = [
        line("chunk", "events", events=[{"event": "started"}, {"event": "result", "results": [1]}]),
        line("log", "log", lines=["x"]),
        line("progress", "progress", rows_done=1),
        line("arrow", "result", result_file="/r"),
        line("long", "result", results=["y" * LOOP_EVENT_BYTES]),
        line("chatty", "events", events=[{"event": "log", "lines": ["x"]}, {"event": "result", "results": [1]}]),
        line("many", "events", events=[{"event": "started"}] * LOOP_EVENTS + [{"event": "result", "results": [1]}]),
    ]
    core, loop_thread, ended = run_feed([line("first"), *slow, line("last")])
    assert ended
    assert [event_id for event_id, _ in core.handled] == [
        "first",
        "chunk",
        "log",
        "progress",
        "arrow",
        "long",
        "chatty",
        "many",
        "last",
    ]
    threads = dict(core.handled)
    assert threads["first"] == threads["last"] == loop_thread  # the queue emptied: the loop's turn again
    slow_ids = ("log", "progress", "arrow", "long", "chatty", "many", "chunk")
    assert all(threads[event_id] != loop_thread for event_id in slow_ids)


def test_a_busy_lock_sends_the_event_and_those_after_it_to_the_thread_until_the_queue_is_empty():
    read_fd, write_fd = os.pipe()
    reader = os.fdopen(read_fd, "rb")
    lines = ProtocolLines(reader)
    handled: list[tuple[str, int]] = []
    tries: list[str] = []
    gate = threading.Event()

    def hold_now():
        tries.append("try")
        return None if len(tries) == 1 else (lambda: None)

    def handle(event: dict) -> None:
        if event["id"] == "busy":
            gate.wait(10)  # the thread is still at it while the next lines arrive
        handled.append((event["id"], threading.get_ident()))

    async def main() -> int:
        feed = BridgeFeed(lines, asyncio.get_running_loop(), hold_now=hold_now, handle=handle)
        feed.start()
        os.write(write_fd, line("busy"))
        await wait_for(lambda: tries)
        os.write(write_fd, line("queued-1") + line("queued-2"))
        await asyncio.sleep(0.05)
        assert handled == [] and len(tries) == 1  # behind the busy one: no lock try on the loop meanwhile
        gate.set()
        await wait_for(lambda: len(handled) == 3)
        os.write(write_fd, line("later"))
        await wait_for(lambda: len(handled) == 4)
        os.close(write_fd)
        assert await asyncio.to_thread(feed.ended.wait, 10)
        return threading.get_ident()

    try:
        loop_thread = uvloop.run(main())
    finally:
        reader.close()
    assert [event_id for event_id, _ in handled] == ["busy", "queued-1", "queued-2", "later"]
    assert all(thread != loop_thread for _, thread in handled[:3])
    assert handled[3][1] == loop_thread


def test_lines_the_blocking_reader_left_in_the_buffer_are_handled_when_the_loop_starts():
    ready = json.dumps({"event": "ready"}).encode() + b"\n"
    core, _, ended = run_feed([line("b")], before=ready + line("a"))
    assert ended
    assert [event_id for event_id, _ in core.handled] == ["a", "b"]


def test_a_let_go_stops_the_reading_and_ends_the_feed():
    core, _, ended = run_feed([line("a"), line("b")], let_go_after=1)
    assert ended
    assert [event_id for event_id, _ in core.handled] == ["a"]  # nothing read after it


def test_a_malformed_line_is_skipped_and_the_next_handled():
    core, _, ended = run_feed([b"not json\n", line("a")])
    assert ended and [event_id for event_id, _ in core.handled] == ["a"]


def test_the_executor_lets_the_loop_handle_only_the_events_of_jobs_the_loop_launched():
    """A run the loop queued is cheap to finish there; a batch chunk (launched by a batch's thread) may read its
    result file or submit the next chunks when it ends, so its events go to the feed's thread."""
    from lancefn_jupyter.server.executors.base import TaskSpec
    from lancefn_jupyter.server.executors.ray import RayExecutor

    executor = RayExecutor()  # not started: launches wait in its buffer

    def task(job_id: str) -> TaskSpec:
        return TaskSpec(job_id, "f", "v", b"def f():\n    return 1\n", "f", [{}], (), True, "small", 1, {}, (), None)

    class Callbacks:
        def __init__(self, loop) -> None:
            self.loop = loop

        def event_loop(self):
            return self.loop

    async def main() -> None:
        executor._callbacks = Callbacks(asyncio.get_running_loop())  # what start() sets
        executor.launch(task("run"))
        await asyncio.to_thread(executor.launch, task("chunk"))

    uvloop.run(main())
    assert executor._on_loop_ok({"event": "events", "job_id": "run"})
    assert not executor._on_loop_ok({"event": "events", "job_id": "chunk"})
    assert executor._on_loop_ok({"event": "capacity", "capacity": {}})
    executor.cancel("run")
    assert not executor._on_loop_ok({"event": "events", "job_id": "run"})  # forgotten with the job
