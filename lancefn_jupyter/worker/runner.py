"""Running one task in this process: check its packages, load the artifact (once per worker, see
docs/ARCHITECTURE.md "Warm state"), call the entry per row with progress, and send the outcome with
its timings (docs/ARCHITECTURE.md, "Worker protocol").

Used by the local warm worker (``worker.py``) and, through :func:`run_task_inline`, inside a Ray
task.  Standard library only at top level: a CPU-only task must not pay for numba.

Over 600 lines: one concern, one task run in the worker (load, rebind, rows, outcome, the failure's frames),
whose steps share the loaded version; its leaves (protocol, capture, results) are apart.
"""

from __future__ import annotations

import ast
import base64
import functools
import json
import linecache
import os
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.wire import bundles, dataplane  # dataplane imports neither numpy nor pyarrow until a task uses it
from lancefn_jupyter.wire.frames import capture_frames
from lancefn_jupyter.wire.setup_part import SetupPart, class_def, setup_part
from lancefn_jupyter.worker import reap
from lancefn_jupyter.worker.capture import set_row
from lancefn_jupyter.worker.protocol import FINAL_EVENTS, TEARDOWN_S, Protocol, cap_text, flush_stdio
from lancefn_jupyter.worker.result import TaskFailure, result_event

__all__ = ["call_here", "missing_packages", "python_mismatch", "release", "run_task_inline", "serve"]

_ARTIFACT_MODULE = "__gpu_function__"  # sys.modules name of the loaded artifact
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


def _run_failure(exc: BaseException, task: dict, start: int, end: int, message: str) -> TaskFailure:
    """Phase ``run`` for rows ``start…end`` of the task, with the artifact frames' locals (docs/ARCHITECTURE.md,
    "Debugging a failure"); the function's env values never in them."""
    earlier = _loaded.filenames if _loaded is not None else ()
    frames = capture_frames(exc.__traceback__, (task["filename"], *earlier), (task.get("env") or {}).values())
    tb = _user_traceback(exc, task["filename"])
    return TaskFailure("run", message, tb, frames=frames, rows=(start, end))


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
    """The artifact's source (a bundle's: its entry module's) and code, compiled once per version (a ``per_job``
    version executes it afresh for every task)."""
    artifact = base64.b64decode(artifact_b64)
    files = bundles.bundle_files(artifact)
    source = files[bundles.ENTRY_FILE] if files is not None else artifact.decode("utf-8")
    # dont_inherit: this file's `from __future__` flags must not leak into the user's code
    return source, compile(source, filename, "exec", dont_inherit=True)


@dataclass(eq=False)
class _Loaded:
    """The one version this process holds: its module, and what each row calls."""

    key: tuple[str, ...]  # (filename, artifact, entrypoint, init: its canonical JSON, "" without)
    module: types.ModuleType
    call: Callable[..., object]
    instance: object | None  # a class entry's instance (its teardown runs when the version goes)
    setup_digest: str | None = None  # the plane's setup digest of the version ("Setup reuse"); None: never reused
    filenames: tuple[str, ...] = ()  # of the versions rebound onto it before this one (their lines in tracebacks)


_loaded: _Loaded | None = None
_bundle_root: str | None = None  # the loaded bundle's directory on sys.path (LanceDB's ``code=[module]``)


def _setup_failure(exc: BaseException, task: dict) -> TaskFailure:
    """Phase ``setup``: the exception line and where in the artifact it happened (the kernel maps
    ``<gpu_function …>:N`` to the cell's line), with the frames' locals and, as the failing row, the task's first
    (docs/ARCHITECTURE.md, "Debugging a failure")."""
    filename = task["filename"]
    message = _exception_line(exc)
    if isinstance(exc, ImportError):
        name = getattr(exc, "name", None) or "NAME"
        # The module's top-level name; its distribution's name may differ (cv2: opencv-python).
        message += f"; declare the package: pip={name.split('.')[0]} (the version's environment then has it)"
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == filename]
    if isinstance(exc, SyntaxError) and exc.filename == filename and exc.lineno:
        lines.append(exc.lineno)
    if lines:
        message += f" (at {filename}:{lines[-1]})"
    frames = capture_frames(exc.__traceback__, (filename,), (task.get("env") or {}).values())
    failure = TaskFailure("setup", message, _user_traceback(exc, filename), frames=frames, rows=(0, 1))
    failure.original = exc  # call_here's caller debugs the exception itself
    return failure


