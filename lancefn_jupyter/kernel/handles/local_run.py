"""``.local()``: run a function version's artifact on this machine with numba CUDA.

The artifact runs in a worker subprocess (``worker/main.py``, the same protocol the local
executor speaks) because real vs simulated CUDA is chosen by ``NUMBA_ENABLE_CUDASIM`` before
numba is imported: the notebook kernel itself can't switch. Modes:

* ``"gpu"``: a real GPU (the kernel's ``CUDA_VISIBLE_DEVICES`` applies); an error if none is usable;
* ``"simulator"``: the numba CUDA simulator (slow: keep grids to about a thousand threads);
* ``"auto"``: a real GPU when one is usable here, else the simulator.  ``NUMBA_ENABLE_CUDASIM=1``
  in the kernel's environment (as Binder sets it) means "simulator" on purpose.

The version's environment (pip packages, ``python_version``; docs/ARCHITECTURE.md, "Environments") is built and
used on the kernel's side, with the kernel's interpreter as the base, in the same cache as the embedded control
plane's (``LANCEFN_ENV_CACHE``, else ``default_cache_dir``): the worker then starts that environment's Python and
holds a lease on it. A refusal (an image, a Python this machine lacks) or a failed build raises
:class:`LocalRunError` in phase ``environment``.

A warm worker is kept per (mode, function env, version, environment): it keeps the version's module loaded,
so repeated calls of an unchanged version do not execute it again (docs/ARCHITECTURE.md, "Warm
state").  At most ``MAX_WORKERS`` are kept, the least recently used stopped (its teardown runs);
all are killed at interpreter exit.  A worker that crashed, timed out or was interrupted (Ctrl-C)
is discarded.
"""

from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from lancefn_jupyter.kernel.client.logs import log
from lancefn_jupyter.worker.process import ProtocolError, WorkerProcess, WorkerStartError, WorkerTask, describe_exit

if TYPE_CHECKING:
    from lancefn_jupyter.environments.cache import Environment, EnvironmentCache
    from lancefn_jupyter.environments.request import EnvironmentRequest
    from lancefn_jupyter.wire.models import FunctionSignature

__all__ = ["MAX_WORKERS", "LocalRun", "LocalRunError", "gpu_available", "run_local"]

Mode = Literal["auto", "gpu", "simulator"]


@dataclass(frozen=True)
class LocalRun:
    results: list
    device: str  # the GPU model, or "CUDA simulator"
    logs: list[str] = field(default_factory=list)  # stdout and stderr lines, in arrival order


