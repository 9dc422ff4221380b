"""`.local()` fallback: a numba CUDA cell run in a local worker (the simulator on a GPU-less machine)."""

from __future__ import annotations

import os

import pytest
from helpers import CUDA_CELL

from lancefn_jupyter.kernel.handles.local_run import LocalRunError, gpu_available, run_local

pytestmark = pytest.mark.unit

FILENAME = "<gpu_function double_all@v1>"


def test_cuda_cell_runs_on_the_simulator_when_there_is_no_gpu():
    values = [float(i) / 4 for i in range(200)]  # 200 simulated threads: correct and quick
    run = run_local(CUDA_CELL, "double_all", FILENAME, [{"values": [1.0, 2.5]}, {"values": values}], mode="auto")
    assert run.results == [[2.0, 5.0], [2 * v for v in values]]
    assert run.device == ("CUDA simulator" if not gpu_available() else run.device)
    assert run.device != "cpu"
    assert run.logs == ["doubled 2 values", "doubled 200 values"]


def test_warm_worker_is_reused_and_env_reaches_the_function():
    source = b"import os\ndef f():\n    return [os.getpid(), os.environ.get('MY_VAR'), os.environ.get('NUMBA_ENABLE_CUDASIM')]\n"
    first = run_local(source, "f", FILENAME, [{}], mode="simulator", env={"MY_VAR": "a"}).results[0]
    second = run_local(source, "f", FILENAME, [{}], mode="simulator", env={"MY_VAR": "a"}).results[0]
    other_env = run_local(source, "f", FILENAME, [{}], mode="simulator", env={"MY_VAR": "b"}).results[0]
    assert first == second and first[1:] == ["a", "1"]
    assert other_env[0] != first[0] and other_env[1] == "b"  # env is fixed at process start
    assert first[0] != os.getpid()


def test_kernel_error_raises_with_the_users_frames_only():
    bad = CUDA_CELL.replace(
        b"out[i] = 2 * x[i]", b"out[i] = 2 * x[i]\n        if x[i] < 0:\n            raise ValueError('negative')"
    )
    with pytest.raises(LocalRunError) as info:
        run_local(bad, "double_all", FILENAME, [{"values": [1.0, -1.0]}], mode="simulator")
    error = info.value
    assert error.phase == "run" and "negative" in error.message
    assert f'File "{FILENAME}", line 20, in double_all' in error.traceback
    assert f'File "{FILENAME}", line 12, in _double' in error.traceback
    assert "numba" not in error.traceback and "worker.py" not in error.traceback


def test_timeout_and_crash_raise_and_the_next_run_still_works():
    with pytest.raises(LocalRunError) as timeout:
        run_local(b"import time\ndef f():\n    time.sleep(60)\n", "f", FILENAME, [{}], mode="simulator", timeout_s=0.5)
    assert timeout.value.phase == "timeout"
    with pytest.raises(LocalRunError) as crash:
        run_local(b"import os\ndef f():\n    os._exit(3)\n", "f", FILENAME, [{}], mode="simulator")
    assert (crash.value.phase, crash.value.message) == ("worker", "worker process exited with code 3")
    assert run_local(b"def f():\n    return 'ok'\n", "f", FILENAME, [{}], mode="simulator").results == ["ok"]


@pytest.mark.skipif(gpu_available(), reason="checks the message given when there is no GPU")
def test_gpu_mode_without_a_gpu_says_how_to_fix_it():
    with pytest.raises(LocalRunError) as info:
        run_local(CUDA_CELL, "double_all", FILENAME, [{"values": [1.0]}], mode="gpu")
    assert info.value.phase == "environment" and "mode='simulator'" in info.value.message


def _counting(log, tag: str = "") -> bytes:
    """A version whose module appends a line to ``log`` each time it is executed."""
    return (
        f"import os\n# {tag}\nwith open({str(log)!r}, 'a') as out:\n    out.write('x\\n')\n"
        "def f():\n    return os.getpid()\n"
    ).encode()


def test_repeated_local_runs_of_an_unchanged_version_execute_its_module_once(tmp_path):
    log = tmp_path / "log"
    pids = {run_local(_counting(log), "f", FILENAME, [{}], mode="simulator").results[0] for _ in range(3)}
    assert len(pids) == 1 and log.read_text().count("x") == 1
    for _ in range(2):
        run_local(_counting(log, "per job"), "f", FILENAME, [{}], mode="simulator", state="per_job")
    assert log.read_text().count("x") == 3


def test_the_least_recently_used_local_worker_is_stopped_and_torn_down(tmp_path):
    from lancefn_jupyter.kernel.handles.local_run import MAX_WORKERS

    marks = tmp_path / "marks"
    holder = f"class f:\n    def __call__(self):\n        return 1\n    def teardown(self):\n        open({str(marks)!r}, 'a').write('down\\n')\n"
    assert run_local(holder.encode(), "f", FILENAME, [{}], mode="simulator").results == [1]
    for index in range(MAX_WORKERS):  # other versions: the holder becomes the least recently used
        run_local(f"def f():\n    return {index}\n".encode(), "f", f"<gpu_function g@v{index}>", [{}], mode="simulator")
    assert marks.read_text() == "down\n"


def test_a_setup_failure_raises_in_phase_setup_with_the_cell_line():
    with pytest.raises(LocalRunError) as info:
        run_local(b"x = 1\nraise KeyError('weights')\ndef f():\n    pass\n", "f", FILENAME, [{}], mode="simulator")
    assert info.value.phase == "setup"
    assert info.value.message == f"KeyError: 'weights' (at {FILENAME}:2)"