def _load(task: dict, key: tuple[str, ...]) -> _Loaded:
    """Execute the artifact in a fresh module and make its entry ready to call (a class entry is
    instantiated and set up); failures are phase ``setup``."""
    filename = task["filename"]
    module = types.ModuleType(_ARTIFACT_MODULE)
    module.__file__ = filename
    import builtins

    module.__builtins__ = {**_STAND_INS, **vars(builtins)}  # type: ignore[attr-defined]  # real builtins win where they exist
    sys.modules[_ARTIFACT_MODULE] = module  # dataclasses, pickle and numba look the module up by name
    try:
        _mount_bundle(task["artifact_b64"])
        source, code = _compiled(task["artifact_b64"], filename)
        _cache_lines(filename, source)
        exec(code, module.__dict__)
        entry = getattr(module, task["entrypoint"], None)
        if not callable(entry):
            raise TaskFailure("setup", f"the artifact defines no function named {task['entrypoint']!r}")
        init = task.get("init")
        if not isinstance(entry, type):
            if init:
                raise TaskFailure("setup", f"{task['entrypoint']!r} is a function: initialization values are a class's")
            return _Loaded(key, module, entry, None)
        instance = entry(**(init or {}))  # LanceDB 0.40's initialization: this set of values' own instance
        setup = getattr(instance, "setup", None)
        if callable(setup):
            setup()
        return _Loaded(key, module, instance, instance)
    except TaskFailure:
        _forget(filename)
        raise
    except BaseException as exc:
        _forget(filename)
        raise _setup_failure(exc, task) from None


def _cache_lines(filename: str, source: str) -> None:
    """The artifact's lines where tracebacks and debuggers read them."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)


def _forget(filename: str, *earlier: str) -> None:
    """Drop the artifact's module, its lines and the notebook modules it shipped."""
    for name in (filename, *earlier):
        linecache.cache.pop(name, None)
    _drop_module()


def _drop_module() -> None:
    """Drop the artifact's module and the notebook modules it shipped."""
    sys.modules.pop(_ARTIFACT_MODULE, None)
    shipped = sys.modules.get("lancefn_jupyter.local_modules")
    if shipped is not None:  # the notebook's modules of this version must not serve another
        shipped.uninstall()
    _unmount_bundle()


def _mount_bundle(artifact_b64: str) -> None:
    """A bundle's modules (not its entry, executed as the version's module) written into a directory of this worker's
    own (0700) at the front of ``sys.path``, for this version only (:func:`_unmount_bundle`); the paths are checked
    again here, before anything is written. Nothing for a callable artifact."""
    global _bundle_root
    files = bundles.bundle_files(base64.b64decode(artifact_b64))
    if files is None:
        return
    problem = bundles.bundle_problem(files)
    if problem:
        raise TaskFailure("setup", problem)
    import tempfile

    _bundle_root = root = tempfile.mkdtemp(prefix="lancefn-bundle-")
    for path, text in files.items():
        if path != bundles.ENTRY_FILE:
            target = os.path.join(root, *path.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "x", encoding="utf-8", errors="surrogatepass") as file:
                file.write(text)
    sys.path.insert(0, root)


def _unmount_bundle() -> None:
    """The loaded bundle's directory (if any) off ``sys.path`` and gone, with the modules imported from it."""
    global _bundle_root
    if _bundle_root is not None:
        _remove_bundle(_bundle_root)
        _bundle_root = None


def _remove_bundle(root: str) -> None:
    """``root`` off ``sys.path``, the modules imported from it dropped (the next version imports its own), removed."""
    import importlib
    import shutil

    while root in sys.path:
        sys.path.remove(root)
    inside = root + os.sep
    for name, module in list(sys.modules.items()):
        places = [getattr(module, "__file__", None) or "", *(getattr(module, "__path__", None) or ())]
        if any(str(place).startswith(inside) for place in places):
            del sys.modules[name]
    shutil.rmtree(root, ignore_errors=True)
    importlib.invalidate_caches()


