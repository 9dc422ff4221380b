"""Notebook job handles (submit/map/remote/local, wait, cancel, logs, attach, remote errors) on a real server."""

from __future__ import annotations

import pytest

from lancefn_jupyter.kernel import api

KERNEL_CELL = """\
import numpy as np
from numba import cuda

@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]

def double_all(values: list[float]) -> list[float]:
    x = np.asarray(values, dtype=np.float32)
    out = np.zeros_like(x)
    _double.forall(x.size)(x, out)
    return out.tolist()
"""

FAILING_CELL = """\
def ratio(total: int, parts: int) -> float:
    print("computing", total, parts)
    share = total / parts
    return share
"""

WAITING_CELL = """\
import os
import time

def hold(path: str) -> str:
    while not os.path.exists(path):
        time.sleep(0.02)
    return path
"""


def test_kernel_cell_same_results_locally_and_as_a_job(ip):
    ip.run_cell_magic("gpu_function", "num_gpus=1 pip=numpy", KERNEL_CELL)
    double_all = ip.user_ns["double_all"]
    job = double_all.submit([1.0, 2.0, 3.5])
    assert job.wait(timeout=120).state == "finished"
    assert job.result() == [2.0, 4.0, 7.0]
    assert job.snapshot.placement.devices and job.snapshot.placement.gpu_class == "default"
    assert double_all.local([1.0, 2.0, 3.5]) == [2.0, 4.0, 7.0]
    assert double_all.last_local_device == "CUDA simulator"
    mapped = double_all.map([[1.0], [2.0, 3.0]])
    assert mapped.result(timeout=120) == [[2.0], [4.0, 6.0]]
    assert (mapped.snapshot.progress.rows_done, mapped.snapshot.progress.rows_total) == (2, 2)
    assert double_all.remote([5.0]) == [10.0]


def test_remote_error_shows_the_cells_frames_and_job_id(ip, capsys):
    ip.run_cell_magic("gpu_function", "", FAILING_CELL)
    ratio = ip.user_ns["ratio"]
    with pytest.raises(api.RemoteFunctionError) as raised:
        ratio.remote(3, 0)
    error = raised.value
    assert error.phase == "run" and error.job_id in str(error)
    # The magic line is notebook line 1, so `share = total / parts` is cell line 4.
    assert "cell line 4" in error.remote_traceback and "share = total / parts" in error.remote_traceback
    assert "ZeroDivisionError" in str(error) and "worker.py" not in str(error)
    assert "computing 3 0" in api.Job.attach(error.job_id).logs()
    with pytest.raises(Exception) as local_error:
        ratio.local(3, 0)
    assert "cell line 4" in str(local_error.value) and "ZeroDivisionError" in str(local_error.value)
    assert "computing 3 0" in capsys.readouterr().out  # .local() shows the function's prints live


def test_cancel_attach_and_pending_state(ip, tmp_path):
    ip.run_cell_magic("gpu_function", "num_gpus=2", WAITING_CELL)  # the class has exactly 2 GPUs
    hold = ip.user_ns["hold"]
    gate = tmp_path / "gate"
    running = hold.submit(str(gate))
    waiting = hold.submit(str(gate))
    assert waiting.state == "pending"
    assert waiting.snapshot.placement.waiting_on_capacity and waiting.snapshot.placement.queue_position == 1
    assert waiting.cancel() is True and waiting.state == "cancelled"
    with pytest.raises(api.JobCancelled):
        waiting.result()
    # After a "kernel restart" a handle can be re-attached by id.
    again = api.Job.attach(running.job_id)
    gate.touch()
    assert again.result(timeout=120) == [str(gate)]
    assert running.result(timeout=120) == str(gate)


def test_bad_arguments_are_refused_before_submitting(ip):
    ip.run_cell_magic("gpu_function", "", FAILING_CELL)
    ratio = ip.user_ns["ratio"]
    with pytest.raises(TypeError, match="ratio"):
        ratio.submit(1)
    with pytest.raises(TypeError, match="JSON"):
        ratio.submit(object(), 2)
    assert api.current_client().jobs.list(job_type="run_function") == []


def test_ctrl_c_in_wait_stops_waiting_not_the_job(ip, tmp_path, capsys):
    import os
    import signal
    import threading

    ip.run_cell_magic("gpu_function", "", WAITING_CELL)
    gate = tmp_path / "gate"
    job = ip.user_ns["hold"].submit(str(gate))
    watcher = api.Job.attach(job.job_id)

    def interrupt_once_running():
        watcher.wait(timeout=0.1)
        while watcher.refresh().job_state.value != "IN_PROGRESS":
            watcher.wait(timeout=0.1)
        threading.Event().wait(0.3)  # the main thread is inside job.wait() by now (nothing else to do)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt_once_running, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt):
        job.wait()
    thread.join(30)
    assert "keeps running" in capsys.readouterr().err
    assert job.refresh().job_state.value == "IN_PROGRESS"
    gate.touch()
    assert job.result(timeout=120) == str(gate)


def test_only_a_job_still_under_way_is_followed_by_the_event_listener(ip, tmp_path):
    """A quick job comes back finished in the run reply: nothing about it can change, so the kernel's listener keeps
    no subscription for it (it stayed there for good, one per job, in a long loop of submits)."""
    from lancefn_jupyter.kernel.session import listener

    ip.run_cell_magic("gpu_function", "", WAITING_CELL)
    hold = ip.user_ns["hold"]
    ready = tmp_path / "ready"
    ready.touch()
    assert hold.remote(str(ready)) == str(ready)  # its worker is warm now
    for _ in range(20):  # within the submit's short wait, unless this machine is very busy
        quick = hold.submit(str(ready))
        if quick.done:
            break
    assert quick.done and quick.result() == str(ready)
    slow = hold.submit(str(tmp_path / "later"))
    followed = listener()._jobs.keys()
    assert slow.job_id in followed and quick.job_id not in followed
    assert slow.cancel() is True
