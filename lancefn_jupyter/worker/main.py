"""The warm worker process (``python -m lancefn_jupyter.worker.main``) that runs a function
version's tasks; the parent's handle on it is ``process.WorkerProcess``, the task body is
``runner.py``, the capture of fds 1/2 is ``capture.py`` (docs/ARCHITECTURE.md, "Worker protocol").

The protocol goes out on a private dup of the original stdout; fds 1 and 2 are re-pointed at
pipes whose lines become ``log`` events, so neither ``print`` nor C-level ``printf`` can corrupt
the protocol; stdin is replaced by /dev/null so user code cannot eat the task stream.  Tasks are
JSON lines on the original stdin; the worker loops until stdin closes, then tears down the
version it holds (as on SIGTERM: docs/ARCHITECTURE.md, "Warm state").
Known limit: output written in the instant before a *hard* death (``os._exit``, a segfault,
SIGKILL) can be lost, because the thread that forwards it dies with the process; everything
written before a task ends normally (result or any Python exception) is always delivered.

The module imports only the standard library at top level: a CPU-only task must not pay for
numba (imported only when the artifact imports it) and ``ready`` must come fast.
"""

from __future__ import annotations

import base64
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from lancefn_jupyter.wire.jsontext import loads
from lancefn_jupyter.worker import reap
from lancefn_jupyter.worker.capture import Capture, flush_output, tag_rows
from lancefn_jupyter.worker.protocol import MAX_PROCS_ENV, PRELOAD_ENV, Protocol
from lancefn_jupyter.worker.runner import release, serve

__all__ = ["main"]


def _nvml_device_names(visible: str | None) -> list[str]:
    """Model names of the GPUs this process may use, in CUDA_VISIBLE_DEVICES order; [] without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        if visible is None:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        else:
            handles = []
            for entry in (item.strip() for item in visible.split(",")):
                try:
                    handles.append(
                        pynvml.nvmlDeviceGetHandleByIndex(int(entry))
                        if entry.isdigit()
                        else pynvml.nvmlDeviceGetHandleByUUID(entry)
                    )
                except pynvml.NVMLError:
                    break  # like CUDA: devices after the first invalid entry are ignored
        names = [pynvml.nvmlDeviceGetName(handle) for handle in handles]
        return [name.decode() if isinstance(name, bytes) else name for name in names]
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


def _detect_device() -> str:
    """What this worker runs on, decided from its environment without importing numba."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "CUDA simulator"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return "cpu"
    return ", ".join(dict.fromkeys(_nvml_device_names(visible))) or "cpu"


def _exit_with_parent() -> None:
    """Workers run in their own session; make sure one never outlives a killed parent."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="lancefn-parent-watch", daemon=True).start()


def _not_dumpable() -> None:
    """Linux: other processes of this user (e.g. another team's worker) cannot read this one's
    memory or ``/proc/<pid>/environ`` (ptrace and those files need a dumpable process), so the
    function env a task brings stays in this process."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):  # not Linux
        pass


def _limit_processes(value: str) -> None:
    """RLIMIT_NPROC, soft and hard, before any job code runs: the processes and threads this uid may hold, which
    job code cannot raise again (a uid per namespace bounds that team's fork bomb: docs/ARCHITECTURE.md,
    "Isolation")."""
    if value:
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (int(value), int(value)))


def _apply_env(task: dict) -> None:
    """The function's env arrives with the task, never at exec, so it is in no ``/proc/*/environ``.
    A worker only serves one (namespace, version), whose env is fixed, so setting it is final."""
    env = task.get("env")
    if env:
        os.environ.update(env)


def _preload(names: str) -> None:
    """Import heavy modules (``LANCEFN_WORKER_PRELOAD``, comma-separated, e.g. ``numpy,numba``) in
    the background after ``ready``, so a new version's first job on a spare worker does not pay for
    them.  Importing numba does not initialise CUDA (``numba.cuda`` is left to the artifact)."""
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    if not wanted:
        return

    def load() -> None:
        import importlib

        for name in wanted:
            try:
                importlib.import_module(name)
            except Exception:  # not installed or broken: the artifact that needs it will say so
                pass

    threading.Thread(target=load, name="lancefn-preload", daemon=True).start()


_WARM_UP_SOURCE = b"def warm_up(x):\n    return x\n"


def _warm_up(captures: Sequence[Capture]) -> None:
    """Run a trivial task through the whole task path (compile, progress, output flush) before
    ``ready``, so a fresh worker's first real task does not pay for first-use costs (~10 ms).
    ``per_job``: it leaves no loaded version behind."""

    class _Discard:
        @staticmethod
        def send(**event: object) -> None:
            pass

    task = {
        "task_id": "warm-up",
        "artifact_b64": base64.b64encode(_WARM_UP_SOURCE).decode("ascii"),
        "entrypoint": "warm_up",
        "filename": "<lancefn warm-up>",
        "rows": [{"x": 1}],
        "packages": [],
        "state": "per_job",
    }
    serve(task, _Discard, lambda: flush_output(captures))  # type: ignore[arg-type]  # duck-typed Protocol


def _on_sigterm(signum: int, frame: object) -> None:
    """Cancel, kill or a stop that found the worker busy: tear the held version down (bounded),
    then end at once, wherever the task was."""
    release()
    reap.sweep()  # what its job started ends with it ("Job processes")
    os._exit(128 + signum)


def main() -> None:
    _limit_processes(os.environ.pop(MAX_PROCS_ENV, ""))
    _not_dumpable()
    reap.become_subreaper()  # a job's detached processes (setsid, double fork) stay ours to end
    signal.signal(signal.SIGTERM, _on_sigterm)
    proto = Protocol(os.dup(1))  # os.dup fds are not inherited by processes user code starts
    tasks = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    captures = [Capture(proto, "stdout", 1), Capture(proto, "stderr", 2)]
    for capture in captures:
        capture.start()
    for stream in (sys.stdout, sys.stderr):  # line-buffered, so prints show up in the logs live
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    tag_rows()
    _exit_with_parent()
    _warm_up(captures)
    proto.send(event="ready", device=_detect_device())
    _preload(os.environ.pop(PRELOAD_ENV, ""))
    while line := tasks.readline():
        if line.strip():
            task = loads(line)
            if "rows_len" in task:  # Arrow rows follow the line raw (a worker that cannot open the server's files)
                task["rows_ipc"] = tasks.read(task.pop("rows_len"))
            _apply_env(task)
            serve(task, proto, lambda: flush_output(captures))
    release()  # stdin closed: the worker retires (idle, replaced, server stop)
    reap.sweep()  # what the teardown started
    flush_output(captures)
    # Now, not once the interpreter has joined non-daemon threads user code may have left running:
    # the parent's stop would otherwise wait its whole teardown allowance for them.
    os._exit(0)


if __name__ == "__main__":
    main()