def _teardown(instance: object) -> None:
    """A class entry's ``teardown()`` (or LanceDB's ``close()``), bounded by ``TEARDOWN_S``; its errors go to stderr,
    never up."""
    teardown = getattr(instance, "teardown", None)
    if not callable(teardown):
        teardown = getattr(instance, "close", None)
    if not callable(teardown):
        return

    def run() -> None:
        try:
            teardown()
        except BaseException:
            traceback.print_exc()

    thread = threading.Thread(target=run, name="lancefn-teardown", daemon=True)
    thread.start()
    thread.join(TEARDOWN_S)
    if thread.is_alive():
        print(f"teardown() did not return within {TEARDOWN_S:g} s; the worker goes on without it", file=sys.stderr)
    flush_stdio()


def call_here(task: dict) -> object:
    """Load ``task``'s artifact afresh in *this* process and call its entry on the task's first row, letting what it
    raises go up with its frames: the kernel's post-mortem (docs/ARCHITECTURE.md, "Debugging a failure"). The
    version a worker holds is untouched; a class entry's ``teardown`` runs after the call. A setup failure raises the
    exception that failed the setup, with its frames."""
    try:
        loaded = _load(task, (task["filename"], task["artifact_b64"], task["entrypoint"]))
    except TaskFailure as failure:
        if failure.original is None:
            raise
        _cache_lines(task["filename"], _compiled(task["artifact_b64"], task["filename"])[0])  # _load forgot them
        raise failure.original from None
    try:
        return loaded.call(**_task_rows(task)[0])
    finally:
        if loaded.instance is not None:
            _teardown(loaded.instance)
        _drop_module()  # its source stays in linecache: the debugger lists it


def release() -> None:
    """Drop the loaded version, tearing it down first (a new version, or the worker ends)."""
    global _loaded
    loaded, _loaded = _loaded, None
    if loaded is None:
        return
    if loaded.instance is not None:
        _teardown(loaded.instance)
    _forget(loaded.key[0], *loaded.filenames)


def _entry(task: dict, timings: dict[str, float]) -> Callable[..., object]:
    """What each row calls: the held version's when the task is of it, else loaded now
    (``timings["setup_ms"]``)."""
    global _loaded
    init = task.get("init")
    init_key = json.dumps(init, sort_keys=True, separators=(",", ":")) if init is not None else ""
    key = (task["filename"], task["artifact_b64"], task["entrypoint"], init_key)
    per_job = task.get("state") == "per_job"
    if _loaded is not None and not per_job and _loaded.key == key:
        return _loaded.call
    digest = task.get("setup_digest") if not per_job else None
    if _loaded is not None and digest and _loaded.setup_digest == digest:
        started = time.perf_counter()
        if _rebind(_loaded, task, key):
            timings["rebind_ms"] = (time.perf_counter() - started) * 1000.0
            timings["setup_reused"] = 1
            return _loaded.call
    release()
    started = time.perf_counter()
    try:
        _loaded = _load(task, key)
        _loaded.setup_digest = digest
    finally:
        timings["setup_ms"] = (time.perf_counter() - started) * 1000.0
    return _loaded.call


def _rebind(loaded: _Loaded, task: dict, key: tuple[str, ...]) -> bool:
    """Run ``task``'s version on the live module of ``loaded``, a version with the same setup digest (docs/ARCHITECTURE.md,
    "Setup reuse"): only its rebound definitions (functions, and methods of the entry class set on the live class) are
    executed. False, with nothing to undo (the caller releases the module), when the two setup parts differ after all
    or the new definitions fail to execute."""
    filename, entrypoint = task["filename"], task["entrypoint"]
    try:
        source, _code = _compiled(task["artifact_b64"], filename)
        old_source = base64.b64decode(loaded.key[1]).decode("utf-8")
        new, old = setup_part(source, entrypoint), setup_part(old_source, loaded.key[2])
        if new is None or old is None or new.digest != old.digest or entrypoint != loaded.key[2]:
            return False  # the worker checks what the plane said: only the rebound definitions may differ
        if key[3:] != loaded.key[3:]:
            return False  # other class init values: another instance (docs/ARCHITECTURE.md, "Warm state")
        _cache_lines(filename, source)
        namespace = loaded.module.__dict__
        for name in set(old.functions) - set(new.functions):
            namespace.pop(name, None)  # gone from the new version: a fresh module would not have it
        tree = ast.parse(source)
        for statement in tree.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name in new.functions:
                exec(compile(ast.Module([statement], []), filename, "exec", dont_inherit=True), namespace)
        if new.entry_class:
            _rebind_methods(tree, new, old, namespace, filename, entrypoint)
        else:
            loaded.call = namespace[entrypoint]
    except BaseException:
        traceback.print_exc()  # to the job's log: it then runs on a freshly loaded module
        return False
    loaded.filenames = (*loaded.filenames, loaded.key[0])
    loaded.key = key
    return True


