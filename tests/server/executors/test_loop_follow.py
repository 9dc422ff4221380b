"""A warm job the event loop starts and follows (``InlineRun.follow_on_loop``), on the real local executor with
real workers and uvloop, as the server runs it: it ends on the loop, pooled and reported there; what could wait goes
to a task thread, whose reads of the worker's pipe then wait again; a stop lets go of the pipe before the kill."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvloop
from test_local_executor import Recorder, alive, started_executor, task

from lancefn_jupyter.server.executors.local import LOOP_ARTIFACT_BYTES, LocalExecutor

LOGS = """
def f(x):
    print("row", x, flush=True)
    return x * 3
"""
NAP = """
import os, time
def f(x):
    print("pid", os.getpid(), flush=True)
    time.sleep(x)
    return x
"""


class LoopRecorder(Recorder):
    """Also records which thread made each report, and grants (or refuses) the core's locks to the loop."""

    def __init__(self, grant: bool = True) -> None:
        super().__init__()
        self.grant = grant
        self.threads: dict[tuple[str, str], int] = {}  # (report, job id) → the thread that made it
        self.holds = 0

    def _add(self, *call) -> None:
        self.threads[(call[0], call[1])] = threading.get_ident()
        super()._add(*call)

    def hold_now(self):
        self.holds += 1
        return (lambda: None) if self.grant else None


@pytest.fixture
def looped():
    with started_executor(LoopRecorder()) as ex:
        yield ex


def warm(ex: LocalExecutor, source: str, x) -> None:
    """Run one job of the version on a task thread, so its worker is idle (and can be launched inline) after."""
    ex.launch(task("warm", source, [{"x": x}]))
    assert ex.recorder.final("warm")[0] == "succeeded"
    ex.recorder.wait_for(lambda _: ex.warm_devices("default", "f", "v1") == [("0",)])


async def launch_inline(ex: LocalExecutor, spec):
    """The executor's ``InlineRun`` for ``spec`` once the warm-up run is over (reported, then ended)."""
    deadline = time.monotonic() + 10
    while (inline := ex.launch_inline(spec)) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert inline is not None, "its worker should be idle"
    return inline


def follow(ex: LocalExecutor, job_id: str, source: str, x, follow_s: float, then=None) -> tuple[tuple, int]:
    """Adopt the job and have a uvloop loop follow it; ``then(ex, job_id)`` runs on a thread meanwhile. The final
    report, and the loop thread's id."""

    async def main() -> tuple[tuple, int]:
        inline = await launch_inline(ex, task(job_id, source, [{"x": x}]))
        inline.follow_on_loop(time.monotonic() + follow_s)
        if then is not None:
            await asyncio.to_thread(then, ex, job_id)
        final = await asyncio.to_thread(ex.recorder.final, job_id)
        await asyncio.sleep(0.05)  # the loop runs on: nothing it watched is left broken
        return final, threading.get_ident()

    return uvloop.run(main())


def test_a_warm_job_runs_to_its_end_on_the_event_loop(looped):
    warm(looped, LOGS, 1)
    final, loop_thread = follow(looped, "j", LOGS, 7, follow_s=30)
    assert final[0] == "succeeded" and final[2] == [21]
    assert looped.recorder.logs("j") == ["row 7"]
    rec = looped.recorder.threads
    assert rec[("started", "j")] == rec[("log", "j")] == rec[("succeeded", "j")] == loop_thread
    assert looped.recorder.holds >= 2  # the log line and the outcome, each under the core's locks
    assert looped.recorder.timings["j"]["start_ms"] == 0.0  # its idle worker, no start
    assert looped.warm_devices("default", "f", "v1") == [("0",)]  # pooled again, before the report


def test_busy_core_locks_hand_the_job_to_a_task_thread(looped):
    warm(looped, LOGS, 1)
    looped.recorder.grant = False
    final, loop_thread = follow(looped, "j", LOGS, 2, follow_s=30)
    assert final[0] == "succeeded" and final[2] == [6]
    assert looped.recorder.logs("j") == ["row 2"]  # nothing read on the loop is lost on the way
    assert looped.recorder.threads[("succeeded", "j")] != loop_thread


