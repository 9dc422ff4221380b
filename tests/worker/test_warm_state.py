"""Warm state in a real worker process (docs/ARCHITECTURE.md, "Warm state"): the module runs once per
worker, class entries are set up once and torn down when the worker ends."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time

import pytest

from lancefn_jupyter.worker.process import WorkerProcess, WorkerTask

FILENAME = "<gpu_function f@v1>"


def _env() -> dict[str, str]:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _task(source: str, rows: list[dict], *, state: str = "per_worker", entrypoint: str = "f") -> WorkerTask:
    return WorkerTask("t", textwrap.dedent(source).encode(), entrypoint, FILENAME, rows, state=state)


def _run(worker: WorkerProcess, task: WorkerTask) -> dict:
    worker.start_task(task)
    final = None
    for event in worker.events():
        final = event
    assert final is not None and final["event"] in ("result", "failed")
    return final


@pytest.fixture
def worker():
    w = WorkerProcess(_env())
    yield w
    w.kill()


def counting_module(log) -> str:
    """A module that appends a line to ``log`` each time it is executed."""
    return f"""
        with open({str(log)!r}, "a") as out:
            out.write("executed\\n")

        def f(x):
            return x + 1
        """


def executions(log) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_version_is_executed_once_per_worker_and_later_tasks_reuse_it(worker, tmp_path):
    log = tmp_path / "log"
    finals = [_run(worker, _task(counting_module(log), [{"x": i}])) for i in range(4)]
    assert [final["results"] for final in finals] == [[1], [2], [3], [4]]
    assert executions(log) == 1
    assert finals[0]["timings"]["setup_ms"] > 0
    assert all(final["timings"]["setup_ms"] == 0 for final in finals[1:])
    assert all(final["timings"]["run_ms"] >= 0 and final["rss_mb"] > 0 for final in finals)


def test_per_job_executes_the_module_for_every_task(worker, tmp_path):
    log = tmp_path / "log"
    finals = [_run(worker, _task(counting_module(log), [{"x": 1}], state="per_job")) for _ in range(3)]
    assert [final["results"] for final in finals] == [[2]] * 3
    assert executions(log) == 3
    assert all(final["timings"]["setup_ms"] > 0 for final in finals)


def test_module_globals_live_on_between_tasks(worker):
    source = "calls = []\ndef f():\n    calls.append(1)\n    return len(calls)\n"
    assert [_run(worker, _task(source, [{}]))["results"] for _ in range(3)] == [[1], [2], [3]]


def test_another_version_replaces_the_held_one(worker, tmp_path):
    log = tmp_path / "log"
    assert _run(worker, _task(counting_module(log), [{"x": 1}]))["results"] == [2]
    assert _run(worker, _task("def f(x):\n    return -x\n", [{"x": 1}]))["results"] == [-1]
    assert _run(worker, _task(counting_module(log), [{"x": 1}]))["results"] == [2]
    assert executions(log) == 2


def class_entry(marks) -> str:
    """A class entry that records setup, calls and teardown as lines of ``marks``."""
    return f"""
        def mark(what):
            with open({str(marks)!r}, "a") as out:
                out.write(what + "\\n")

        class f:
            def __init__(self):
                self.scale = 0

            def setup(self):
                mark("setup")
                self.scale = 10

            def __call__(self, x: int) -> int:
                return self.scale * x

            def teardown(self):
                mark("teardown")
        """


def test_class_entry_is_set_up_once_and_torn_down_when_the_worker_stops(tmp_path):
    marks = tmp_path / "marks"
    worker = WorkerProcess(_env())
    try:
        assert _run(worker, _task(class_entry(marks), [{"x": 1}, {"x": 2}]))["results"] == [10, 20]
        assert _run(worker, _task(class_entry(marks), [{"x": 3}]))["results"] == [30]
        assert marks.read_text().splitlines() == ["setup"]
    finally:
        worker.stop()
    assert worker.process.returncode == 0
    assert marks.read_text().splitlines() == ["setup", "teardown"]


def test_class_entry_is_torn_down_on_sigterm(tmp_path):
    marks = tmp_path / "marks"
    worker = WorkerProcess(_env())
    try:
        assert _run(worker, _task(class_entry(marks), [{"x": 1}]))["results"] == [10]
        os.killpg(worker.pid, signal.SIGTERM)
        assert worker.process.wait(10) == 128 + signal.SIGTERM
    finally:
        worker.kill()
    assert marks.read_text().splitlines() == ["setup", "teardown"]


def test_class_entry_torn_down_while_a_task_runs_when_killed(tmp_path):
    marks = tmp_path / "marks"
    source = class_entry(marks) + "\n        import time\n        def g():\n            time.sleep(60)\n"
    worker = WorkerProcess(_env())
    try:
        assert _run(worker, _task(source, [{"x": 1}]))["results"] == [10]
        worker.start_task(_task(source.replace("return self.scale * x", "time.sleep(60)"), [{"x": 1}]))
        time.sleep(0.5)  # the other version's setup ran, it sleeps in its row
        worker.kill()  # cancel: SIGTERM, then SIGKILL after the grace
    finally:
        worker.kill()
    assert marks.read_text().splitlines() == ["setup", "teardown", "setup", "teardown"]


def test_per_job_class_entry_is_torn_down_after_each_task(worker, tmp_path):
    marks = tmp_path / "marks"
    for _ in range(2):
        assert _run(worker, _task(class_entry(marks), [{"x": 1}], state="per_job"))["results"] == [10]
    assert marks.read_text().splitlines() == ["setup", "teardown"] * 2


def test_teardown_errors_are_printed_never_raised(tmp_path):
    source = "class f:\n    def __call__(self):\n        return 1\n    def teardown(self):\n        raise RuntimeError('boom')\n"
    worker = WorkerProcess(_env())
    try:
        assert _run(worker, _task(source, [{}]))["results"] == [1]
        logs = []
        worker.start_task(_task("def f():\n    return 2\n", [{}]))
        for event in worker.events():
            if event["event"] == "log":
                logs += event["lines"]
            final = event
        assert final["results"] == [2]
        assert any("RuntimeError: boom" in line for line in logs)
    finally:
        worker.stop()
    assert worker.process.returncode == 0


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import os\n\nraise ValueError('no model')\ndef f():\n    pass\n",
            "ValueError: no model (at <gpu_function f@v1>:3)",
        ),
        (
            "class f:\n    def setup(self):\n        self.model = load()\n    def __call__(self):\n        pass\n",
            "NameError: name 'load' is not defined (at <gpu_function f@v1>:3)",
        ),
        ("x = 1\ndef f(:\n    pass\n", "line 2) (at <gpu_function f@v1>:2)"),
        (
            "import lancefn_no_such_module\n",
            "declare the package: pip=lancefn_no_such_module (the version's environment then has it)"
            " (at <gpu_function f@v1>:1)",
        ),
    ],
)
def test_failures_while_loading_are_phase_setup_with_the_artifact_line(worker, source, message):
    final = _run(worker, _task(source, [{}]))
    assert final["event"] == "failed" and final["phase"] == "setup"
    assert final["message"].endswith(message)
    assert final["timings"]["setup_ms"] > 0 and final["timings"]["run_ms"] == 0


def test_a_failed_setup_is_tried_again_by_the_next_task(worker, tmp_path):
    flag = tmp_path / "ready"
    source = (
        f"import os\nif not os.path.exists({str(flag)!r}):\n    raise RuntimeError('not yet')\ndef f():\n    return 1\n"
    )
    assert _run(worker, _task(source, [{}]))["phase"] == "setup"
    flag.touch()
    assert _run(worker, _task(source, [{}]))["results"] == [1]


def test_a_worker_exits_at_once_on_stop_despite_a_thread_user_code_left_running():
    source = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\ndef f():\n    return 1\n"
    worker = WorkerProcess(_env())
    assert _run(worker, _task(source, [{}]))["results"] == [1]
    started = time.monotonic()
    worker.stop()
    assert worker.process.returncode == 0 and time.monotonic() - started < 2.0


def test_shipped_local_modules_stay_importable_for_the_workers_life(worker):
    """A notebook module the entry imports lazily (at call time) is still served on later tasks, and goes
    with the version: another version cannot import it."""
    ship = "__import__('lancefn_jupyter.local_modules', fromlist=['install']).install({'nb_helper_24': ('nb_helper_24.py', b'VALUE = 7\\n')})\n"
    source = ship + "def f(x):\n    import nb_helper_24\n    return x * nb_helper_24.VALUE\n"
    assert [_run(worker, _task(source, [{"x": i}]))["results"] for i in (1, 2, 3)] == [[7], [14], [21]]
    other = "def f(x):\n    import nb_helper_24\n    return 0\n"
    failed = _run(worker, WorkerTask("t", other.encode(), "f", "<gpu_function g@v2>", [{"x": 1}]))
    assert failed["event"] == "failed" and "nb_helper_24" in failed["message"]


def _bundle(files: dict[str, str]) -> WorkerTask:
    """A task of LanceDB's ``python_bundle`` of ``files`` beside its entry ``f``, which uses package ``lfb_shared``."""
    entry = "import lfb_shared\n\n\ndef f(x):\n    import lfb_shared.deep\n    return x * lfb_shared.K + lfb_shared.deep.D\n"
    artifact = json.dumps({"files": {"user_function.py": entry, **files}}).encode()
    return WorkerTask("t", artifact, "f", FILENAME, [{"x": 2}])