def _rebind_methods(
    tree: ast.Module, new: SetupPart, old: SetupPart, namespace: dict, filename: str, entry: str
) -> None:
    """The new version's rebound methods of the entry class, set on the live class (its instance keeps its state)."""
    live = namespace[entry]
    node = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == entry)
    body: list[ast.stmt] = [
        s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name in new.methods
    ]
    shell = ast.copy_location(class_def(node, body or [ast.Pass()], bare=True), node)
    scratch: dict = {}
    exec(
        compile(ast.fix_missing_locations(ast.Module([shell], [])), filename, "exec", dont_inherit=True),
        namespace,
        scratch,
    )
    made = scratch[entry]
    for name in set(old.methods) - set(new.methods):
        if name in vars(live):
            delattr(live, name)
    for name in new.methods:
        value = vars(made)[name]
        for function in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            code = getattr(function, "__code__", None)
            if code is not None and "__class__" in code.co_freevars:  # zero-argument super() sees the live class
                function.__closure__[code.co_freevars.index("__class__")].cell_contents = live  # type: ignore[union-attr]
        setattr(live, name, value)


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


def python_mismatch(wanted: str | None) -> str | None:
    """Why this interpreter cannot run a version that asks for Python ``wanted`` (``MAJOR.MINOR``), or None."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not wanted or wanted == running:
        return None
    return (
        f"this version needs Python {wanted}; the worker runs Python {running} ({sys.executable}). "
        f"Run it where Python {wanted} is available (the local executor builds an environment of it when the "
        f"machine has that interpreter), or register it with python_version={running}"
    )


def _environment_check(task: dict) -> None:
    """Phase ``environment``: the worker's interpreter and packages are what the version declared."""
    mismatch = python_mismatch(task.get("python_version"))
    if mismatch:
        raise TaskFailure("environment", mismatch)
    missing = missing_packages(task.get("packages") or ())
    if missing:
        raise TaskFailure(
            "environment",
            f"declared packages are not available in the worker's Python environment ({sys.executable}): "
            + ", ".join(f"{text} ({reason})" for text, reason in missing)
            + ". Declared pip packages are built into the version's own environment where the executor builds"
            " environments (local: in its cache; Ray: runtime_env); conda packages are never installed for you:"
            " install them into the base environment the workers run on",
        )


def _skipped(exc: BaseException, filename: str) -> str:
    """A skipped row's ``error`` cell: the JSON ``{"message", "traceback"}`` ("Batched functions")."""
    import json

    return json.dumps({"message": _exception_line(exc), "traceback": _user_traceback(exc, filename)})


def _run_rows(task: dict, proto: Protocol, timings: dict[str, float]) -> dict:
    """Call the entry (per row, or once per task for a batched version); ``result_event``'s arguments."""
    _environment_check(task)
    entry = _entry(task, timings)
    if task.get("batched"):
        return _run_batched(task, entry, proto, timings)
    rows = _task_rows(task)
    skip = task.get("on_error") == "skip"
    struct = task.get("output_fields")
    results: list = []
    errors: list[str | None] = []
    progress = _Progress(proto)
    started = time.perf_counter()
    try:
        for index, row in enumerate(rows):
            set_row(index)
            try:
                value = entry(**row)
            except BaseException as exc:  # SystemExit/KeyboardInterrupt from user code fail the task, not the worker
                if skip and isinstance(exc, Exception):  # on_error="skip": the row's result is null
                    results.append(None)
                    errors.append(_skipped(exc, task["filename"]))
                    continue
                where = f" (row {index} of {len(rows)})" if len(rows) > 1 else ""
                raise _run_failure(exc, task, index, index + 1, _exception_line(exc) + where) from None
            if struct is not None:
                _check_struct(value, struct, f"the result of row {index}" if len(rows) > 1 else "the result")
            results.append(value)
            errors.append(None)
            if index + 1 < len(rows):  # the last row's count rides on the result (one event less per job)
                progress.update(index + 1)
    finally:
        set_row(None)
        timings["run_ms"] = (time.perf_counter() - started) * 1000.0
        progress.close()  # before the final event, so no progress of this task can follow it
    if struct is not None:
        _check_struct_types(results, task.get("output_field_types") or {}, len(rows) > 1)
    return {"values": results, "errors": errors if any(e is not None for e in errors) else None}