def test_a_job_past_the_loops_deadline_goes_on_in_a_task_thread_that_waits_for_it(looped):
    """Watching the pipe made it non-blocking: the task thread's reads must wait for the worker again, not take an
    empty read for its end (which killed a healthy worker and failed its job)."""
    warm(looped, NAP, 0)
    final, loop_thread = follow(looped, "slow", NAP, 0.4, follow_s=0.05)
    assert final[0] == "succeeded" and final[2] == [0.4], final
    assert looped.recorder.threads[("succeeded", "slow")] != loop_thread
    warm_again = looped.warm_devices("default", "f", "v1")
    assert warm_again == [("0",)]  # the same worker, pooled: it was never taken for dead


def test_a_cancel_while_the_loop_follows_lets_go_of_the_pipe_before_the_kill(looped):
    warm(looped, NAP, 0)
    pids: list[int] = []

    def cancel_once_running(ex: LocalExecutor, job_id: str) -> None:
        line = ex.recorder.wait_for(lambda c: c[0] == "log" and c[1] == job_id)
        pids.append(int(line[3][0].split()[1]))
        ex.cancel(job_id)
        deadline = time.monotonic() + 10
        while alive(pids[0]) and time.monotonic() < deadline:
            time.sleep(0.01)

    async def main() -> list[tuple]:
        inline = await launch_inline(looped, task("c", NAP, [{"x": 60}]))
        inline.follow_on_loop(time.monotonic() + 30)
        await asyncio.to_thread(cancel_once_running, looped, "c")
        await asyncio.sleep(0.2)
        return looped.recorder.of("c")

    calls = uvloop.run(main())
    assert pids and not alive(pids[0])
    assert [c[0] for c in calls] == ["started", "log"]  # cancelled: nothing more is reported
    looped.launch(task("after", NAP, [{"x": 0}]))  # its devices serve the next job
    assert looped.recorder.final("after")[0] == "succeeded"


def test_a_task_too_large_for_an_empty_pipe_goes_to_a_task_thread(looped):
    """The loop writes a task only when its line fits the idle worker's empty pipe (writing it then never waits)."""
    big = LOGS + "#" * (LOOP_ARTIFACT_BYTES + 1) + "\n"
    warm(looped, big, 1)
    final, loop_thread = follow(looped, "big", big, 5, follow_s=30)
    assert final[0] == "succeeded" and final[2] == [15]
    assert looped.recorder.threads[("started", "big")] != loop_thread
    assert looped.recorder.threads[("succeeded", "big")] != loop_thread


BIG_RESULT = """
def f(x):
    return list(range(x))
"""
CHATTY = """
import time
def f(x):
    for i in range(x):
        print("line", i, flush=True)
        time.sleep(0.003)  # a log event each
    return x
"""


def test_an_event_too_long_for_the_loop_is_read_and_reported_by_a_task_thread(looped):
    """A large JSON result's check and save take a while: not on the event loop."""
    warm(looped, BIG_RESULT, 1)
    final, loop_thread = follow(looped, "big", BIG_RESULT, 30_000, follow_s=30)  # ~200 KB of JSON
    assert final[0] == "succeeded" and final[2] == [list(range(30_000))]
    assert looped.recorder.threads[("succeeded", "big")] != loop_thread


def test_a_chatty_job_goes_on_in_a_task_thread_with_every_line_in_order(looped):
    warm(looped, CHATTY, 0)
    final, loop_thread = follow(looped, "chatty", CHATTY, 40, follow_s=30)
    assert final[0] == "succeeded" and final[2] == [40]
    assert looped.recorder.logs("chatty") == [f"line {i}" for i in range(40)]
    assert looped.recorder.threads[("succeeded", "chatty")] != loop_thread
