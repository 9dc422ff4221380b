"""LocalExecutor driven directly: real worker subprocesses, a recording callbacks object."""

from __future__ import annotations

import contextlib
import logging
import os
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from lancefn_jupyter.server.executors.base import TaskSpec
from lancefn_jupyter.server.executors.local import LocalExecutor
from lancefn_jupyter.server.policy.gpu_classes import simulated_default

FINAL = ("succeeded", "failed")


class Recorder:
    """ExecutorCallbacks that keeps every call in order and lets a test wait for one."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.timings: dict[str, dict | None] = {}  # job id → the timings its outcome came with
        self._cond = threading.Condition()

    def _add(self, *call) -> None:
        with self._cond:
            self.calls.append(call)
            self._cond.notify_all()

    def task_started(self, job_id, *, devices, node):
        self._add("started", job_id, devices)

    def task_progress(self, job_id, rows_done):
        self._add("progress", job_id, rows_done)

    def task_log(self, job_id, stream, lines, rows=None):
        self._add("log", job_id, stream, lines)

    def task_succeeded(self, job_id, results, *, timings=None):
        self.timings[job_id] = timings
        self._add("succeeded", job_id, results)

    def task_failed(self, job_id, failure, *, timings=None):
        self.timings[job_id] = timings
        self._add("failed", job_id, failure)

    def wait_for(self, predicate, timeout: float = 60.0) -> tuple:
        with self._cond:
            assert self._cond.wait_for(lambda: any(predicate(c) for c in self.calls), timeout), self.calls
            return next(c for c in self.calls if predicate(c))

    def final(self, job_id: str) -> tuple:
        return self.wait_for(lambda c: c[0] in FINAL and c[1] == job_id)

    def logs(self, job_id: str) -> list[str]:
        return [line for c in self.calls if c[0] == "log" and c[1] == job_id for line in c[3]]

    def of(self, job_id: str) -> list[tuple]:
        with self._cond:
            return [c for c in self.calls if c[1] == job_id]


def task(job_id: str, source: str, rows=({},), *, devices=("0",), simulated=False, env=None, timeout_s=None):
    return TaskSpec(
        job_id=job_id,
        name="f",
        version="v1",
        artifact=textwrap.dedent(source).encode(),
        entrypoint="f",
        rows=list(rows),
        devices=tuple(devices),
        simulated=simulated,
        gpu_class="default" if devices else None,
        num_gpus=len(devices),
        env=env or {},
        packages=(),
        timeout_s=timeout_s,
    )


def worker_children() -> dict[int, str]:
    """This process's child processes (zombies included) → state letter."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[1]) == os.getpid():
            children[int(stat.parent.name)] = fields[0]
    return children


def alive(pid: int) -> bool:
    return pid in worker_children()


PID = "import os\ndef f():\n    return os.getpid()\n"
WAIT = """
import os, time
def f():
    print("pid", os.getpid(), flush=True)
    time.sleep(60)
"""


@contextlib.contextmanager
def started_executor(recorder: Recorder) -> Iterator[LocalExecutor]:
    """A LocalExecutor reporting to ``recorder`` (also its ``recorder``); once it is shut down, no worker is left."""
    before = worker_children()
    ex = LocalExecutor(kill_grace_s=0.5)
    ex.start(recorder)
    ex.recorder = recorder
    try:
        yield ex
    finally:
        ex.shutdown()
    assert worker_children().keys() <= before.keys(), "worker processes (or zombies) left after shutdown"


@pytest.fixture
def executor():
    with started_executor(Recorder()) as ex:
        yield ex


def run(executor, spec: TaskSpec) -> tuple:
    executor.launch(spec)
    return executor.recorder.final(spec.job_id)


ENV = """
import os
def f():
    return [os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "NUMBA_ENABLE_CUDASIM", "MY_VAR", "LANCEFN_API_KEY")]
"""


@pytest.mark.parametrize(
    ("devices", "simulated", "expected"),
    [
        (("2", "3"), False, ["2,3", None, "x", None]),
        (("sim1",), True, ["", "1", "x", None]),
        ((), False, ["", None, "x", None]),  # a CPU function sees no GPU at all
    ],
)
def test_worker_sees_exactly_its_devices_and_the_function_env(executor, monkeypatch, devices, simulated, expected):
    monkeypatch.setenv("LANCEFN_API_KEY", "secret")  # the server's key must not leak to user code
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")  # nor the server's own simulator setting
    env = {"MY_VAR": "x", "CUDA_VISIBLE_DEVICES": "0,1,2,3", "NUMBA_ENABLE_CUDASIM": "1"}  # can't widen devices
    spec = task("env", ENV, devices=devices, simulated=simulated, env=env)
    if not simulated:
        expected[1] = None
    assert run(executor, spec) == ("succeeded", "env", [expected])
    calls = executor.recorder.of("env")
    assert calls[0] == ("started", "env", devices)
    assert ("progress", "env", 1) not in calls  # the last row's count rides on the result