def _check_struct(value: object, fields: dict, where: str) -> None:
    """A ``named_struct`` output's row: a dict of exactly its fields, a non-nullable one not None (phase ``result``)."""
    names = ", ".join(fields)
    if not isinstance(value, dict):
        raise TaskFailure(
            "result", f"{where} is {type(value).__name__}, not a dict of the named_struct fields ({names})"
        )
    missing = [name for name in fields if name not in value]
    extra = [name for name in value if name not in fields]
    if missing or extra:
        wrong = f"lacks field {missing[0]!r}" if missing else f"has field {extra[0]!r}, which is not an output field"
        raise TaskFailure("result", f"{where} {wrong}; return a dict of exactly the named_struct fields ({names})")
    nulls = [name for name, nullable in fields.items() if not nullable and value[name] is None]
    if nulls:
        raise TaskFailure("result", f"{where}: field {nulls[0]!r} is None but not nullable; give it a value")


def _check_struct_types(values: list, types: dict, many: bool) -> None:
    """Each ``named_struct`` field's values convert to its Arrow type (phase ``result`` naming the row, field, type
    and the value's Python type). The whole column is converted once; only on failure are the rows looked at. A type
    this worker cannot spell is left to the reader."""
    import pyarrow as pa

    try:
        fields = {name: dataplane.arrow_type(sig_type) for name, sig_type in types.items()}
    except (ValueError, KeyError, TypeError):
        return
    bad = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError)
    try:
        pa.array(values, type=pa.struct([pa.field(name, kind) for name, kind in fields.items()]))
        return
    except bad:
        pass
    for index, value in enumerate(values):
        for name, kind in fields.items():
            try:
                pa.array([value[name]], type=kind)
            except bad as error:
                where = f"the result of row {index}" if many else "the result"
                raise TaskFailure(
                    "result",
                    f"{where}: field {name!r} is {type(value[name]).__name__}, which does not convert to "
                    f"{types[name]} ({error}); return a value of the field's type",
                ) from None


def _batch_arguments(task: dict) -> tuple[dict, int]:
    """A batched task's arguments, one batch per parameter in its form, and the row count: built from
    the rows column by column (no per-row Python for ``ndarray`` / ``arrow`` forms)."""
    types = task.get("input_types") or {}
    forms = task["batched"]["inputs"]
    arrow = task.get("rows_file") or task.get("rows_ipc")
    try:
        if arrow is None:
            rows = task["rows"]
            if all(form == "list" and not dataplane.is_data_type(types[p]) for p, form in forms.items()):
                given = [p for p in forms if any(p in row for row in rows)]  # the absent ones take their default
                return {p: [row[p] for row in rows] for p in given}, len(rows)
            import pyarrow as pa

            if "record_batch" in forms.values():
                (param,) = forms
                if types[param] != dataplane.RECORD_BATCH_TYPE:  # a LanceDB RecordBatch UDF: one struct per row
                    column = pa.array([row[param] for row in rows], type=dataplane.arrow_type(types[param]))
                    return {param: _struct_batch(column, types[param], param)}, len(rows)
                table = pa.Table.from_pylist(rows)
            else:
                table = dataplane.encode_rows(rows, types)
        else:
            import pyarrow as pa

            table = dataplane.read_ipc(arrow)
        if "record_batch" in forms.values():
            (param,) = forms
            if types[param] != dataplane.RECORD_BATCH_TYPE:
                return {param: _struct_batch(table.column(param), types[param], param)}, table.num_rows
            schema = pa.schema([field.remove_metadata() for field in table.schema if field.name != "_"])
            columns = [table.column(field.name).combine_chunks() for field in schema]
            return {param: pa.RecordBatch.from_arrays(columns, schema=schema)}, table.num_rows
        args = {
            field.name: dataplane.batch_value(
                table.column(field.name), types[field.name], forms[field.name], writable=True
            )
            for field in table.schema
            if field.name != "_"
        }
        return args, table.num_rows
    except (dataplane.DataPlaneError, OSError, KeyError, ValueError, TypeError) as error:
        raise TaskFailure("validation", f"the job's rows cannot be made into a batch: {error}") from None


