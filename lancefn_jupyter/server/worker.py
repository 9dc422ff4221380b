"""The warm worker that runs a function version's artifact, and the parent's handle on it.

Both ends of the worker protocol (docs/ARCHITECTURE.md, "Worker protocol") live in this module:
:func:`main` is the child (``python -m lancefn_jupyter.server.worker``) and
:class:`WorkerProcess` is the parent side used by the local executor and by
``lancefn_jupyter.local``.

Child, in short: the protocol goes out on a private dup of the original stdout; fds 1 and 2 are
re-pointed at pipes whose lines become ``log`` events, so neither ``print`` nor C-level
``printf`` can corrupt the protocol; stdin is replaced by /dev/null so user code cannot eat the
task stream.  Tasks are JSON lines on the original stdin; the worker loops until stdin closes.
Known limit: output written in the instant before a *hard* death (``os._exit``, a segfault,
SIGKILL) can be lost, because the thread that forwards it dies with the process; everything
written before a task ends normally (result or any Python exception) is always delivered.

The module imports only the standard library at top level: a CPU-only task must not pay for
numba (imported only when the artifact imports it) and ``ready`` must come fast.

Size: over 600 lines because it holds both ends of one pipe protocol (the child that runs the
task, ``WorkerProcess`` in the parent); what the Ray bridge shares lives in ``worker_io.py``.
"""

from __future__ import annotations

import base64
import json
import linecache
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from typing import Callable, Iterator, Mapping, Sequence, cast

from .. import dataplane  # imports neither numpy nor pyarrow until a task uses the data plane
from .worker_io import Protocol, flush_stdio

__all__ = [
    "WorkerProcess",
    "WorkerStartError",
    "describe_exit",
    "artifact_filename",
    "missing_packages",
    "run_task_inline",
    "main",
    "PRELOAD_ENV",
]

_MODULE = "lancefn_jupyter.server.worker"
PRELOAD_ENV = "LANCEFN_WORKER_PRELOAD"
_ARTIFACT_MODULE = "__gpu_function__"  # sys.modules name of the artifact while a task runs
_PROGRESS_INTERVAL_S = 0.02  # at most ~50 progress events per second; the latest count always goes out
_SYNC = b"\x00lancefn-log-sync\x00"  # written into the log pipes to know every earlier line was sent
_FINAL_EVENTS = ("result", "failed")
# Plain results up to this much JSON travel inline (faster for small scalar jobs); bigger ones,
# and values JSON cannot carry (NaN, ±Inf), go as Arrow IPC when the task allows it.
_JSON_RESULT_MAX_CHARS = 256 * 1024
_JSON_RESULT_MAX_ITEMS = 16 * 1024


def artifact_filename(name: str, version: str) -> str:
    """The filename artifacts are compiled with; tracebacks keep only frames of this file."""
    return f"<gpu_function {name}@{version}>"


# ===================================================================== child (the worker)


class _Capture(threading.Thread):
    """Points ``fd`` (1 or 2) at a pipe and forwards what is written there as ``log`` events."""

    def __init__(self, proto: Protocol, stream: str, fd: int) -> None:
        super().__init__(name=f"lancefn-{stream}", daemon=True)
        self._proto, self._stream, self.fd = proto, stream, fd
        self.synced = threading.Event()
        self._read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)

    def run(self) -> None:
        pending = b""
        while chunk := os.read(self._read_fd, 65536):
            *complete, pending = (pending + chunk).split(b"\n")
            if len(pending) > 65536:  # e.g. "\r" progress bars: never buffer a whole task's output
                complete.append(pending)
                pending = b""
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


def _flush_output(captures: Sequence[_Capture]) -> None:
    """Return once everything user code wrote so far has gone out as ``log`` events.

    Called before ``result``/``failed`` so a task's logs always precede its outcome.
    """
    flush_stdio()
    for capture in captures:
        capture.synced.clear()
        os.write(capture.fd, _SYNC + b"\n")
    for capture in captures:
        capture.synced.wait(2.0)  # bounded: user code may have re-pointed fd 1/2 elsewhere


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


