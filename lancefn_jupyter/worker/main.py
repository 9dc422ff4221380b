"""The warm worker process (``python -m lancefn_jupyter.worker.main``) that runs a function
version's tasks; the parent's handle on it is ``worker_process.WorkerProcess``, the task body is
``task_runner.py`` (docs/ARCHITECTURE.md, "Worker protocol").

The protocol goes out on a private dup of the original stdout; fds 1 and 2 are re-pointed at
pipes whose lines become ``log`` events, so neither ``print`` nor C-level ``printf`` can corrupt
the protocol; stdin is replaced by /dev/null so user code cannot eat the task stream.  Tasks are
JSON lines on the original stdin; the worker loops until stdin closes.
Known limit: output written in the instant before a *hard* death (``os._exit``, a segfault,
SIGKILL) can be lost, because the thread that forwards it dies with the process; everything
written before a task ends normally (result or any Python exception) is always delivered.

The module imports only the standard library at top level: a CPU-only task must not pay for
numba (imported only when the artifact imports it) and ``ready`` must come fast.
"""

from __future__ import annotations

import array
import base64
import json
import os
import select
import sys
import threading
import time
from collections.abc import Sequence

from lancefn_jupyter.worker.protocol import PRELOAD_ENV, Protocol, flush_stdio
from lancefn_jupyter.worker.runner import serve

__all__ = ["main"]

_SYNC = b"\x00lancefn-log-sync\x00"  # written into the log pipes to know every earlier line was sent


class _Capture(threading.Thread):
    """Points ``fd`` (1 or 2) at a pipe and forwards what is written there as ``log`` events.

    The thread reads and forwards a chunk while holding ``lock``, so whoever holds the lock and
    finds the pipe empty and no partial line kept knows that everything written so far is out."""

    def __init__(self, proto: Protocol, stream: str, fd: int) -> None:
        super().__init__(name=f"lancefn-{stream}", daemon=True)
        self._proto, self._stream, self.fd = proto, stream, fd
        self.synced = threading.Event()
        self.lock = threading.Lock()
        self._pending = b""  # a partial line, sent once its newline (or a sync marker) comes
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN)
        while True:
            poller.poll()  # readable, or the write end closed: read it under the lock
            with self.lock:
                chunk = os.read(self._read_fd, 65536)
                if not chunk:
                    return
                self._forward(chunk)

    def _forward(self, chunk: bytes) -> None:
        *complete, self._pending = (self._pending + chunk).split(b"\n")
        if len(self._pending) > 65536:  # e.g. "\r" progress bars: never buffer a whole task's output
            complete.append(self._pending)
            self._pending = b""
        lines, synced = [], False
        for line in complete:
            if line.endswith(_SYNC):  # a partial line before the marker still counts as a line
                line, synced = line[: -len(_SYNC)], True
                if not line:
                    continue
            lines.append(line.decode("utf-8", "replace"))
        if lines:
            self._proto.send(event="log", stream=self._stream, lines=lines)
        if synced:
            self.synced.set()

    def drained(self) -> bool:
        """Everything written to the pipe so far has gone out (checked without waking the thread)."""
        with self.lock:
            return not self._pending and _unread_bytes(self._read_fd) == 0


def _unread_bytes(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD); -1 where that cannot be asked."""
    try:
        import fcntl
        import termios

        count = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, count, True)
        return count[0]
    except (ImportError, OSError):
        return -1


def _flush_output(captures: Sequence[_Capture]) -> None:
    """Return once everything user code wrote so far has gone out as ``log`` events.

    Called before ``result``/``failed`` so a task's logs always precede its outcome.  A task that
    printed nothing (most small jobs) costs no round trip through the capture threads.
    """
    flush_stdio()
    waiting = [capture for capture in captures if not capture.drained()]
    for capture in waiting:
        capture.synced.clear()
        os.write(capture.fd, _SYNC + b"\n")
    for capture in waiting:
        capture.synced.wait(2.0)  # bounded: user code may have re-pointed fd 1/2 elsewhere


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


def _warm_up(captures: Sequence[_Capture]) -> None:
    """Run a trivial task through the whole task path (compile, progress, output flush) before
    ``ready``, so a fresh worker's first real task does not pay for first-use costs (~10 ms)."""

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
    }
    serve(task, _Discard, lambda: _flush_output(captures))  # type: ignore[arg-type]  # duck-typed Protocol


def main() -> None:
    _not_dumpable()
    proto = Protocol(os.dup(1))  # os.dup fds are not inherited by processes user code starts
    tasks = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    captures = [_Capture(proto, "stdout", 1), _Capture(proto, "stderr", 2)]
    for capture in captures:
        capture.start()
    for stream in (sys.stdout, sys.stderr):  # line-buffered, so prints show up in the logs live
        stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    _exit_with_parent()
    _warm_up(captures)
    proto.send(event="ready", device=_detect_device())
    _preload(os.environ.pop(PRELOAD_ENV, ""))
    while line := tasks.readline():
        if line.strip():
            task = json.loads(line)
            if "rows_len" in task:  # Arrow rows follow the line raw (a worker that cannot open the server's files)
                task["rows_ipc"] = tasks.read(task.pop("rows_len"))
            _apply_env(task)
            serve(task, proto, lambda: _flush_output(captures))


if __name__ == "__main__":
    main()