def test_a_bundles_modules_serve_its_version_only(worker):
    """A bundle's modules are imported from its own directory on sys.path ("LanceDB 0.40 dialect"): another bundle
    on the same warm worker imports its own, and a version without them cannot import them."""
    first = {"lfb_shared/__init__.py": "K = 3\n", "lfb_shared/deep.py": "D = 1\n"}
    assert [_run(worker, _bundle(first))["results"] for _ in range(2)] == [[7], [7]]
    assert _run(worker, _bundle({**first, "lfb_shared/__init__.py": "K = 10\n"}))["results"] == [21]
    failed = _run(worker, _task("def f(x):\n    import lfb_shared\n    return 0\n", [{"x": 1}]))
    assert failed["event"] == "failed" and "No module named 'lfb_shared'" in failed["message"]


def test_a_bundle_path_leaving_it_fails_in_setup_with_nothing_written(worker, tmp_path):
    escape = f"{'../' * 8}{str(tmp_path).lstrip('/')}/lfb_escape.py"
    failed = _run(worker, _bundle({"lfb_shared/__init__.py": "K = 1\n", escape: "X = 1\n"}))
    assert failed["event"] == "failed" and failed["phase"] == "setup"
    assert "must not contain '..'" in failed["message"]
    assert not (tmp_path / "lfb_escape.py").exists()
