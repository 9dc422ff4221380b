"""What both executors' task processes and their parents share (docs/ARCHITECTURE.md, "Worker
protocol"): the JSON-lines protocol writer, flushing user output before an outcome, and the
artifact's filename. The parent-side relay of events to executor callbacks is
``server/executors/relay.py``: this package never names the server.

Standard library only at top level (and orjson where the worker's interpreter has it): the worker imports this
before any task, and a CPU-only task must not pay for pydantic, numpy or numba.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from typing import Any

try:  # a sixth of the standard library's time per line; not in every worker's interpreter (an environment's own)
    import orjson
except ImportError:
    orjson = None  # type: ignore[assignment]

FINAL_EVENTS = ("result", "failed")  # a task's last event
PRELOAD_ENV = "LANCEFN_WORKER_PRELOAD"  # modules a spare worker imports while it waits (worker.py)
# The worker's RLIMIT_NPROC (docs/ARCHITECTURE.md, "Isolation"): set by the worker itself, first thing, since the
# server may not change the limits of a process of another uid (that needs CAP_SYS_RESOURCE).
MAX_PROCS_ENV = "LANCEFN_WORKER_MAX_PROCS"
# How long a class entry's teardown() may run when its worker retires; the parent waits a little
# longer before it kills the process (docs/ARCHITECTURE.md, "Warm state").
TEARDOWN_S = 10.0
# The largest JSON result a job may have (its UTF-8 JSON text), checked by the control plane whatever the worker
# says: the worker sends at most 256 Ki characters of JSON (at most this many bytes) and larger results as Arrow
# files (docs/ARCHITECTURE.md, "Worker protocol").
JSON_RESULT_MAX_BYTES = 1 << 20
# The longest protocol line a parent reads (a worker's, the Ray bridge's): a JSON result at its limit with room for
# the event's other fields. A capped failure (2 × 64 Ki characters) and a log event (at most 128 KiB of output)
# stay below it even with every character escaped; a longer line fails the job (docs/ARCHITECTURE.md, "Worker
# protocol"), so the parent never buffers more.
LINE_MAX_BYTES = 2 * JSON_RESULT_MAX_BYTES
#: The most of a failure's message or traceback kept (characters); the rest is noted as cut (docs/ARCHITECTURE.md,
#: "REST details"). The worker caps what it sends, the control plane what it stores.
FAILURE_TEXT_LIMIT = 64 * 1024


class LineTooLong(Exception):
    """A protocol line past a limit: dropped by the reader that found it (which skips the rest of it), or never
    sent by a writer given one (``Protocol(max_line=…)``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a protocol line longer than {limit} bytes")
        self.limit = limit


def cap_text(text: str, limit: int = FAILURE_TEXT_LIMIT) -> str:
    """``text`` up to ``limit`` characters, its end replaced by a note of how much was cut; the note fits within
    ``limit``, so text capped once (by the worker) passes a second cap (the control plane's) unchanged."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 32)  # room for the note
    cut = len(text[keep:].encode("utf-8", "replace"))
    size = f"{cut / 1e6:.1f} MB" if cut >= 100_000 else f"{cut / 1e3:.1f} kB"
    return f"{text[:keep]} … [cut {size}]"


def artifact_filename(name: str, version: str) -> str:
    """The filename artifacts are compiled with; tracebacks keep only frames of this file."""
    return f"<gpu_function {name}@{version}>"


def dumps(value: Any) -> str:
    """Compact JSON of a value whose floats are all finite (what the worker sends: results passed ``_to_json``,
    timings are its own): orjson where there is one; the standard library for what orjson refuses (integers over 64
    bits) and where there is none, which raises on a non-finite float."""
    if orjson is not None:
        try:
            return orjson.dumps(value).decode()
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _loose_dumps(value: Any) -> str:
    """Compact JSON with anything not JSON as its ``str`` (the Ray bridge's lines): orjson where there is one, the
    standard library for what orjson refuses (integers over 64 bits) and where there is none."""
    if orjson is not None:
        try:
            return orjson.dumps(value, default=str).decode()
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), default=str)


class Protocol:
    """JSON lines on a protocol fd; locked because log threads and the task loop both send.

    ``strict`` (the worker): what it sends is JSON whose floats are finite (:func:`dumps`), and a closed fd raises.
    Otherwise (the Ray bridge): anything not JSON is sent as its ``str``, and a closed fd is ignored, since the
    control plane is gone and stdin EOF ends the process anyway. ``max_line`` (the Ray bridge, which forwards what
    jobs send): a longer line is not sent (:class:`LineTooLong`), so the control plane's reader never meets one.
    """

    def __init__(self, fd: int, *, strict: bool = True, max_line: int | None = None) -> None:
        self._fd = fd
        self._strict = strict
        self._max_line = max_line
        self._lock = threading.Lock()

    def send(self, **event: Any) -> None:
        self.send_frame(b"", **event)

    def send_frame(self, payload: bytes, **event: Any) -> None:
        """The event line, then ``payload`` raw (announced as ``ipc_len``), with nothing between."""
        if payload:
            event["ipc_len"] = len(payload)
        line = dumps(event) if self._strict else _loose_dumps(event)
        data = memoryview((line + "\n").encode())
        if self._max_line is not None and len(data) > self._max_line:
            raise LineTooLong(self._max_line)
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


def result_target(task: dict, nbytes: int) -> tuple[str, str | None]:
    """Where a result of about ``nbytes`` goes, and the slot to write it into (docs/ARCHITECTURE.md, "Result
    staging"): the task's ``result_stage`` file (memory; the control plane moves it to the home) when it offers
    one this size fits, written into its ``slot`` when it has one; else ``result_file``."""
    stage = task.get("result_stage")
    if isinstance(stage, dict) and nbytes <= int(stage.get("max_bytes", 0)):
        slot = stage.get("slot")
        return str(stage["file"]), None if slot is None else str(slot)
    return str(task["result_file"]), None
