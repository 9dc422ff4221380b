"""The bridge's getter threads (``bridge._Getters``): a job's call is waited for with ``ray.get`` on an idle getter and
reported with its result or its error; with every getter waiting for a long call, the next call gets a future's
callback instead, so a quick job never waits behind long ones. A stand-in for Ray's ``get`` and object refs."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from lancefn_jupyter.server.executors.ray import bridge

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Ref:
    """An object ref whose call ends when told (with a value or an error)."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None
        self.callback = Future()

    def end(self, value: object = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error
        self.ended.set()
        if error is not None:
            self.callback.set_exception(error)
        else:
            self.callback.set_result(value)

    def future(self) -> Future:
        return self.callback


class FakeRay:
    def __init__(self) -> None:
        self.getting: list[Ref] = []  # the refs a getter waits for with get

    def get(self, ref: Ref) -> object:
        self.getting.append(ref)
        ref.ended.wait(20)
        if ref.error is not None:
            raise ref.error
        return ref.value


class Reports:
    def __init__(self) -> None:
        self.done: dict[str, tuple[str, object]] = {}
        self.threads: dict[str, str] = {}
        self.arrived = threading.Condition()

    def __call__(self, job_id: str, future: Future) -> None:
        try:
            outcome = ("value", future.result())
        except Exception as error:
            outcome = ("error", str(error))
        with self.arrived:
            self.done[job_id] = outcome
            self.threads[job_id] = threading.current_thread().name
            self.arrived.notify_all()

    def wait(self, job_id: str) -> tuple[str, object]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: job_id in self.done, 10), job_id
            return self.done[job_id]


def test_calls_are_waited_for_on_getters_and_reported_with_their_value_or_error():
    ray, reports = FakeRay(), Reports()
    getters = bridge._Getters(ray, reports)
    ok, failed = Ref(), Ref()
    getters.watch("ok", ok)
    getters.watch("failed", failed)
    ok.end({"final": {"event": "result"}})
    failed.end(error=RuntimeError("the actor died"))
    assert reports.wait("ok") == ("value", {"final": {"event": "result"}})
    assert reports.wait("failed") == ("error", "the actor died")
    assert set(ray.getting) == {ok, failed}  # waited for with get, on getters
    assert reports.threads["ok"] == reports.threads["failed"] == "lancefn-ray-get"


def test_with_every_getter_waiting_for_a_long_call_the_next_gets_a_callback_and_a_freed_getter_is_reused():
    ray, reports = FakeRay(), Reports()
    getters = bridge._Getters(ray, reports)
    long_calls = [Ref() for _ in range(bridge._GETTERS)]
    for index, ref in enumerate(long_calls):
        getters.watch(f"long-{index}", ref)
    quick = Ref()
    getters.watch("quick", quick)
    quick.end(7)
    assert reports.wait("quick") == ("value", 7)  # not behind the long calls
    assert quick not in ray.getting and reports.threads["quick"] != "lancefn-ray-get"
    long_calls[0].end(1)
    assert reports.wait("long-0") == ("value", 1)
    after = Ref()
    getters.watch("after", after)  # on the getter that long-0 freed: no fifth thread
    after.end(2)
    assert reports.wait("after") == ("value", 2)
    assert after in ray.getting
    assert getters._count == bridge._GETTERS
    for ref in long_calls[1:]:
        ref.end(0)
