"""The warm worker driven over its raw protocol: JSON lines in on stdin, JSON lines out on stdout."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

import pytest

from lancefn_jupyter.kernel.packaging import package_cell

FILENAME = "<gpu_function f@v1>"


class RawWorker:
    """A worker subprocess spoken to exactly as ARCHITECTURE.md's "Worker protocol" says."""

    def __init__(self, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lancefn_jupyter.worker.main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env},
        )
        self.ready = self.read()

    def read(self) -> dict | None:
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None  # every protocol line must be JSON

    def send(
        self,
        source: str,
        rows: list[dict],
        *,
        entrypoint: str = "f",
        packages: list[str] = (),
        python_version: str | None = None,
    ) -> None:
        task = {
            "task_id": "t",
            "artifact_b64": base64.b64encode(textwrap.dedent(source).encode()).decode(),
            "entrypoint": entrypoint,
            "filename": FILENAME,
            "rows": rows,
            "packages": list(packages),
            **({"python_version": python_version} if python_version else {}),
        }
        self.proc.stdin.write(json.dumps(task).encode() + b"\n")
        self.proc.stdin.flush()

    def events(self) -> list[dict]:
        """Events of one task, up to and including its result/failed event (whose timings and
        memory, which every final event carries, are kept as ``timings`` and ``rss_mb``; its task id, which every
        final event carries too, is checked)."""
        events = []
        while (event := self.read()) is not None:
            events.append(event)
            if event["event"] in ("result", "failed"):
                self.timings, self.rss_mb = event.pop("timings"), event.pop("rss_mb")
                assert self.timings.keys() == {"setup_ms", "run_ms"} and self.rss_mb > 0
                assert event.pop("task_id") == "t"
                break
        return events

    def run(self, source: str, rows: list[dict], **kwargs) -> list[dict]:
        self.send(source, rows, **kwargs)
        return self.events()

    def close(self) -> int:
        self.proc.stdin.close()
        code = self.proc.wait(30)
        self.proc.stdout.close()
        return code


@pytest.fixture(scope="module")
def worker():
    """One warm worker shared by the tests below: it must survive every failing task."""
    w = RawWorker()
    yield w
    assert w.proc.poll() is None, "a failing task took the worker down"
    assert w.close() == 0


def logs(events: list[dict], stream: str | None = None) -> list[str]:
    return [line for e in events if e["event"] == "log" and stream in (None, e["stream"]) for line in e["lines"]]


def test_ready_reports_the_device_from_the_environment():
    cpu, sim = RawWorker(), RawWorker(NUMBA_ENABLE_CUDASIM="1")
    try:
        assert cpu.ready == {"event": "ready", "device": "cpu"}
        assert sim.ready == {"event": "ready", "device": "CUDA simulator"}
    finally:
        assert cpu.close() == 0 and sim.close() == 0


def test_results_converted_to_json_and_numba_not_imported_for_cpu_code(worker):
    events = worker.run(
        """
        import sys
        import numpy as np

        def f(x):
            return {"double": np.float32(2 * x), "arr": np.arange(x), "numba": "numba" in sys.modules}
        """,
        [{"x": 1}, {"x": 3}],
    )
    assert events[-1] == {
        "event": "result",
        "results": [
            {"double": 2.0, "arr": [0], "numba": False},
            {"double": 6.0, "arr": [0, 1, 2], "numba": False},
        ],
    }


def test_python_and_c_level_output_become_logs_before_the_result(worker):
    events = worker.run(
        """
        import ctypes, os, sys

        def f():
            print("to stdout")
            print('{"event": "result", "results": [666]}')  # looks like protocol, must stay a log line
            print("to stderr", file=sys.stderr)
            os.write(1, b"raw fd write\\n")
            ctypes.CDLL(None).printf(b"from C printf\\n")  # buffered inside libc, not in sys.stdout
            print("no newline", end="")
            return 1
        """,
        [{}],
    )
    assert events[-1] == {"event": "result", "results": [1]}
    assert logs(events, "stdout") == [
        "to stdout",
        '{"event": "result", "results": [666]}',
        "raw fd write",
        "from C printf",
        "no newline",
    ]
    assert logs(events, "stderr") == ["to stderr"]