class LocalRunError(Exception):
    """The local run failed; ``phase`` is a JobFailure phase (environment, setup, run, result, worker, timeout)."""

    def __init__(self, phase: str, message: str, traceback: str | None = None, logs: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.phase, self.message, self.traceback, self.logs = phase, message, traceback, list(logs)

    def __str__(self) -> str:
        return f"{self.message}\n\n{self.traceback}" if self.traceback else self.message


@functools.cache
def gpu_available() -> bool:
    """Whether numba can use a real CUDA GPU here; probed once per process, cheaply first."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: no GPU, quietly
        return False
    if count == 0:
        return False
    # NVML sees a GPU; ask numba in a subprocess (driver, toolkit, CUDA_VISIBLE_DEVICES all apply)
    # so this kernel never imports numba.cuda itself.
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "from numba import cuda; raise SystemExit(0 if cuda.is_available() else 1)"],
            capture_output=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0


def _use_simulator(mode: Mode) -> bool:
    if mode == "simulator":
        return True
    if mode == "gpu":
        if not gpu_available():
            raise LocalRunError(
                "environment",
                "no usable CUDA GPU on this machine (NVML/numba found none); "
                "use mode='simulator' or mode='auto' to run on the numba CUDA simulator",
            )
        return False
    if mode == "auto":
        return not gpu_available()
    raise ValueError(f"mode must be 'auto', 'gpu' or 'simulator', not {mode!r}")


def _worker_env(simulated: bool, env: Mapping[str, str] | None) -> dict[str, str]:
    worker_env = {**os.environ, **(env or {})}
    worker_env.pop("NUMBA_ENABLE_CUDASIM", None)
    if simulated:
        worker_env["NUMBA_ENABLE_CUDASIM"] = "1"
        worker_env["CUDA_VISIBLE_DEVICES"] = ""
    return worker_env


MAX_WORKERS = 2  # warm workers kept (each may hold a model, and on a GPU a CUDA context)

# (simulated?, artifact filename, artifact digest, (environment request, GPU function?) or None): a worker holds one
# loaded version, on the environment built for that request (it holds a lease, so the environment stays as built)
_Key = tuple[bool, str, str, "tuple[EnvironmentRequest, bool] | None"]
_lock = threading.Lock()  # one local run at a time; they share the warm workers
_workers: collections.OrderedDict[_Key, WorkerProcess] = collections.OrderedDict()  # least recently used first
_cache: EnvironmentCache | None = None  # made on the first run that names an environment


def _environment_cache() -> EnvironmentCache:
    """The kernel's environment cache: the embedded control plane's directory rule, the kernel's Python as base."""
    global _cache
    if _cache is None:
        from lancefn_jupyter.environments.cache import EnvironmentCache, default_cache_dir

        shared = hasattr(os, "geteuid") and os.geteuid() == 0
        _cache = EnvironmentCache(default_cache_dir(shared), base_python=sys.executable, shared=shared)
    return _cache


def _environment(request: EnvironmentRequest | None, gpu: bool = False) -> Environment | None:
    """The built environment the worker must start (built now if needed), or None: the kernel's own Python."""
    if request is None:
        return None
    from lancefn_jupyter.environments.cache import EnvironmentFailure

    cache = _environment_cache()
    problem = cache.problem(request)
    if problem is not None:
        raise LocalRunError("environment", problem)
    if not cache.needs_build(request):
        return None
    environment = cache.lookup(request, gpu=gpu)
    if environment is not None:
        return environment
    started = time.monotonic()
    # A first build takes seconds (uv resolves, downloads and installs): say so, then say when it is ready.
    print(f"[lancefn] building the environment for .local(): {_describe(request)} …", file=sys.stderr)
    try:
        environment = cache.ensure(request, log=lambda lines: log.info("[env] %s", "\n".join(lines)), gpu=gpu)
    except EnvironmentFailure as failure:
        raise LocalRunError("environment", str(failure), logs=failure.lines) from None
    if environment is not None:
        print(f"[lancefn] environment ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return environment


def _describe(request: EnvironmentRequest) -> str:
    what = ", ".join(request.packages) if request.packages else "no packages"
    return what + (f", Python {request.python_version}" if request.python_version else "")


def _leased(request: EnvironmentRequest | None, gpu: bool) -> tuple[Environment | None, int | None]:
    """The environment and a lease on it (a descriptor for the worker to inherit), built again if it was evicted
    between the build and the lease."""
    for _ in range(3):
        environment = _environment(request, gpu)
        if environment is None:
            return None, None
        fd = _environment_cache().lease(environment)
        if fd is not None:
            return environment, fd
    raise LocalRunError("environment", "the environment was evicted from the cache as soon as it was built; try again")


def _warm_worker(key: _Key, env: dict[str, str]) -> WorkerProcess:
    worker = _workers.pop(key, None)
    if worker is not None and (not worker.alive() or worker.env != env):
        worker.stop()
        worker = None
    if worker is None:
        while len(_workers) >= MAX_WORKERS:
            _workers.popitem(last=False)[1].stop()
        request, gpu = key[3] or (None, False)
        environment, lease = _leased(request, gpu)
        try:
            if environment is None:
                worker = WorkerProcess(env)
            else:
                worker = WorkerProcess(env, python=environment.python, pass_fds=(lease,) if lease is not None else ())
        finally:
            if lease is not None:
                os.close(lease)  # the worker holds its own copy for its life
    _workers[key] = worker
    return worker


def _has_environment(request: EnvironmentRequest | None) -> bool:
    """Whether ``request`` asks anything of the Python (packages, another Python than the kernel's, an image); else
    the run needs no environment cache at all."""
    if request is None:
        return False
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    return bool(request.packages or request.image or request.python_version not in (None, here))


def _discard(key: _Key) -> None:
    worker = _workers.pop(key, None)
    if worker is not None:
        worker.kill()


@atexit.register
def _shutdown() -> None:
    for key in list(_workers):
        _discard(key)


def run_local(
    artifact: bytes,
    entrypoint: str,
    filename: str,
    rows: list[dict],
    *,
    packages: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    mode: Mode = "auto",
    timeout_s: float | None = None,
    on_log: Callable[[str, list[str]], None] | None = None,
    signature: FunctionSignature | None = None,
    arrow_rows: Any = None,
    state: str = "per_worker",
    environment: EnvironmentRequest | None = None,
    gpu: bool = False,
) -> LocalRun:
    """Call ``entrypoint`` of ``artifact`` once per row in a local worker; see the module docstring.

    ``on_log(stream, lines)`` is called as the function prints, for live output in a notebook.
    ``state``: the version's ``runtime.state`` (``per_job`` executes the module for every call).
    ``environment``: the version's environment request (built and used here; None: the kernel's Python); ``gpu``:
    the version asks for GPUs (another Python's environment then gets the CUDA stack too).
    Raises :class:`LocalRunError` with the failure's phase, message and user-only traceback.
    """
    with tempfile.TemporaryDirectory(prefix="lancefn-local-") as scratch:
        data: dict[str, object] = {}
        if signature is not None:  # the Arrow data plane, as on the control plane (docs/ARCHITECTURE.md)
            from lancefn_jupyter.wire import dataplane

            # Input/output types, and a batched version's forms ("Batched functions").
            data = {**dataplane.task_fields(signature.to_wire()), "result_file": os.path.join(scratch, "result.arrow")}
            if arrow_rows is not None:  # a pyarrow Table of the rows (dataplane.encode_rows)
                rows_file = os.path.join(scratch, "rows.arrow")
                data["rows_file"] = rows_file
                dataplane.write_ipc_file(rows_file, arrow_rows, durable=False)
        task = WorkerTask("local", artifact, entrypoint, filename, rows, packages, data=data, state=state)
        wanted = (environment, gpu) if environment is not None and _has_environment(environment) else None
        batched = signature.output.form if signature is not None and signature.batched else None
        return _run(task, env, mode, timeout_s, on_log, wanted, batched)


def _run(
    task: WorkerTask,
    env: Mapping[str, str] | None,
    mode: Mode,
    timeout_s: float | None,
    on_log: Callable[[str, list[str]], None] | None,
    environment: tuple[EnvironmentRequest, bool] | None = None,
    batched: str | None = None,
) -> LocalRun:
    """``batched``: a batched version's output form; its one result is then the batch in that form."""
    simulated = _use_simulator(mode)
    worker_env = _worker_env(simulated, env)
    key = (simulated, task.filename, hashlib.sha256(task.artifact).hexdigest(), environment)
    logs: list[str] = []
    with _lock:
        try:
            worker = _warm_worker(key, worker_env)
        except WorkerStartError as exc:
            raise LocalRunError("worker", str(exc)) from None
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            worker.kill()

        timer = threading.Timer(timeout_s, expire) if timeout_s is not None else None
        final = None
        try:
            worker.start_task(task)
            if timer is not None:
                timer.daemon = True
                timer.start()
            for event in worker.events():
                if event["event"] == "log":
                    logs.extend(event["lines"])
                    if on_log is not None:
                        on_log(event["stream"], event["lines"])
                elif event["event"] in ("result", "failed"):
                    final = event
        except ProtocolError as error:  # a line too long, or no event: the worker cannot be trusted again
            _discard(key)
            raise LocalRunError(error.phase, error.message, logs=logs) from None
        except BaseException:  # Ctrl-C (or on_log raising) mid-run: the worker's state is unknown
            _discard(key)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if final is None:  # the worker is gone: killed by the timeout or crashed
            returncode = worker.wait()
            _discard(key)
            if expired.is_set():
                raise LocalRunError(
                    "timeout", f"the local run took longer than {timeout_s:g} s and was stopped", logs=logs
                )
            raise LocalRunError("worker", describe_exit(returncode), logs=logs)
        if final["event"] == "failed" and final["phase"] == "setup":  # never reused ("Warm state")
            _workers.pop(key).stop()
    if final["event"] == "failed":
        raise LocalRunError(final["phase"], final["message"], final.get("traceback"), logs)
    if "result_file" in final:
        from lancefn_jupyter.wire import dataplane

        with open(final["result_file"], "rb") as source:  # read, not mapped: the scratch dir goes next
            table = dataplane.read_ipc(source.read())
        # A batched version's result is the batch in its declared form ("Batched functions").
        results = [dataplane.decode_results(table, batched)] if batched else dataplane.decode_results(table)
    else:
        results = [final["results"]] if batched else final["results"]
    return LocalRun(results=results, device=worker.device, logs=logs)