def test_warm_worker_is_reused_for_the_same_device_set(executor):
    first = run(executor, task("a", PID, devices=("sim0",), simulated=True))[2][0]
    second = run(executor, task("b", PID, devices=("sim0",), simulated=True))[2][0]
    other = run(executor, task("c", PID, devices=("sim1",), simulated=True))[2][0]
    assert first == second
    assert other != first
    assert alive(first) and alive(other)  # both stay warm


def test_idle_worker_sharing_devices_is_stopped_before_a_task_runs(executor):
    single = run(executor, task("a", PID, devices=("0",)))[2][0]
    pair = run(executor, task("b", PID, devices=("0", "1")))[2][0]
    assert pair != single
    assert not alive(single)  # its CUDA context would otherwise stay on GPU 0


def test_a_raising_function_fails_in_run_and_keeps_the_worker(executor):
    pid = run(executor, task("a", PID))[2][0]
    source = "def f(x):\n    print('x is', x)\n    raise ValueError(f'bad {x}')\n"
    kind, _, failure = run(executor, task("b", source, rows=[{"x": 7}]))
    assert kind == "failed"
    assert (failure.phase, failure.message, failure.retryable) == ("run", "ValueError: bad 7", False)
    assert 'File "<gpu_function f@v1>", line 3, in f' in failure.traceback
    assert executor.recorder.logs("b") == ["x is 7"]
    assert run(executor, task("c", PID))[2][0] == pid


@pytest.mark.parametrize(
    ("crash", "expected"),
    [
        ("os._exit(1)", "worker process exited with code 1"),
        ("os.kill(os.getpid(), signal.SIGSEGV)", "worker process was killed by signal SIGSEGV"),
        ("os.kill(os.getpid(), signal.SIGKILL)", "worker process was killed by signal SIGKILL"),
    ],
)
def test_worker_death_fails_in_worker_phase_and_is_replaced(executor, tmp_path, crash, expected):
    pid = run(executor, task("a", PID))[2][0]
    go = tmp_path / "go"
    source = f"""
    import os, signal, time
    def f():
        print("about to crash", flush=True)
        while not os.path.exists({str(go)!r}):  # crash only once the test has seen the print
            time.sleep(0.01)
        {crash}
    """
    executor.launch(task("b", source))
    executor.recorder.wait_for(lambda c: c[0] == "log" and c[1] == "b")
    go.touch()
    kind, _, failure = executor.recorder.final("b")
    assert kind == "failed"
    assert failure.phase == "worker" and failure.retryable is False
    assert failure.message.startswith(expected)
    assert executor.recorder.logs("b") == ["about to crash"]
    assert not alive(pid)  # reaped, not a zombie
    assert run(executor, task("c", PID))[2][0] != pid


def test_timeout_kills_the_worker_and_fails_in_timeout(executor):
    kind, _, failure = run(executor, task("t", WAIT, timeout_s=0.5))
    assert kind == "failed" and failure.phase == "timeout"
    assert "timeout of 0.5 s" in failure.message
    pid = int(executor.recorder.logs("t")[0].split()[1])
    assert not alive(pid)
    assert run(executor, task("next", PID))[2][0] != pid


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_cancel_kills_the_worker_and_reports_nothing_more(executor, ignores_sigterm):
    source = ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else "") + WAIT
    executor.launch(task("c", source))
    executor.recorder.wait_for(lambda c: c[0] == "log" and c[1] == "c")
    pid = int(executor.recorder.logs("c")[0].split()[1])
    executor.cancel("c")
    # The next task on the same device waits until the cancelled worker is reaped (SIGKILL after
    # the grace period when SIGTERM is ignored).
    assert run(executor, task("after", PID))[2][0] != pid
    assert not alive(pid)
    assert [c[0] for c in executor.recorder.of("c")] == ["started", "log"]


