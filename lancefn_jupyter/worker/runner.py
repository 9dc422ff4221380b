"""Running one task in this process: check its packages, load the artifact, call the entry
function per row with progress, and send the outcome (docs/ARCHITECTURE.md, "Worker protocol").

Used by the local warm worker (``worker.py``) and, through :func:`run_task_inline`, inside a Ray
task.  Standard library only at top level: a CPU-only task must not pay for numba.
"""

from __future__ import annotations

import base64
import functools
import linecache
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence

from lancefn_jupyter.wire import dataplane  # imports neither numpy nor pyarrow until a task uses the data plane
from lancefn_jupyter.worker.protocol import FINAL_EVENTS, Protocol, flush_stdio
from lancefn_jupyter.worker.result import TaskFailure, result_event

__all__ = ["missing_packages", "run_task_inline", "serve"]

_ARTIFACT_MODULE = "__gpu_function__"  # sys.modules name of the artifact while a task runs
_PROGRESS_INTERVAL_S = 0.02  # at most ~50 progress events per second; the latest count always goes out


class _Progress:
    """Rows done → ``progress`` events: at most one per interval, yet the latest count always goes out.

    A count held back by the throttle is sent by a timer when the interval ends, so a map whose
    next row is slow never shows a stale count meanwhile.
    """

    def __init__(self, proto: Protocol) -> None:
        self._proto = proto
        self._lock = threading.Lock()
        self._latest = self._sent = 0
        self._sent_at = float("-inf")
        self._timer: threading.Timer | None = None
        self._closed = False

    def update(self, rows_done: int) -> None:
        with self._lock:
            self._latest = rows_done
            wait = self._sent_at + _PROGRESS_INTERVAL_S - time.monotonic()
            if wait <= 0:
                self._send()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._trailing)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        """Send the final count if it is still held back; nothing is sent after this."""
        with self._lock:
            if self._latest > self._sent:
                self._send()
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()

    def _trailing(self) -> None:
        with self._lock:
            self._timer = None
            if not self._closed and self._latest > self._sent:
                self._send()

    def _send(self) -> None:
        self._proto.send(event="progress", rows_done=self._latest)
        self._sent, self._sent_at = self._latest, time.monotonic()


def missing_packages(requirements: Sequence[str]) -> list[tuple[str, str]]:
    """Declared requirements not satisfied in this Python environment, as (requirement, reason)."""
    if not requirements:
        return []
    import re
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    problems = []
    for text in requirements:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:  # conda specs such as "conda-forge::numpy=1.26": check the name only
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text.split("::")[-1].strip())
            if name is None:
                problems.append((text, "not a valid requirement"))
                continue
            requirement = Requirement(name.group())
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            problems.append((text, "not installed"))
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            problems.append((text, f"installed: {installed}"))
    return problems