class _TaskFailure(Exception):
    def __init__(self, phase: str, message: str, tb: str | None = None) -> None:
        super().__init__(message)
        self.phase, self.message, self.traceback = phase, message, tb


def _missing_packages(requirements: Sequence[str]) -> list[tuple[str, str]]:
    """Declared requirements not satisfied by an installed distribution, as (requirement, reason)."""
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


def _load_entry(task: dict) -> object:
    """Compile and execute the artifact in a fresh module; return its entry function."""
    filename = task["filename"]
    source = base64.b64decode(task["artifact_b64"]).decode("utf-8")
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # source lines in tracebacks
    module = types.ModuleType(_ARTIFACT_MODULE)
    module.__file__ = filename
    import builtins

    module.__builtins__ = {**_STAND_INS, **vars(builtins)}  # type: ignore[attr-defined]  # real builtins win where they exist
    sys.modules[_ARTIFACT_MODULE] = module  # dataclasses, pickle and numba look the module up by name
    try:
        # dont_inherit: this file's `from __future__` flags must not leak into the user's code
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
    except BaseException as exc:
        message = _exception_line(exc)
        if isinstance(exc, ImportError):
            message += "; declare the package (pip=/conda=) and install it in the control plane's Python environment"
        raise _TaskFailure("import", message, _user_traceback(exc, filename)) from None
    entry = getattr(module, task["entrypoint"], None)
    if not callable(entry):
        raise _TaskFailure("import", f"the artifact defines no function named {task['entrypoint']!r}")
    return entry