def _struct_batch(column: Any, sig_type: str, param: str) -> Any:
    """A LanceDB RecordBatch UDF's chunk: its struct column (one struct per row) as the RecordBatch of its fields
    (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"). A null row has no place in a RecordBatch, and a non-nullable
    field takes no null: each is a :class:`dataplane.DataPlaneError` naming the row (phase ``validation``)."""
    import pyarrow as pa

    kind = dataplane.arrow_type(sig_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.type != kind:
        try:
            column = column.cast(kind)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
            raise dataplane.DataPlaneError(f"parameter {param!r} is {column.type}, not {kind} ({error})") from None
    if column.null_count:
        row = column.is_null().index(True).as_py()
        raise dataplane.DataPlaneError(
            f"row {row} of parameter {param!r} is null, and a RecordBatch has no null rows; give every row a struct "
            "(its fields may be null where the input_schema allows)"
        )
    for field, values in zip(kind, column.flatten(), strict=True):
        if not field.nullable and values.null_count:
            row = values.is_null().index(True).as_py()
            raise dataplane.DataPlaneError(
                f"field {field.name!r} of parameter {param!r} is null in row {row}, but the input_schema declares "
                "it not nullable; give it a value"
            )
    return pa.RecordBatch.from_struct_array(column)


def _slice(value: object, start: int, end: int) -> object:
    """Rows ``[start, end)`` of a batch in any form (list, ndarray, pyarrow Array / RecordBatch)."""
    if hasattr(value, "slice") and not isinstance(value, list):  # pyarrow: zero-copy
        return value.slice(start, end - start)
    return value[start:end]  # type: ignore[index]


def _run_batched(task: dict, entry: Callable[..., object], proto: Protocol, timings: dict[str, float]) -> dict:
    """One call over every row of the task (docs/ARCHITECTURE.md, "Batched functions"); with
    ``on_error="skip"`` a failing call is bisected until the failing single rows are known, and those
    rows' results are null. A result of the wrong length fails the task in phase ``result``."""
    args, rows = _batch_arguments(task)
    output_type, form = task.get("output_type") or "", task["batched"]["output"]
    skip = task.get("on_error") == "skip"
    parts: list[tuple[int, int, object]] = []  # (start, end, result) of each call that succeeded
    errors: list = [None] * rows
    progress = _Progress(proto)

    def call(start: int, end: int) -> None:
        part = args if (start, end) == (0, rows) else {p: _slice(v, start, end) for p, v in args.items()}
        try:
            value = entry(**part)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from user code fail the task, not the worker
            if not skip or not isinstance(exc, Exception):
                raise _run_failure(exc, task, start, end, _exception_line(exc)) from None
            if end - start == 1:
                errors[start] = _skipped(exc, task["filename"])
                return
            middle = (start + end) // 2
            call(start, middle)
            call(middle, end)
            return
        try:
            got = dataplane.batch_length(value, form, "the result")
        except dataplane.DataPlaneError as error:
            raise TaskFailure("result", str(error)) from None
        if got != end - start:
            raise TaskFailure("result", f"the result: expected {end - start} values (one per row), got {got}")
        parts.append((start, end, value))
        if end < rows:
            progress.update(end)

    started = time.perf_counter()
    try:
        call(0, rows)
    finally:
        timings["run_ms"] = (time.perf_counter() - started) * 1000.0
        progress.close()
    skipped = any(e is not None for e in errors)
    if form == "list":
        values: list = [None] * rows
        for start, end, value in parts:
            values[start:end] = list(value)  # type: ignore[call-overload]
        return {"values": values, "errors": errors if skipped else None}
    if not skipped:
        (_, _, value) = parts[0]
        try:
            column = dataplane.batch_column(value, output_type, form, coerce=False, where=lambda _i: "the result")
        except dataplane.DataPlaneError as error:
            raise TaskFailure("result", str(error)) from None
        return {"values": None, "column": column, "batch": value}
    return {"values": None, "column": _merged_column(parts, rows, output_type, form), "batch": None, "errors": errors}


def _merged_column(parts: list, rows: int, output_type: str, form: str) -> object:
    """The result column of a bisected call: each part's rows, null for the rows between them."""
    import pyarrow as pa

    try:
        columns = [
            (start, end, dataplane.batch_column(v, output_type, form, coerce=False, where=lambda _i: "the result"))
            for start, end, v in sorted(parts, key=lambda part: part[0])
        ]
    except dataplane.DataPlaneError as error:
        raise TaskFailure("result", str(error)) from None
    if columns:
        kind = columns[0][2].type
    else:  # every row skipped
        kind = (
            dataplane.encode_column([None], output_type, coerce=False, where=str).type
            if form == "ndarray"
            else pa.null()
        )
    pieces, at = [], 0
    for start, end, column in columns:
        if start > at:
            pieces.append(pa.nulls(start - at, kind))
        pieces.append(column)
        at = end
    if at < rows:
        pieces.append(pa.nulls(rows - at, kind))
    try:
        return pa.concat_arrays(pieces)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
        raise TaskFailure("result", f"the result: the calls' results differ in type ({error})") from None


_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


_statm: tuple[int, int] | None = None  # (pid, descriptor) of /proc/self/statm, opened by that process


def _rss_mb() -> float:
    """This process's resident memory now (``/proc/self/statm``; the peak from getrusage elsewhere)."""
    global _statm
    try:  # read after every task: kept open, one system call (a forked child opens its own)
        pid = os.getpid()
        if _statm is None or _statm[0] != pid:
            _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 256, 0).split()[1]) * _PAGE_MB
    except (OSError, IndexError, ValueError):
        _statm = None  # user code may have closed it: opened again next time
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def serve(task: dict, proto: Protocol, flush_output: Callable[[], None]) -> None:
    """Run ``task`` and send its outcome, with its timings, the worker's memory and the task's id, on ``proto``;
    ``flush_output`` returns once what user code wrote so far has gone out, so a task's logs always
    precede its outcome.  The version stays loaded for the next task unless it is ``per_job``. A failure's message
    and traceback are capped (``cap_text``), so the outcome fits a protocol line ("Worker protocol")."""
    timings = {"setup_ms": 0.0, "run_ms": 0.0}
    keep = reap.children() if reap.has_children() else ()  # a Ray worker's own children are not the job's
    try:
        try:
            event = result_event(task, **_run_rows(task, proto, timings))
        finally:
            if task.get("state") == "per_job":  # torn down before the outcome: part of its job
                release()
            reap.sweep(keep)  # nothing the job started outlives it ("Job processes")
    except TaskFailure as failure:
        flush_output()
        proto.send(
            event="failed",
            phase=failure.phase,
            message=cap_text(failure.message),
            traceback=None if failure.traceback is None else cap_text(failure.traceback),
            **({} if failure.frames is None else {"frames": failure.frames}),
            **({} if failure.rows is None else {"failing_rows": list(failure.rows)}),
            timings=timings,
            rss_mb=_rss_mb(),
            task_id=task.get("task_id"),
        )
    else:
        flush_output()
        frame = event.pop("result_frame", b"")
        outcome = {"timings": timings, "rss_mb": _rss_mb(), "task_id": task.get("task_id")}
        if frame:
            proto.send_frame(frame, event="result", **event, **outcome)
        else:
            proto.send(event="result", **event, **outcome)


def run_task_inline(task: dict, send: Callable[..., None]) -> dict:
    """Run one task (the protocol's task dict) in *this* process and return its final event.

    For executors that already are a worker process (the Ray executor runs this inside a Ray
    task): ``log``/``progress`` events go to ``send(**event)`` as they would on the protocol
    fd, and the ``result``/``failed`` event is returned instead of sent.  Capturing fds 1/2 is
    the caller's business; Python and C stdio buffers are flushed before this returns.
    """
    inline = _Inline(send)
    serve(task, inline, flush_stdio)  # type: ignore[arg-type]  # duck-typed Protocol
    return inline.final


class _Inline:
    """``serve``'s protocol for :func:`run_task_inline`: the final event kept, the others sent on."""

    __slots__ = ("_send", "final")

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self.final: dict[str, object] = {}

    def send(self, **event: object) -> None:
        if event.get("event") in FINAL_EVENTS:
            self.final.update(event)
        else:
            self._send(**event)