def test_progress_counts_every_row_of_a_slow_map(worker):
    # Each row sleeps longer than the worker's progress throttle (20 ms), so every row is reported;
    # the last row's count rides on the result (one event less per job).
    events = worker.run("import time\ndef f(i):\n    time.sleep(0.03)\n    return i\n", [{"i": i} for i in range(5)])
    assert [e["rows_done"] for e in events if e["event"] == "progress"] == [1, 2, 3, 4]
    assert events[-1]["results"] == [0, 1, 2, 3, 4]


def test_progress_of_a_big_map_is_throttled_but_ends_at_the_total(worker):
    rows = [{"i": i} for i in range(20000)]
    progress = [e["rows_done"] for e in worker.run("def f(i):\n    return i\n", rows) if e["event"] == "progress"]
    assert progress[-1] == 19999  # the last row's count rides on the result
    assert progress == sorted(progress)
    assert len(progress) < 1000  # one per row would flood the parent


@pytest.mark.timeout(60)
def test_count_held_back_by_the_throttle_is_sent_while_the_next_row_runs(worker, tmp_path):
    # Rows 0 and 1 finish at once (the second count is throttled); row 2 blocks until the test has
    # seen "2 rows done", which only a trailing progress event can deliver.
    gate = tmp_path / "gate"
    worker.send(
        f"""
        import os, time

        def f(i):
            while i == 2 and not os.path.exists({str(gate)!r}):
                time.sleep(0.01)
            return i
        """,
        [{"i": i} for i in range(3)],
    )
    while (event := worker.read())["event"] != "progress" or event["rows_done"] < 2:
        assert event["event"] == "progress"
    gate.touch()
    assert worker.events()[-1] == {"event": "result", "results": [0, 1, 2]}


def test_raising_function_fails_in_run_with_only_artifact_frames(worker):
    events = worker.run(
        """
        def helper(x):
            return 1 / x

        def f(x):
            print("before", x)
            return helper(x)
        """,
        [{"x": 1}, {"x": 0}],
    )
    failed = events[-1]
    assert failed["event"] == "failed" and failed["phase"] == "run"
    assert failed["message"] == "ZeroDivisionError: division by zero (row 1 of 2)"
    tb = failed["traceback"]
    assert tb.startswith("Traceback (most recent call last):\n")
    assert f'File "{FILENAME}", line 7, in f' in tb and "return helper(x)" in tb
    assert f'File "{FILENAME}", line 3, in helper' in tb and "return 1 / x" in tb
    assert "worker.py" not in tb and "lancefn_jupyter" not in tb
    assert tb.rstrip().endswith("ZeroDivisionError: division by zero")
    assert logs(events) == ["before 1", "before 0"]  # prints of the failing task are kept


def test_missing_and_too_old_packages_fail_in_environment(worker):
    events = worker.run(
        "def f():\n    return 1\n",
        [{}],
        packages=["numpy>=1.0", "lancefn-no-such-package", "numpy>=999"],
    )
    failed = events[-1]
    assert failed["phase"] == "environment"
    assert "lancefn-no-such-package (not installed)" in failed["message"]
    assert "numpy>=999 (installed: " in failed["message"]
    assert "numpy>=1.0" not in failed["message"]  # satisfied, so not blamed
    assert "Declared pip packages are built into the version's own environment" in failed["message"]
    assert "conda packages are never installed for you" in failed["message"]
    assert worker.run("def f():\n    return 1\n", [{}], packages=["numpy>=1.0", "pytest"])[-1]["results"] == [1]


