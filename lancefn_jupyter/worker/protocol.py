"""What both executors' task processes and both executors' parents share (docs/ARCHITECTURE.md,
"Worker protocol"): the JSON-lines protocol writer, flushing user output before an outcome, the
artifact's filename, and the relay of a worker event to the control plane's executor callbacks.

Standard library only at top level: the worker imports this before any task, and a CPU-only task
must not pay for pydantic, numpy or numba.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import ExecutorCallbacks
    from lancefn_jupyter.wire.models import JobFailure

FINAL_EVENTS = ("result", "failed")  # a task's last event
PRELOAD_ENV = "LANCEFN_WORKER_PRELOAD"  # modules a spare worker imports while it waits (worker.py)


def artifact_filename(name: str, version: str) -> str:
    """The filename artifacts are compiled with; tracebacks keep only frames of this file."""
    return f"<gpu_function {name}@{version}>"


class Protocol:
    """JSON lines on a protocol fd; locked because log threads and the task loop both send.

    ``strict`` (the worker): non-finite floats are an error and a closed fd raises. Otherwise (the
    Ray bridge): anything not JSON is sent as its ``str``, and a closed fd is ignored, since the
    control plane is gone and stdin EOF ends the process anyway.
    """

    def __init__(self, fd: int, *, strict: bool = True) -> None:
        self._fd = fd
        self._strict = strict
        self._lock = threading.Lock()

    def send(self, **event: Any) -> None:
        self.send_frame(b"", **event)

    def send_frame(self, payload: bytes, **event: Any) -> None:
        """The event line, then ``payload`` raw (announced as ``ipc_len``), with nothing between."""
        if payload:
            event["ipc_len"] = len(payload)
        if self._strict:
            line = json.dumps(event, separators=(",", ":"), allow_nan=False)
        else:
            line = json.dumps(event, separators=(",", ":"), default=str)
        data = memoryview((line + "\n").encode())
        with self._lock:
            try:
                for part in (data, memoryview(payload)):
                    while part:
                        part = part[os.write(self._fd, part) :]
            except OSError:
                if self._strict:
                    raise


def flush_stdio() -> None:
    """Push what user code wrote to fds 1/2 through Python's and libc's buffers."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # user code may have replaced or closed them
            pass
    try:  # C-level stdio buffers (e.g. CUDA printf) live in libc, not in sys.stdout
        _libc_fflush()(None)
    except Exception:
        pass


@functools.lru_cache(maxsize=1)
def _libc_fflush() -> Any:
    import ctypes

    return ctypes.CDLL(None).fflush


def failure_of(event: Mapping[str, Any]) -> JobFailure:
    """The ``JobFailure`` a ``failed`` event describes."""
    from lancefn_jupyter.wire.models import JobFailure

    return JobFailure(
        phase=event.get("phase", "executor"),
        message=str(event.get("message", "")),
        retryable=bool(event.get("retryable", False)),
        traceback=event.get("traceback"),
    )


def relay(callbacks: ExecutorCallbacks, job_id: str, event: Mapping[str, Any]) -> None:
    """One worker event (``started``, ``log``, ``progress``, ``result``, ``failed``) as the executor
    callback it means. A ``result`` carries JSON ``results`` or names an Arrow result file."""
    kind = event.get("event")
    if kind == "started":
        callbacks.task_started(job_id, devices=tuple(event.get("devices", ())), node=event.get("node"))
    elif kind == "log":
        callbacks.task_log(job_id, event.get("stream", "stdout"), list(event.get("lines", ())))
    elif kind == "progress":
        callbacks.task_progress(job_id, int(event.get("rows_done", 0)))
    elif kind == "result":
        callbacks.task_succeeded(job_id, event.get("results", event))
    elif kind == "failed":
        callbacks.task_failed(job_id, failure_of(event))