def test_shutdown_stops_busy_idle_and_prewarmed_workers():
    before = worker_children()
    recorder = Recorder()
    ex = LocalExecutor(simulated_default(), kill_grace_s=0.5)  # pre-starts one worker per device
    ex.start(recorder)
    ex.launch(task("idle", PID, devices=("sim0",), simulated=True))
    recorder.final("idle")
    ex.launch(task("busy", WAIT, devices=("sim1",), simulated=True))
    recorder.wait_for(lambda c: c[0] == "log" and c[1] == "busy")
    assert len(worker_children().keys() - before.keys()) >= 2
    ex.shutdown()
    assert worker_children().keys() <= before.keys()
    assert [c[0] for c in recorder.of("busy")] == ["started", "log"]  # a shutdown is not a job failure


# ----------------------------------------------------------------- warm state (ARCHITECTURE.md, "Warm state")


def counting(log: Path) -> str:
    """A version whose module appends a line to ``log`` each time it is executed."""
    return f"import os\nwith open({str(log)!r}, 'a') as out:\n    out.write('x\\n')\ndef f():\n    return os.getpid()\n"


def test_a_warm_worker_keeps_its_module_and_reports_timings(executor, tmp_path):
    log = tmp_path / "log"
    pids = [run(executor, task(f"j{i}", counting(log)))[2][0] for i in range(4)]
    assert len(set(pids)) == 1
    assert log.read_text().count("x") == 1  # executed by the first job only
    first, *later = (executor.recorder.timings[f"j{i}"] for i in range(4))
    assert first["start_ms"] > 0 and first["setup_ms"] > 0 and first["run_ms"] >= 0
    assert all(t["start_ms"] == 0 and t["setup_ms"] == 0 and t["run_ms"] >= 0 for t in later)


def test_per_job_state_executes_the_module_for_every_job(executor, tmp_path):
    log = tmp_path / "log"
    for i in range(3):
        executor.launch(replace(task(f"j{i}", counting(log)), state="per_job"))
        assert executor.recorder.final(f"j{i}")[0] == "succeeded"
    assert log.read_text().count("x") == 3


def test_a_worker_whose_setup_failed_is_not_reused(executor):
    pid = run(executor, task("a", PID))[2][0]
    source = "import os\nwith open('/proc/self/stat') as stat:\n    print(stat.read().split()[0], flush=True)\nraise RuntimeError('no weights')\ndef f():\n    pass\n"
    kind, _, failure = run(executor, task("b", source))
    assert kind == "failed" and failure.phase == "setup"
    assert failure.message == "RuntimeError: no weights (at <gpu_function f@v1>:4)"
    assert int(executor.recorder.logs("b")[0]) == pid  # it ran on the warm worker …
    assert run(executor, task("c", PID))[2][0] != pid
    assert not alive(pid)  # stopped before the next job on its devices started


LEAK = "import os\nHELD = []\ndef f():\n    HELD.append(b'x' * (50 << 20))\n    return os.getpid()\n"


def test_a_worker_over_the_memory_limit_is_retired(caplog):
    caplog.set_level(logging.INFO, logger="lancefn.server")
    recorder = Recorder()
    ex = LocalExecutor(kill_grace_s=0.5, worker_max_rss_mb=100)
    ex.start(recorder)
    try:
        pids = []
        for i in range(3):
            ex.launch(task(f"j{i}", LEAK, devices=()))
            pids.append(recorder.final(f"j{i}")[2][0])
        assert pids[0] == pids[1] != pids[2]  # ~80 MB after the first job, ~130 MB after the second
        assert not alive(pids[1])
        assert any("exceeds the worker limit of 100 MB" in record.getMessage() for record in caplog.records)
    finally:
        ex.shutdown()


def test_warm_devices_lists_the_idle_workers_holding_a_version(executor):
    assert executor.warm_devices("default", "f", "v1") == []
    run(executor, task("a", PID, devices=("sim1",), simulated=True))
    assert executor.warm_devices("default", "f", "v1") == [("sim1",)]
    assert executor.warm_devices("default", "f", "v2") == [] == executor.warm_devices("team", "f", "v1")


def test_shutdown_runs_the_class_entry_teardown(tmp_path):
    marks = tmp_path / "marks"
    source = f"""
    class f:
        def setup(self):
            self.n = 0
        def __call__(self):
            self.n += 1
            return self.n
        def teardown(self):
            open({str(marks)!r}, "w").write(f"torn down after {{self.n}}")
    """
    recorder = Recorder()
    ex = LocalExecutor(kill_grace_s=0.5)
    ex.start(recorder)
    try:
        for i in range(2):
            ex.launch(task(f"j{i}", source))
            assert recorder.final(f"j{i}")[2] == [i + 1]
    finally:
        ex.shutdown()
    assert marks.read_text() == "torn down after 2"