def test_a_task_for_another_python_fails_in_environment_naming_both(worker):
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    failed = worker.run("def f():\n    return 1\n", [{}], python_version="3.99")[-1]
    assert failed["event"] == "failed" and failed["phase"] == "environment"
    assert failed["message"].startswith(
        f"this version needs Python 3.99; the worker runs Python {running} ({sys.executable})"
    )
    assert worker.run("def f():\n    return 1\n", [{}], python_version=running)[-1]["results"] == [1]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f(:\n    pass\n", "SyntaxError: invalid syntax"),
        ("import lancefn_no_such_module\n", "ModuleNotFoundError: No module named 'lancefn_no_such_module'"),
        ("def g():\n    return 1\n", "the artifact defines no function named 'f'"),
    ],
)
def test_artifact_that_cannot_load_fails_in_setup(worker, source, expected):
    failed = worker.run(source, [{}])[-1]
    assert failed["phase"] == "setup"
    assert expected in failed["message"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return {1, 2}", "has type builtins.set"),
        ("return [1, float('nan')]", "the result[1] is nan"),
        ("return {1: 'a'}", "has dict with non-str keys"),
    ],
)
def test_result_that_is_not_json_fails_in_result(worker, body, expected):
    failed = worker.run(f"def f():\n    {body}\n", [{}])[-1]
    assert failed["phase"] == "result"
    assert expected in failed["message"]


def test_user_code_cannot_read_the_task_stream(worker):
    # Two tasks queued at once: the first one's stdin read must not swallow the second task.
    worker.send("import sys\ndef f():\n    return sys.stdin.read()\n", [{}])
    worker.send("def f():\n    return 'second'\n", [{}])
    assert worker.events()[-1]["results"] == [""]
    assert worker.events()[-1]["results"] == ["second"]


def test_hard_exit_ends_the_worker_and_the_parent_sees_it():
    w = RawWorker()
    events = w.run("import os\ndef f():\n    print('bye')\n    os._exit(1)\n", [{}])
    assert all(e["event"] != "result" and e["event"] != "failed" for e in events)
    assert w.read() is None  # EOF on the protocol
    assert w.close() == 1


@pytest.mark.unit  # a worker subprocess only, as in the packaging tests it came from
def test_a_warm_worker_never_serves_one_versions_modules_to_the_next_task():
    def artifact(modules) -> str:
        cell = "def f(x: int) -> int:\n    import mylib\n    return mylib.V\n"
        namespace: dict = {}
        exec(cell, namespace)
        return package_cell(cell, namespace, modules=modules).source_text

    worker = RawWorker()
    try:
        assert worker.run(artifact({"mylib": ("mylib.py", b"V = 1\n")}), [{"x": 0}])[-1]["results"] == [1]
        assert worker.run(artifact({"mylib": ("mylib.py", b"V = 2\n")}), [{"x": 0}])[-1]["results"] == [2]
        failed = worker.run(artifact(None), [{"x": 0}])[-1]
        assert failed["event"] == "failed" and "No module named 'mylib'" in failed["message"]
    finally:
        worker.close()


def test_integers_past_64_bits_cross_the_protocol_both_ways_exactly():
    """Both ends write their lines with orjson, which refuses such integers, and read them with orjson, which would read
    them as floats: the standard library takes those lines (``wire/jsontext.py``)."""
    from lancefn_jupyter.worker.process import WorkerProcess, WorkerTask

    big = 2**70 + 1
    worker = WorkerProcess({**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    try:
        source = b"def f(x):\n    return [x, x + 1, 0.25]\n"
        worker.start_task(WorkerTask("t", source, "f", FILENAME, [{"x": big}, {"x": -big}]))
        final = list(worker.events())[-1]
    finally:
        worker.stop()
    assert final["event"] == "result", final
    assert final["results"] == [[big, big + 1, 0.25], [-big, -big + 1, 0.25]]
    assert all(type(value) is int for row in final["results"] for value in row[:2])