def _user_traceback(exc: BaseException, filename: str) -> str:
    """The traceback reduced to the artifact's own frames plus the exception line."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == filename]
    text = "".join(traceback.format_exception_only(type(exc), exc))
    if frames:
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + text
    return text


def _exception_line(exc: BaseException) -> str:
    """'ValueError: message' (the exception's name alone when it has no message)."""
    return f"{type(exc).__qualname__}: {exc}" if str(exc) else type(exc).__qualname__


def _display(*objs: object, **_options: object) -> None:
    """The worker's `display`: what IPython's does outside a kernel, the repr on stdout (job logs)."""
    for obj in objs:
        print(repr(obj))


def _get_ipython() -> None:
    """The worker's `get_ipython`: no IPython shell here, as in a plain Python process."""
    return None


def _exit(code: object = None) -> None:
    """`exit`/`quit` where `site` did not add them (python -S): end the row with SystemExit."""
    raise SystemExit(code)


# Builtins IPython provides in a notebook, stand-ins in the artifact (ARCHITECTURE.md, "Names that resolve as builtins").
_STAND_INS = {"display": _display, "get_ipython": _get_ipython, "exit": _exit, "quit": _exit}


@functools.lru_cache(maxsize=8)
def _compiled(artifact_b64: str, filename: str) -> tuple[str, types.CodeType]:
    """The artifact's source and code, compiled once per version (a warm worker runs one version's
    jobs again and again); each task still executes it in a fresh module."""
    source = base64.b64decode(artifact_b64).decode("utf-8")
    # dont_inherit: this file's `from __future__` flags must not leak into the user's code
    return source, compile(source, filename, "exec", dont_inherit=True)


def _load_entry(task: dict) -> object:
    """Execute the artifact in a fresh module; return its entry function."""
    filename = task["filename"]
    module = types.ModuleType(_ARTIFACT_MODULE)
    module.__file__ = filename
    import builtins

    module.__builtins__ = {**_STAND_INS, **vars(builtins)}  # type: ignore[attr-defined]  # real builtins win where they exist
    sys.modules[_ARTIFACT_MODULE] = module  # dataclasses, pickle and numba look the module up by name
    try:
        source, code = _compiled(task["artifact_b64"], filename)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # lines in tracebacks
        exec(code, module.__dict__)
    except BaseException as exc:
        message = _exception_line(exc)
        if isinstance(exc, ImportError):
            message += "; declare the package (pip=/conda=) and install it in the control plane's Python environment"
        raise TaskFailure("import", message, _user_traceback(exc, filename)) from None
    entry = getattr(module, task["entrypoint"], None)
    if not callable(entry):
        raise TaskFailure("import", f"the artifact defines no function named {task['entrypoint']!r}")
    return entry


def _task_rows(task: dict) -> list:
    """The task's rows: Arrow IPC (``rows_file`` path, ``rows_ipc`` bytes) or JSON (``rows``)."""
    arrow = task.get("rows_file") or task.get("rows_ipc")
    types = task.get("input_types") or {}
    if arrow is None and not any(dataplane.is_data_type(t) for t in types.values()):
        return task["rows"]
    try:
        if arrow is None:
            return dataplane.rows_from_json(task["rows"], types)
        # Writable: numba copies host arrays back after a kernel, and user code may work in place.
        return dataplane.decode_rows(dataplane.read_ipc(arrow), writable=True)
    except (dataplane.DataPlaneError, OSError) as error:
        raise TaskFailure("validation", f"the job's rows cannot be decoded: {error}") from None


def _run_rows(task: dict, proto: Protocol) -> list:
    missing = missing_packages(task.get("packages") or ())
    if missing:
        import shlex

        raise TaskFailure(
            "environment",
            f"declared packages are not available in the executor's Python environment ({sys.executable}): "
            + ", ".join(f"{text} ({reason})" for text, reason in missing)
            + ". Install them into the control plane's environment (e.g. `"
            + shlex.join([sys.executable, "-m", "pip", "install", *(text for text, _ in missing)])
            + "`) and run the job again",
        )
    entry = _load_entry(task)
    rows = _task_rows(task)
    results, progress = [], _Progress(proto)
    try:
        for index, row in enumerate(rows):
            try:
                value = entry(**row)  # type: ignore[operator]
            except BaseException as exc:  # SystemExit/KeyboardInterrupt from user code fail the task, not the worker
                where = f" (row {index} of {len(rows)})" if len(rows) > 1 else ""
                raise TaskFailure("run", _exception_line(exc) + where, _user_traceback(exc, task["filename"])) from None
            results.append(value)
            if index + 1 < len(rows):  # the last row's count rides on the result (one event less per job)
                progress.update(index + 1)
    finally:
        progress.close()  # before the final event, so no progress of this task can follow it
    return results


def serve(task: dict, proto: Protocol, flush_output: Callable[[], None]) -> None:
    """Run ``task`` and send its outcome on ``proto``; ``flush_output`` returns once what user code
    wrote so far has gone out, so a task's logs always precede its outcome."""
    try:
        event = result_event(task, _run_rows(task, proto))
    except TaskFailure as failure:
        flush_output()
        proto.send(event="failed", phase=failure.phase, message=failure.message, traceback=failure.traceback)
    else:
        flush_output()
        frame = event.pop("result_frame", b"")
        if frame:
            proto.send_frame(frame, event="result", **event)
        else:
            proto.send(event="result", **event)
    finally:
        sys.modules.pop(_ARTIFACT_MODULE, None)
        linecache.cache.pop(task.get("filename"), None)  # type: ignore[arg-type]
        shipped = sys.modules.get("lancefn_jupyter.local_modules")
        if shipped is not None:  # the notebook's modules of this version must not serve the next task
            shipped.uninstall()


def run_task_inline(task: dict, send: Callable[..., None]) -> dict:
    """Run one task (the protocol's task dict) in *this* process and return its final event.

    For executors that already are a worker process (the Ray executor runs this inside a Ray
    task): ``log``/``progress`` events go to ``send(**event)`` as they would on the protocol
    fd, and the ``result``/``failed`` event is returned instead of sent.  Capturing fds 1/2 is
    the caller's business; Python and C stdio buffers are flushed before this returns.
    """
    final: dict = {}

    class _Inline:
        @staticmethod
        def send(**event: object) -> None:
            if event.get("event") in FINAL_EVENTS:
                final.update(event)
            else:
                send(**event)

    serve(task, _Inline, flush_stdio)  # type: ignore[arg-type]  # duck-typed Protocol
    return final