def _to_json(value: object, where: str) -> object:
    """Plain JSON values; numpy scalars and arrays become Python values; anything else is refused."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _TaskFailure("result", f"{where} is {value}, which JSON cannot carry; return None or a finite number")
        return value
    if type(value).__module__.split(".")[0] == "numpy" and hasattr(value, "tolist"):
        return _to_json(value.tolist(), where)
    if isinstance(value, (list, tuple)):
        return [_to_json(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _to_json(item, f"{where}[{key!r}]") for key, item in value.items()}
    kind = (
        "dict with non-str keys"
        if isinstance(value, dict)
        else f"type {type(value).__module__}.{type(value).__qualname__}"
    )
    raise _TaskFailure(
        "result",
        f"{where} has {kind}, which cannot be sent back as JSON; return None, bool, int, float, str, "
        "lists or dicts with str keys (numpy scalars and arrays are converted)",
    )


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
        raise _TaskFailure("validation", f"the job's rows cannot be decoded: {error}") from None


def _run_rows(task: dict, proto: Protocol) -> list:
    missing = _missing_packages(task.get("packages") or ())
    if missing:
        import shlex

        raise _TaskFailure(
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
                raise _TaskFailure(
                    "run", _exception_line(exc) + where, _user_traceback(exc, task["filename"])
                ) from None
            results.append(value)
            progress.update(index + 1)
    finally:
        progress.close()  # before the final event, so no progress of this task can follow it
    return results


def _rough_items(values: list) -> int:
    """About how many scalars ``values`` hold (top level only): big results skip JSON at once."""
    return sum(len(v) if isinstance(v, (list, tuple, str, bytes)) else getattr(v, "size", 1) for v in values)


def _result_event(task: dict, values: list) -> dict:
    """The ``result`` event's fields: ``results`` (JSON) for small plain values, else the Arrow
    IPC result written to ``result_file`` (``{result_file, nbytes, summary}``), or returned as
    ``result_ipc`` bytes when the task has no file (Ray moves those bytes natively)."""
    output_type = task.get("output_type")
    arrow_ok = output_type is not None and ("result_file" in task or task.get("result_ipc") or task.get("result_frame"))
    many = len(values) > 1

    def where(index: int) -> str:
        return f"the result of row {index}" if many else "the result"

    if not dataplane.is_data_type(output_type) and (not arrow_ok or _rough_items(values) <= _JSON_RESULT_MAX_ITEMS):
        try:
            results = [_to_json(value, where(index)) for index, value in enumerate(values)]
            if not arrow_ok or len(json.dumps(results, separators=(",", ":"))) <= _JSON_RESULT_MAX_CHARS:
                return {"results": results}
        except _TaskFailure:
            if not arrow_ok:  # no Arrow path (an old caller): the JSON rules apply
                raise
    if not arrow_ok:
        raise _TaskFailure("result", f"the result is declared {output_type}, which needs the Arrow data plane")
    try:
        table = dataplane.encode_results(values, output_type, many=many)  # type: ignore[arg-type]
        if "result_file" in task:
            nbytes = dataplane.write_ipc_file(task["result_file"], table, durable=bool(task.get("result_fsync", True)))
            return {
                "result_file": task["result_file"],
                "nbytes": nbytes,
                "summary": dataplane.summarize_results(values, nbytes),
            }
        data = dataplane.to_ipc_bytes(table)
        key = "result_frame" if task.get("result_frame") else "result_ipc"
        return {key: data, "nbytes": len(data), "summary": dataplane.summarize_results(values, len(data))}
    except dataplane.DataPlaneError as error:
        raise _TaskFailure("result", str(error)) from None


def _serve(task: dict, proto: Protocol, captures: Sequence[_Capture]) -> None:
    try:
        event = _result_event(task, _run_rows(task, proto))
    except _TaskFailure as failure:
        _flush_output(captures)
        proto.send(event="failed", phase=failure.phase, message=failure.message, traceback=failure.traceback)
    else:
        _flush_output(captures)
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
            if event.get("event") in _FINAL_EVENTS:
                final.update(event)
            else:
                send(**event)

    _serve(task, _Inline, ())  # type: ignore[arg-type]  # duck-typed Protocol
    return final


def missing_packages(requirements: Sequence[str]) -> list[tuple[str, str]]:
    """Declared requirements not satisfied in this Python environment, as (requirement, reason)."""
    return _missing_packages(requirements)


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
    _serve(task, _Discard, captures)  # type: ignore[arg-type]  # duck-typed Protocol


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
            _serve(task, proto, captures)


# ===================================================================== parent side


class WorkerStartError(RuntimeError):
    """The worker process died before it said ``ready``."""


def describe_exit(returncode: int) -> str:
    """'worker process exited with code N' / 'worker process was killed by signal SIGSEGV (…)'."""
    if returncode >= 0:
        return f"worker process exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"worker process was killed by signal {-returncode}"
    hint = {
        signal.SIGSEGV: " (segmentation fault: a crash in native code, e.g. an out-of-bounds access)",
        signal.SIGKILL: " (possibly by the out-of-memory killer)",
        signal.SIGABRT: " (aborted by native code)",
    }.get(sig, "")
    return f"worker process was killed by signal {sig.name}{hint}"


class WorkerProcess:
    """Parent's handle on one warm worker; use from one thread at a time, except :meth:`kill`."""

    def __init__(self, env: Mapping[str, str], user: tuple[int, int] | None = None) -> None:
        """``user``: (uid, gid) to run as (a root server's unprivileged worker user), else ours."""
        self.env = dict(env)
        # Another user cannot open the home's files: Arrow rows and results then travel on the pipes.
        self.frames = user is not None
        self._result_sink: tuple[str, bool] | None = None  # (result file, fsync) of the current task
        switch = {"user": user[0], "group": user[1], "extra_groups": []} if user is not None else {}
        # A new session: Ctrl-C in the server's terminal or a kernel interrupt doesn't reach
        # workers, and killpg also stops processes the user's code started.
        self.process = subprocess.Popen(  # type: ignore[call-overload]
            [sys.executable, "-m", _MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
            start_new_session=True,
            **switch,
        )
        self._kill_lock = threading.Lock()
        ready = self._read_event()
        if ready is None or ready.get("event") != "ready":
            detail = self.process.stderr.read().decode("utf-8", "replace").strip()
            self.kill()
            raise WorkerStartError(
                f"{describe_exit(self.process.returncode)} before it was ready"
                + (f": {detail.splitlines()[-1]}" if detail else "")
            )
        self.process.stderr.close()  # the worker has re-pointed fd 2 at its log pipe by now
        self.device: str = ready["device"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def start_task(
        self,
        task_id: str,
        artifact: bytes,
        entrypoint: str,
        filename: str,
        rows: list[dict],
        packages: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        data: Mapping[str, object] | None = None,
    ) -> None:
        """Send one task; a worker that already died shows up as an early end of :meth:`events`.
        ``env``: the function's env, set in the worker before the artifact loads.
        ``data``: the Arrow data plane's task fields (``input_types``, ``output_type``,
        ``rows_file`` instead of ``rows``, ``result_file``); see docs/ARCHITECTURE.md."""
        task = {
            "task_id": task_id,
            "artifact_b64": base64.b64encode(artifact).decode("ascii"),
            "entrypoint": entrypoint,
            "filename": filename,
            "rows": rows,
            "packages": list(packages),
            **(data or {}),
        }
        if env:
            task["env"] = dict(env)
        if "rows_file" in task:
            del task["rows"]
        rows_file = None
        self._result_sink = None
        if self.frames:  # the worker gets the rows after the line and sends the result after its event
            rows_file = cast("str | None", task.pop("rows_file", None))
            if rows_file is not None:
                task["rows_len"] = os.path.getsize(rows_file)
            if "result_file" in task:
                self._result_sink = (str(task.pop("result_file")), bool(task.get("result_fsync", True)))
                task["result_frame"] = True
        try:
            self.process.stdin.write(json.dumps(task, separators=(",", ":")).encode() + b"\n")
            if rows_file is not None:
                with open(rows_file, "rb") as rows_source:
                    shutil.copyfileobj(rows_source, self.process.stdin, 1 << 20)
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError):  # ValueError: stdin closed by a concurrent kill
            pass

    def events(self) -> Iterator[dict]:
        """The current task's events up to its ``result``/``failed``; ends early if the worker exits."""
        while (event := self._read_event()) is not None:
            yield event
            if event["event"] in _FINAL_EVENTS:
                return

    def wait(self) -> int:
        return self.process.wait()

    def kill(self, grace_s: float = 2.0) -> None:
        """SIGTERM the worker's process group, SIGKILL after ``grace_s``, reap it. Idempotent."""
        with self._kill_lock:
            if self.process.returncode is None:  # not reaped yet, so the pid/pgid is still ours
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.process.pid, sig)
                    except ProcessLookupError:
                        pass
                    try:
                        self.process.wait(grace_s)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                self.process.wait()
            self._close_pipes()

    def stop(self, grace_s: float = 2.0) -> None:
        """Graceful end for an idle worker: close its stdin so it exits, then :meth:`kill`."""
        try:
            self.process.stdin.close()
            self.process.wait(grace_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill(grace_s)

    def _read_event(self) -> dict | None:
        try:
            line = self.process.stdout.readline()
            if not line:
                return None
            event = json.loads(line)
            if "ipc_len" in event:  # an Arrow result frame: streamed into the job's result file
                size = event.pop("ipc_len")
                if self._result_sink is None:
                    self.process.stdout.read(size)
                    return {
                        "event": "failed",
                        "phase": "worker",
                        "message": "the worker sent an unexpected result frame",
                    }
                path, durable = self._result_sink
                event["nbytes"] = dataplane.write_stream_file(path, self.process.stdout, size, durable=durable)
                event["result_file"] = path
            return event
        except (ValueError, EOFError, OSError):  # stdout closed by a concurrent kill, or the worker died mid-frame
            return None

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            try:
                pipe.close()
            except OSError:
                pass


if __name__ == "__main__":
    main()
