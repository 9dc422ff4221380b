"""Local executor: each job runs on a warm worker subprocess of this machine.

A worker's GPUs are fixed when the process starts (``CUDA_VISIBLE_DEVICES``, and
``NUMBA_ENABLE_CUDASIM=1`` for simulated classes, must be set before CUDA/numba initialise), and
a worker that ran a job of (namespace N, version V) only ever runs (N, V) again: state one
version sets (a patched ``builtins.open``, a module global) never reaches another version or
team.  So warm workers are pooled per *key* = (devices, simulated, owner), owner being
(namespace, name, version), or ``None`` for a *fresh* worker that has run nothing yet:

* a task takes the idle worker of its key, else a fresh one for its devices, else starts one; when
  the task ends normally (result, or a failure the worker survived) the worker goes back idle
  under its owner's key, and a fresh one for its devices is started in the background, once no
  job runs on them, unless one is idle already (so the next new version finds one ready);
* the function's env travels with the task (never at exec), so it is in no ``/proc/*/environ``;
* a worker that may be left in a bad state (crash, timeout, cancel) is killed, never reused, and
  a fresh one for its devices is started in the background;
* nothing a job starts outlives it: the worker, a subreaper, ends its job's processes after each task
  (``worker/reap.py``), and where the server may create cgroups (v2) each worker has one of its own: after each
  task whatever else is in it (a child started with ``CLONE_PARENT``) is killed, and once the worker is gone (a
  crash included) everything in it; such children of ours are reaped (``STOPPED_CHECK_S``); an idle worker found
  stopped (SIGSTOP) or gone is replaced, never handed a task, and a running job's worker found stopped twice
  ``STOPPED_CHECK_S`` apart is killed, failing its job (docs/ARCHITECTURE.md, "Job processes");
* what a worker sends is checked (``relay.event_problem``, the line limit): a worker that breaks the protocol is
  killed and replaced, failing its job in phase ``worker`` (docs/ARCHITECTURE.md, "Worker protocol");
* a job's own ``timeout_s`` runs on a timer of its own from the send; the server's maximum run time
  (``TaskSpec.timeout_limit``), which every job of a shared server has, is checked by the same look at running
  jobs every ``STOPPED_CHECK_S``, so no job pays a timer thread for it (docs/ARCHITECTURE.md, "Scheduling");
* a worker keeps its version's module loaded between jobs (docs/ARCHITECTURE.md, "Warm state"); one
  whose job failed in phase ``setup``, or whose memory after a job exceeds ``worker_max_rss_mb``, is
  stopped (its teardown runs) after the outcome is reported, never reused;
* idle workers that ran something: at most ``max_idle_per_device_set`` per device set and
  ``max_idle_workers`` in all, least recently used retired first; idle workers retire after
  ``idle_timeout_s``;
* starting a task stops idle workers of *other device sets* that share its devices, and waits for
  stopped workers on its devices to be reaped, so a job never shares its GPUs with a leftover
  process of a wider or narrower placement;
* with a GPU class config, one fresh worker per single device is pre-started at :meth:`start`;
* when the server runs as root, workers run as ``worker_user`` (see ``server/executors/isolation.py``), or, with
  ``worker_uids`` (``--worker-uids``, ``server/executors/uids.py``), each namespace's as a uid of its own: the uid is
  part of every key, so no worker, fresh spares included, serves two namespaces; spares of a namespace start only
  after its first task on a device set (none at :meth:`start`, whose spares could not know their uid);
* a task with a ``venv`` (its version's environment, built by the plane: docs/ARCHITECTURE.md,
  "Environments") runs on a worker started from ``venv.python``, which inherits a lease on the environment
  (``EnvironmentCache.lease``, its own per process) for its whole life. Fresh spares of the base Python never
  serve such a task; after a task of an environment, a fresh spare *of that environment* is started like any
  replacement spare (at most ``_ENV_SPARES_PER_DEVICE_SET`` per device set, the most recently used), so the next
  new version sharing it starts warm.

A quick job a request waits for (``functions/run``'s inline wait) is run by the event loop, or by the request's own
core thread, when its version's worker is idle on its devices (:meth:`LocalExecutor.launch_inline`): the loop sends the task
and watches the worker's pipe (``loop_follow.LoopFollow``), the thread reads it; either follows the job until it ends
or the wait is over, then a task thread follows it on (docs/ARCHITECTURE.md, "REST details").

Each other running task has a thread that reads the worker's protocol events and calls the callbacks.
Those threads are kept and reused for later tasks (retiring after ``idle_timeout_s``): starting a
thread waits until it first runs, which on a busy machine cost ~0.4 ms median (2 ms p95) on the
``functions/run`` request path.

Over 600 lines: one concern (the pool of warm workers and the following of their tasks) over one state, the
pool's lock.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.server.executors.base import Executor, ExecutorCallbacks, InlineRun, TaskSpec
from lancefn_jupyter.server.executors.isolation import WorkDirs, WorkerUser, worker_environment
from lancefn_jupyter.server.executors.local_plugin import PLUGIN
from lancefn_jupyter.server.executors.loop_follow import LoopFollow
from lancefn_jupyter.server.executors.relay import event_problem, failure_of, relay, worker_task
from lancefn_jupyter.server.executors.uids import WorkerUids, uid_user
from lancefn_jupyter.server.policy.limits import timed_out_message
from lancefn_jupyter.server.policy.resources import ResourceRequest
from lancefn_jupyter.wire.models import JobFailure
from lancefn_jupyter.wire.quantities import format_bytes
from lancefn_jupyter.worker import reap
from lancefn_jupyter.worker.gpustats import GpuSampler
from lancefn_jupyter.worker.process import (
    ProtocolError,
    WorkerProcess,
    WorkerStartError,
    describe_exit,
    invalid_event,
)
from lancefn_jupyter.worker.protocol import FINAL_EVENTS, PRELOAD_ENV

if TYPE_CHECKING:
    from lancefn_jupyter.environments.cache import Environment, EnvironmentCache
    from lancefn_jupyter.environments.request import EnvironmentRequest
    from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig

__all__ = ["DEFAULT_MAX_IDLE_PER_DEVICE_SET", "LocalExecutor", "worker_base_env"]

log = logging.getLogger("lancefn.server")

# Idle workers kept per device set, besides its fresh one: a notebook alternating a few versions
# stays warm, while each idle worker that used CUDA holds a context's memory on those GPUs.
DEFAULT_MAX_IDLE_PER_DEVICE_SET = 4
STOPPED_CHECK_S = 1.0  # how often running jobs' workers are checked for being stopped (two looks: 1-2 s)
_SPARE_QUIET_S = 0.25  # a replacement spare waits for its devices to be free this long at a time
# Fresh spares of built environments kept per device set (besides the base Python's): each holds a process and a
# lease that keeps its environment from eviction.
_ENV_SPARES_PER_DEVICE_SET = 1
# With a uid per namespace, fresh spares of the base Python kept per device set: the most recently used namespaces'.
_NAMESPACE_SPARES_PER_DEVICE_SET = 2

# (devices, simulated, owner, environment, uid): owner = (namespace, name, version) once it ran a job, None while
# fresh; environment = the key of the built environment whose Python it runs, None for the base Python; uid = its
# namespace's uid with --worker-uids (a fresh worker is then its namespace's too), else None.
_Key = tuple[tuple[str, ...], bool, "tuple[str, str, str] | None", "str | None", "int | None"]
_SECRET_ENV = ("LANCEFN_API_KEY",)  # the server's admin key must not reach user code


def _key(task: TaskSpec) -> _Key:
    venv = task.venv.key if task.venv is not None else None
    return (tuple(task.devices), task.simulated, (task.namespace, task.name, task.version), venv, None)


def _fresh(key: _Key) -> _Key:
    return (key[0], key[1], None, key[3], key[4])


def worker_base_env(user: WorkerUser | None = None) -> dict[str, str]:
    """The server's environment as workers get it, before devices are set (``isolation.worker_environment``)."""
    env = worker_environment(
        {name: value for name, value in os.environ.items() if name not in _SECRET_ENV}, switched=user is not None
    )
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    return env


def threads_per_worker(classes: GpuClassConfig | None, cpus: int | None = None) -> int:
    """The CPU threads one worker's math libraries get: the machine's CPUs shared by the workers that can run
    at once (one per device of the classes). Each BLAS / OpenMP pool otherwise starts one thread per CPU, and
    N busy workers then run N× the threads the machine has (docs/ARCHITECTURE.md, "Workers")."""
    devices = sum(len(spec.devices) for spec in (classes.classes if classes else ()))
    return max(1, (cpus or os.cpu_count() or 1) // max(1, devices))


def _worker_env(key: _Key, user: WorkerUser | None, *, threads: int, spare: bool = False) -> dict[str, str]:
    devices, simulated = key[0], key[1]
    env = worker_base_env(user)
    env.setdefault("OMP_NUM_THREADS", str(threads))  # read by OpenBLAS, MKL, OpenMP and torch; the server's wins
    if spare:
        # A spare does the heavy imports a GPU function needs while it waits (CPU: numpy only, so a
        # CPU function never pays for numba). A worker started for a task imports what it uses.
        # The packages check of a version that declares some (worker/runner.py) imports these (~70 ms).
        checks = "packaging.requirements,importlib.metadata"
        env[PRELOAD_ENV] = f"numpy,numba,{checks}" if devices else f"numpy,{checks}"
    if simulated:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)  # "" for CPU tasks: no GPU at all
    return env


def _memory_message(used: int, request: ResourceRequest) -> str:
    return f"used {format_bytes(used)} of {request.memory_text}; raise memory= or process less per call"


_LATER = object()  # a followed run that has not ended by its deadline
# The largest artifact whose task the event loop sends itself (``_follow_on_loop``): base64 and a body's rows, the
# task line stays within a pipe's 64 KiB, which an idle worker's pipe has free.
LOOP_ARTIFACT_BYTES = 24 * 1024
# The most log and progress events of a run the event loop reports itself (each log event is a commit): a job that
# prints more goes on in a task thread.
LOOP_REPORTS = 8


@dataclass(eq=False)
class _Run:
    task: TaskSpec
    key: _Key
    worker: WorkerProcess | None = None
    # Decided once, first come first served: "finished", "crashed", "failed" (executor error), "refused" (its
    # worker broke the protocol), or a stop: "timeout", "cancelled", "shutdown", "stopped" (its worker was found
    # stopped).
    outcome: str | None = None
    rows_done: int = 0
    start_ms: float | None = None  # starting a worker process for this run; 0 when one was idle
    reused_from: str | None = None  # the version whose idle worker it took ("Setup reuse")
    sent: bool = False  # its worker has the task: a thread taking the run over only follows it
    timer: threading.Timer | None = None  # its own timeout_s, from when the task was sent
    deadline: float | None = None  # the server's maximum run time (monotonic), from the send: ``_watch_running``
    follower: LoopFollow | None = None  # the event loop's, once it followed it (``_follow_on_loop``)
    loop_reports: int = 0  # logs and progress the loop reported (``LOOP_REPORTS`` at most)
    memory_used: int = 0  # what its worker was found holding past its memory= ("Compute resources")
    gpu_stats: GpuSampler | None = None  # its real GPUs' memory and utilisation, sampled while it runs ("Cost")
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)  # set once its worker is reaped or pooled

    def claim(self, outcome: str) -> bool:
        with self.lock:
            if self.outcome is not None:
                return False
            self.outcome = outcome
            return True


@dataclass(frozen=True)
class _InlineRun:
    """A launched run the launching thread runs itself (``LocalExecutor.launch_inline``; ``base.InlineRun``)."""

    run: Callable[[float], None]  # until it ends or the deadline passes (then a task thread follows it on)
    leave_to_executor: Callable[[], None]  # to a task thread, not run here after all
    follow_on_loop: Callable[[float], None]  # started and followed by the event loop (``_follow_on_loop``)


class LocalExecutor(Executor):
    name = "local"
    builds_environments = True  # the plane builds a version's environment in ``environments`` before placing it

    def __init__(
        self,
        classes: GpuClassConfig | None = None,
        home: str | Path | None = None,  # where WorkDirs records the workers' root (each worker runs in its own)
        *,
        max_idle_workers: int = 16,
        max_idle_per_device_set: int = DEFAULT_MAX_IDLE_PER_DEVICE_SET,
        idle_timeout_s: float = 600.0,
        kill_grace_s: float = 2.0,
        worker_user: WorkerUser | None = None,
        prewarm_delay_s: float = 0.0,
        worker_max_rss_mb: float | None = None,
        environments: EnvironmentCache | None = None,
        worker_uids: WorkerUids | None = None,
        worker_max_procs: int | None = None,
    ) -> None:
        """``environments``: the cache whose environments tasks' ``venv`` name (the plane's); None: every worker
        runs the base Python, and a version's environment is refused only for ``image``. ``worker_uids``: a uid per
        namespace (replaces ``worker_user``). ``worker_max_procs``: switched workers' RLIMIT_NPROC."""
        self._classes = classes
        self._threads = threads_per_worker(classes)
        self._environments = environments
        self._max_rss_mb = worker_max_rss_mb
        self._prewarm_delay_s = prewarm_delay_s
        self._max_idle = max_idle_workers
        self._max_idle_per_set = max_idle_per_device_set
        self._user = worker_user
        self._uids = worker_uids
        self._max_procs = worker_max_procs
        self._workdirs = WorkDirs(home)
        self._idle_timeout_s = idle_timeout_s
        self._grace_s = kill_grace_s
        self._callbacks: ExecutorCallbacks = None  # type: ignore[assignment]  # set by start(), before any launch
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._idle: dict[_Key, tuple[WorkerProcess, float]] = {}  # key → (worker, idle since)
        # key → the setup digest of its version's task, for workers that may serve another version ("Setup reuse");
        # pruned to the idle keys' when it grows.
        self._setup_digests: dict[_Key, str] = {}
        self._spawners: set[threading.Thread] = set()
        self._spawning: set[_Key] = set()  # keys a background start is under way for
        self._venvs: dict[str, Environment] = {}  # environments tasks ran in, by key (to start their spares)
        self._closed = threading.Event()
        self._tasks: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self._runner_threads = 0  # alive task threads
        self._idle_runners = 0  # of which waiting for a task and not yet promised one
        # A task thread's own: whether it is reporting its run's outcome (``relay``), and the run that outcome let
        # start, which it runs next itself (``_queue_for_task_thread``).
        self._local = threading.local()

    # ----------------------------------------------------------------- Executor interface

    def start(self, callbacks: ExecutorCallbacks) -> None:
        self._callbacks = callbacks
        threading.Thread(target=self._retire_idle, name="lancefn-idle-workers", daemon=True).start()
        threading.Thread(target=self._watch_running, name="lancefn-worker-watch", daemon=True).start()
        keys: list[_Key] = [
            ((device,), spec.simulated, None, None, None)
            for spec in (self._classes.classes if self._classes else ())
            for device in spec.devices
            if self._uids is None  # a spare's uid is its namespace's, unknown before that namespace's first task
        ]

        def prewarm_all() -> None:
            # A spare imports numpy and numba (~0.6 s of CPU): started with the server, spares would
            # slow its start-up, and a notebook's first registration, down on a small machine.
            if not self._closed.wait(self._prewarm_delay_s):
                for key in keys:
                    self._prewarm(key)

        if self._prewarm_delay_s > 0:
            threading.Thread(target=prewarm_all, name="lancefn-prewarm", daemon=True).start()
        else:
            prewarm_all()

    def launch(self, task: TaskSpec) -> None:
        run = _Run(task, _key(task))
        with self._lock:
            self._runs[task.job_id] = run
        self._queue_for_task_thread(run)

    def launch_inline(self, task: TaskSpec) -> InlineRun | None:
        """The task for the calling thread to run when its version's worker is idle on its devices (a quick job's
        inline wait: no task thread, no hand-over between threads); None otherwise (not launched)."""
        if task.table_slice is not None:
            return None
        run = _Run(task, _key(task))
        with self._lock:
            if self._uids is not None:  # the key of its namespace's uid, which an idle worker of it has
                uid = self._uids.known(task.namespace)
                if uid is None:
                    return None
                run.key = (*run.key[:4], uid)
            if self._closed.is_set() or run.key not in self._idle:
                return None
            devices = set(task.devices)
            if any(devices & set(other.task.devices) for other in self._runs.values()):
                return None  # a run being stopped still holds its devices: waiting for it is a task thread's job
            self._runs[task.job_id] = run
        return _InlineRun(
            functools.partial(self._execute, run),
            functools.partial(self._queue_for_task_thread, run),
            functools.partial(self._follow_on_loop, run),
        )

    def _queue_for_task_thread(self, run: _Run) -> None:
        if self._closed.is_set():  # the task threads are told to end: a thread of its own sees it to its end
            threading.Thread(target=self._execute, args=(run,), name="lancefn-job", daemon=True).start()
            return
        local = self._local
        if getattr(local, "reporting", False) and local.next is None:
            # A task thread reporting its run's outcome, which let this job start (on the devices it frees, most
            # often): that thread runs it next, once its own run is done, with no other thread woken and none
            # waiting for the devices (``_wait_for_devices``).
            local.next = run
            return
        with self._lock:
            spawn = self._idle_runners == 0
            if spawn:
                self._runner_threads += 1
            else:
                self._idle_runners -= 1  # promised to this task
        self._tasks.put(run)
        if spawn:
            threading.Thread(target=self._runner, name="lancefn-job", daemon=True).start()

    def _runner(self) -> None:
        """A task thread: runs tasks from the queue, idles, retires after ``idle_timeout_s``."""
        while True:
            try:
                run = self._tasks.get(timeout=self._idle_timeout_s)
            except queue.Empty:
                with self._lock:
                    if self._idle_runners == 0:
                        continue  # every idle runner is promised to a queued task: take one
                    self._idle_runners -= 1
                    self._runner_threads -= 1
                return
            if run is None:  # shutdown
                with self._lock:
                    self._runner_threads -= 1
                return
            self._local.next = None
            while run is not None:
                threading.current_thread().name = f"lancefn-job-{run.task.job_id}"
                self._execute(run)
                run, self._local.next = self._local.next, None
            threading.current_thread().name = "lancefn-job"
            with self._lock:
                self._idle_runners += 1

    def cancel(self, job_id: str) -> None:
        with self._lock:
            run = self._runs.get(job_id)
        if run is not None:  # killing may take the grace period; don't hold up the caller
            threading.Thread(target=self._stop, args=(run, "cancelled"), daemon=True).start()

    def environment_problem(self, request: EnvironmentRequest) -> str | None:
        if self._environments is not None:
            return self._environments.problem(request)
        if request.image:
            return (
                f"image={request.image!r}: the local executor runs no containers; use the Ray executor, or drop image="
            )
        return None

    def environment_builder(self, namespace: str) -> BuildUser | None:
        """The namespace's workers' user: its own uid (``--worker-uids``), the worker user, or None (itself)."""
        if self._uids is not None:
            uid = self._uids.uid_for(namespace)
            return BuildUser(uid, uid)
        return BuildUser(self._user.uid, self._user.gid) if self._user is not None else None

    def idle_retire_ms(self, class_of: Mapping[str, str]) -> list[tuple[str, int]]:
        # The retiring thread looks every min(idle, 30 s): a worker goes at most that long after this.
        offset = time.time() - time.monotonic() + self._idle_timeout_s
        with self._lock:
            idle = [(key[0], since) for key, (_, since) in self._idle.items() if key[2] is not None]
        return [
            (class_of[devices[0]], int((since + offset) * 1000))
            for devices, since in idle
            if devices[0:1] and devices[0] in class_of
        ]

    def warm_devices(self, namespace: str, name: str, version: str) -> list[tuple[str, ...]]:
        owner = (namespace, name, version)
        with self._lock:  # held only for dict work anywhere, never across a process call
            return [key[0] for key in self._idle if key[2] == owner]

    def shutdown(self) -> None:
        self._closed.set()
        with self._lock:
            runs = list(self._runs.values())
            idle = [worker for worker, _ in self._idle.values()]
            self._idle.clear()
            spawners = list(self._spawners)
            for _ in range(self._runner_threads):
                self._tasks.put(None)  # each task thread ends once its current task does
        for run in runs:
            self._stop(run, "shutdown")
        # In parallel: each idle worker may spend up to TEARDOWN_S in its version's teardown.
        stoppers = [threading.Thread(target=worker.stop, args=(self._grace_s,), daemon=True) for worker in idle]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join()
        for thread in spawners:
            thread.join()
        for run in runs:
            run.done.wait(2 * self._grace_s + 5)
        reap.remove_cgroups()
        self._workdirs.close()

    # ----------------------------------------------------------------- one task

    def _execute(self, run: _Run, deadline: float | None = None) -> None:
        """Run ``run`` to its end; with a ``deadline`` (``time.monotonic()``), a task thread follows it from
        there if it has not ended by then."""
        passed_on = False
        try:
            passed_on = self._run(run, deadline)
        except Exception as exc:
            self._failed(run, exc)
        finally:
            if not passed_on:
                self._end(run)

    def _failed(self, run: _Run, exc: Exception) -> None:
        """An executor bug must still end the job, never leave it running (also when it failed while reporting the
        outcome it had claimed: the core ignores a second report of an ended job)."""
        log.error("local executor failed on job %s", run.task.job_id, exc_info=exc)
        if run.worker is not None:
            run.worker.kill(self._grace_s)
        if run.claim("failed") or run.outcome == "finished":
            self._callbacks.task_failed(
                run.task.job_id,
                JobFailure(phase="executor", message=f"local executor error: {exc}"),
                timings=self._start_timings(run),
            )

    def _end(self, run: _Run) -> None:
        """The run is over: its worker is pooled or reaped."""
        if run.timer is not None:
            run.timer.cancel()
        self._gpu_stats(run)  # a run that ended without an outcome: its sampling ends too
        with self._lock:
            self._runs.pop(run.task.job_id, None)
        run.done.set()

    def _run(self, run: _Run, deadline: float | None = None) -> bool:
        """True when the run was handed to a task thread at ``deadline``, still running."""
        worker = run.worker
        if not run.sent:
            if run.task.table_slice is not None and not self._read_slice(run):
                return False
            worker = self._take_worker(run)
            if worker is None:
                return False
            self._send_task(run, worker)
        assert worker is not None  # sent: it has one
        final = self._follow(run, worker, deadline)
        if final is _LATER:
            self._queue_for_task_thread(run)
            return True
        if final is None or isinstance(final, ProtocolError):
            self._lost(run, worker, final)
            return False
        assert isinstance(final, dict)
        self._conclude(run, worker, final, self._end_strays(run, worker))
        return False

    @staticmethod
    def _end_strays(run: _Run, worker: WorkerProcess) -> str | None:
        """Kill what the run's job left beyond its worker's own sweep (one read of the worker's cgroup when there is
        nothing: "Job processes"); why the worker must not serve again when that could not be done."""
        if not worker.strays():
            return None
        log.warning("job %s left processes outside its worker %d; killing them", run.task.job_id, worker.pid)
        return None if worker.end_strays() else "processes its job left would not die"

    def _conclude(self, run: _Run, worker: WorkerProcess, final: dict, leftover: str | None = None) -> None:
        """Report the run's ``result``/``failed`` event, its worker pooled first (or stopped, after the report);
        ``leftover``: why the worker must not serve again, found by :meth:`_end_strays`."""
        final["timings"] = {**(final.get("timings") or {}), "start_ms": run.start_ms or 0.0, **self._gpu_stats(run)}
        if run.reused_from is not None and final["timings"].get("setup_reused"):  # the worker rebound its code
            final["timings"]["setup_reused_from"] = run.reused_from
        over = self._over_memory(run, worker)
        if over is not None:  # it went past its memory= between two looks: the job fails, the worker goes
            final = {"event": "failed", "phase": "resources", "message": over, "timings": final["timings"]}
            leftover = leftover or "it used more memory than its memory="
        retire = leftover or self._retire_reason(final)
        if retire is None:
            self._release(run.key, worker)  # pooled before reporting, so the next job can reuse it
        follow_on = retire is None and hasattr(self._local, "next")  # a task thread, free once it reported
        self._local.reporting = follow_on
        try:
            relay(self._callbacks, run.task.job_id, final)
        finally:
            self._local.reporting = False
        if retire is not None:
            # Stopped after the outcome (its teardown may take a while), yet before the run is
            # done: the next job on these devices waits for this process to be gone.
            log.info(
                "retiring the worker of %s@%s after job %s: %s",
                run.task.name,
                run.task.version,
                run.task.job_id,
                retire,
            )
            worker.stop(self._grace_s)
        # A new fresh spare for the next new version here, started only now: on a small machine a
        # process start racing the job it was taken for would slow that job down.
        self._prewarm(_fresh(run.key), quiet=True)

    def _read_slice(self, run: _Run) -> bool:
        """A backfill chunk: its slice of the table into the job's rows file, here in the task's
        thread (never under the job table's lock), so the worker reads rows as for any Arrow job
        (docs/ARCHITECTURE.md, "Backfills"). False (the job failed) when the slice cannot be read."""
        from lancefn_jupyter.server.executors.table_agent import read_rows

        task = run.task
        try:  # a team's slice on a shared server: by its table agent, with the team's rights ("Which tables")
            read_rows(self.table_agents, task)
        except Exception as error:  # the table moved or changed under the backfill: the chunk fails, saying why
            if run.claim("failed"):
                self._callbacks.task_failed(
                    task.job_id,
                    JobFailure(phase="validation", message=f"could not read the chunk's rows from the table: {error}"),
                )
            return False
        return True

    @staticmethod
    def _gpu_stats(run: _Run) -> dict[str, float]:
        """What its real GPUs did while the run ran (empty without NVML or a real GPU); the sampling ends."""
        stats, run.gpu_stats = run.gpu_stats, None
        return stats.stop() if stats is not None else {}

    @staticmethod
    def _over_memory(run: _Run, worker: WorkerProcess) -> str | None:
        """The phase-``resources`` message of a run whose worker held more than its ``memory=`` (its high water mark,
        or what the watch found), else None ("Compute resources")."""
        request = run.task.resources
        if request.memory is None or (worker.held is not None and worker.held.kernel_memory):
            return None  # unlimited, or held by the kernel (which kills it instead)
        used = max(run.memory_used, worker.memory_peak())
        return _memory_message(used, request) if used > request.memory else None

    def _retire_reason(self, final: dict) -> str | None:
        """Why the worker that sent ``final`` must not serve another job, if it must not."""
        if final.get("event") == "failed" and final.get("phase") == "setup":
            return "its setup failed"
        rss = final.get("rss_mb")
        if self._max_rss_mb is not None and isinstance(rss, (int, float)) and rss > self._max_rss_mb:
            return f"its memory ({rss:.0f} MB) exceeds the worker limit of {self._max_rss_mb:g} MB"
        return None

    @staticmethod
    def _start_timings(run: _Run) -> dict[str, float] | None:
        """Timings of a job no worker finished: the start it paid, when it got that far."""
        return None if run.start_ms is None else {"start_ms": run.start_ms}

    def _take_worker(self, run: _Run) -> WorkerProcess | None:
        """A worker for the run, once its devices are free; None if it could not start or the run
        was stopped meanwhile (reported, or left to whoever stopped it)."""
        self._wait_for_devices(run)
        try:
            if self._uids is not None:  # its namespace's uid, allocated on the namespace's first job
                devices, simulated, owner, venv, _ = run.key
                run.key = (devices, simulated, owner, venv, self._uids.uid_for(run.task.namespace))
            worker, run.start_ms, run.reused_from = self._acquire(run.key, run.task.venv, run.task.setup_digest)
        except WorkerStartError as exc:
            if run.claim("crashed"):
                self._callbacks.task_failed(run.task.job_id, JobFailure(phase="worker", message=str(exc)))
            return None
        with run.lock:
            stopped = run.outcome is not None  # cancelled or shut down while the worker started
            if not stopped:
                run.worker = worker
        if stopped:
            self._release(run.key, worker)  # it never saw the task, so it is still clean
            return None
        return worker

    def _send_task(self, run: _Run, worker: WorkerProcess) -> None:
        task = run.task
        run.sent = True
        if task.timeout_limit and task.timeout_s is not None:
            run.deadline = time.monotonic() + task.timeout_s
        elif task.timeout_s is not None:
            run.timer = threading.Timer(task.timeout_s, self._stop, (run, "timeout"))
            run.timer.daemon = True
            run.timer.start()
        if task.resources and worker.held is None:  # a fresh worker, taking on its version ("Compute resources")
            worker.hold(task.resources.cpu, task.resources.memory)
        if task.devices and not task.simulated:  # a real GPU: its peak memory and utilisation ("Cost")
            run.gpu_stats = GpuSampler(worker.pid, task.devices)
            if not run.gpu_stats.start():
                run.gpu_stats = None
        # In place: a backfill chunk's slice is in its rows file by now (``_read_slice``).
        worker.start_task(worker_task(task, PLUGIN.ship(task.data.fields(), None)))
        # Reported once the worker has the task, so the job's start runs beside the worker's, not before it: its
        # events are read after this returns, by this thread or the loop's next pass (docs/ARCHITECTURE.md, "REST
        # details").
        self._callbacks.task_started(task.job_id, devices=task.devices, node=None)

    def _follow(self, run: _Run, worker: WorkerProcess, deadline: float | None = None) -> dict | object | None:
        """Relay the task's logs and progress (its timeout runs from the send); its ``result``/``failed``
        event, None when the worker died or is being stopped, ``_LATER`` when it has not ended by
        ``deadline`` (``time.monotonic()``), or the ``ProtocolError`` of a worker that broke the protocol: a line
        too long or no event, an event the protocol does not have (``event_problem``), a second outcome."""
        final = None
        while True:
            if deadline is not None and not worker.event_ready(deadline - time.monotonic()):
                return _LATER
            try:
                event = worker.next_event()
            except ProtocolError as error:
                return error
            if event is None:
                return final
            problem = event_problem(event, run.task.job_id)
            if problem is None and event["event"] in FINAL_EVENTS and worker.outcome_buffered():
                problem = "a second outcome for one task"
            if problem is not None:
                return ProtocolError("worker", invalid_event(event, problem))
            if run.outcome is None:  # else being stopped: report nothing more
                if event["event"] == "progress":
                    run.rows_done = event["rows_done"]
                if event["event"] in ("log", "progress"):
                    relay(self._callbacks, run.task.job_id, event)
                elif event["event"] in FINAL_EVENTS and run.claim("finished"):
                    final = event
            if event["event"] in FINAL_EVENTS:
                return final

    # ----------------------------------------------------------------- a run the event loop follows

    def _follow_on_loop(self, run: _Run, deadline: float) -> None:
        """``launch_inline``'s run started and followed by the event loop (``InlineRun.follow_on_loop``; the core's locks
        held): its idle worker gets the task here and the loop reads the worker's events as they come, so a quick
        job's whole run takes no other thread. Whatever could wait (an idle worker to replace, workers to stop, a
        result frame, a busy lock, the worker's end) goes to a task thread, which follows it on from there, as it
        does at ``deadline`` (docs/ARCHITECTURE.md, "REST details")."""
        # The task line must fit the idle worker's empty pipe, so that writing it never waits (rows: a body the loop
        # parses; env values: small).
        worker = self._take_idle_now(run) if len(run.task.artifact) <= LOOP_ARTIFACT_BYTES else None
        if worker is None:
            self._queue_for_task_thread(run)
            return
        try:
            run.follower = LoopFollow(
                worker,
                asyncio.get_running_loop(),
                take=functools.partial(self._loop_event, run, worker),
                to_task_thread=functools.partial(self._queue_for_task_thread, run),
                failed=functools.partial(self._fail_in_thread, run),
            )
            self._send_task(run, worker)
            run.follower.start(deadline)
        except Exception as exc:  # a bug of ours: the job must still end
            run.follower = None
            self._fail_in_thread(run, exc)

    def _take_idle_now(self, run: _Run) -> WorkerProcess | None:
        """The run's idle worker, when taking it waits for nothing: it is usable, and no idle worker of another
        device set shares its devices (``_acquire`` stops those, on a task thread); else None."""
        with self._lock:
            entry = self._idle.get(run.key)
            shared = any(key[0] != run.key[0] and set(key[0]) & set(run.key[0]) for key in self._idle)
        if entry is None or shared or not entry[0].usable():
            return None
        with run.lock:
            if run.outcome is not None:  # being stopped: a task thread ends it
                return None
            with self._lock:
                if self._idle.get(run.key) is not entry:
                    return None
                del self._idle[run.key]
            run.worker, run.start_ms = entry[0], 0.0
        return entry[0]

    def _loop_event(self, run: _Run, worker: WorkerProcess, event: dict) -> bool | None:
        """One buffered event of a run the loop follows, as ``_follow`` takes it: True when the run ended here,
        False when it goes on; None when a task thread must take it (it is left in the buffer)."""
        kind = event.get("event")
        last = kind in FINAL_EVENTS
        if "ipc_len" in event or run.outcome is not None:  # a result frame to stream, or a stop under way
            return None
        if event_problem(event, run.task.job_id) is not None:  # a task thread kills the worker, saying why
            return None
        if last and (
            run.task.resources.memory is not None  # its memory is checked on a task thread ("Compute resources")
            or run.gpu_stats is not None  # its GPU sampling is ended on a task thread ("Cost")
            or self._retire_reason(event) is not None
            or not self._pools_now(run.key)
            or worker.more_buffered()  # maybe a second outcome, which a task thread refuses
            or worker.strays()  # processes of the job to kill first
        ):
            return None  # its worker is to be stopped or cleaned, which waits for processes
        if not last and run.loop_reports >= LOOP_REPORTS:  # a chatty job: its lines are saved on a task thread
            return None
        release = self._callbacks.hold_now()
        if release is None:
            return None
        try:
            worker.drop_event()
            if not last:
                if kind == "progress":
                    run.rows_done = event["rows_done"]
                relay(self._callbacks, run.task.job_id, event)
                run.loop_reports += 1
                return False
            if not run.claim("finished"):  # stopped meanwhile: the kill ends its pipe, and a task thread says why
                return None
            self._conclude(run, worker, event)
        finally:
            release()
        self._end(run)
        return True

    def _pools_now(self, key: _Key) -> bool:
        """Whether a worker of ``key`` would go back idle now (``_release``), not be stopped."""
        with self._lock:
            return not self._closed.is_set() and key not in self._idle

    def _fail_in_thread(self, run: _Run, exc: Exception) -> None:
        """A bug of ours while the loop followed the run: a thread of its own fails and ends it (a kill waits)."""

        def fail() -> None:
            try:
                self._failed(run, exc)
            finally:
                self._end(run)

        threading.Thread(target=fail, name="lancefn-job", daemon=True).start()

    def _lost(self, run: _Run, worker: WorkerProcess, error: ProtocolError | None = None) -> None:
        """The worker died, is being stopped, or broke the protocol (``error``: its pipe can no longer be trusted):
        reap it before the core frees its devices, and say why."""
        task = run.task
        worker.kill(self._grace_s)
        if worker.oom_killed:  # the kernel ended it at its memory.max ("Compute resources")
            log.info("job %s: the kernel killed its worker %d at its memory=", task.job_id, worker.pid)
            run.memory_used = run.memory_used or worker.oom_used
            run.claim("resources")
        if error is not None and run.claim("refused"):
            log.warning("job %s failed in phase %s: %s", task.job_id, error.phase, error.message)
            self._callbacks.task_failed(
                task.job_id,
                failure_of({"phase": error.phase, "message": error.message}),
                timings=self._start_timings(run),
            )
        elif run.claim("crashed"):
            self._callbacks.task_failed(
                task.job_id,
                JobFailure(
                    phase="worker",
                    message=f"{describe_exit(worker.process.returncode)} while running {task.name}; "
                    "its output so far is in the job's logs",
                ),
                timings=self._start_timings(run),
            )
        elif run.outcome == "resources":
            used = run.memory_used or task.resources.memory or 0
            self._callbacks.task_failed(
                task.job_id,
                JobFailure(phase="resources", message=_memory_message(used, task.resources)),
                timings=self._start_timings(run),
            )
        elif run.outcome == "stopped":
            self._callbacks.task_failed(
                task.job_id,
                JobFailure(
                    phase="worker",
                    message=f"the worker process running {task.name} was stopped (SIGSTOP) by another process "
                    f"and was killed ({run.rows_done} of {task.rows_total} rows done); run the job again",
                    retryable=True,
                ),
                timings=self._start_timings(run),
            )
        elif run.outcome == "timeout":
            self._callbacks.task_failed(
                task.job_id,
                JobFailure(
                    phase="timeout",
                    message=timed_out_message(
                        task.timeout_s or 0.0, task.timeout_limit, run.rows_done, task.rows_total
                    ),
                ),
                timings=self._start_timings(run),
            )
        if run.outcome != "shutdown":
            self._prewarm(_fresh(run.key), quiet=True)

    def _stop(self, run: _Run, outcome: str) -> None:
        if run.claim(outcome) and run.worker is not None:
            follower = run.follower
            if follower is not None:  # the loop lets go of the worker's pipe before the kill closes it
                follower.let_go()
            run.worker.kill(self._grace_s)
        # else: finished already, or still starting its worker (it will see the outcome and stop)

    def _wait_for_devices(self, run: _Run) -> None:
        """The scheduler only hands out free devices, so a run still holding them is being stopped."""
        with self._lock:
            others = [
                other
                for other in self._runs.values()
                if other is not run and set(other.task.devices) & set(run.task.devices)
            ]
        for other in others:
            other.done.wait(2 * self._grace_s + 5)

    # ----------------------------------------------------------------- the pool

    def _acquire(
        self, key: _Key, venv: Environment | None = None, setup_digest: str | None = None
    ) -> tuple[WorkerProcess, float, str | None]:
        """Its own (namespace, version)'s idle worker, else an idle one of another version of the function with the
        same ``setup_digest`` ("Setup reuse"), else a fresh one of the same Python (the base's, or ``venv``'s), else
        a new process; the milliseconds spent starting that process (0 for an idle one), and the version whose
        worker it is when it is another's."""
        peer = None
        with self._lock:
            if venv is not None:
                self._venvs[venv.key] = venv  # to start spares of it
            if setup_digest is not None:
                self._setup_digests[key] = setup_digest
            own = self._idle.pop(key, None)
            if own is None and setup_digest is not None:
                peer = self._idle_peer(key, setup_digest)
                own = self._idle.pop(peer, None) if peer is not None else None
            fresh = self._idle.pop(_fresh(key), None) if own is None else None
            sharing = [
                self._idle.pop(other)[0]
                for other in list(self._idle)
                if other[0] != key[0] and set(other[0]) & set(key[0])
            ]
        for worker in sharing:
            worker.stop(self._grace_s)
        for entry in (own, fresh):
            if entry is None:
                continue
            if entry[0].usable():
                reused = peer[2][2] if peer is not None and entry is own else None  # type: ignore[index]
                return entry[0], 0.0, reused
            log.warning("replacing idle worker %d: %s", entry[0].pid, "stopped" if entry[0].alive() else "gone")
            entry[0].kill(self._grace_s)
        started = time.perf_counter()
        worker = self._start(key, venv)
        return worker, (time.perf_counter() - started) * 1000.0, None

    def _idle_peer(self, key: _Key, setup_digest: str) -> _Key | None:
        """(Lock held.) The most recently idle worker's key of another version of ``key``'s function, on the same
        devices, Python and uid, whose version has ``setup_digest`` ("Setup reuse"); None if there is none."""
        owner = key[2]
        peers = [
            other
            for other in self._idle
            if other[2] is not None
            and other[2][:2] == owner[:2]  # type: ignore[index]
            and other[2] != owner
            and (other[0], other[1], other[3], other[4]) == (key[0], key[1], key[3], key[4])
            and self._setup_digests.get(other) == setup_digest
        ]
        return max(peers, key=lambda other: self._idle[other][1]) if peers else None

    def _start(self, key: _Key, venv: Environment | None, *, spare: bool = False) -> WorkerProcess:
        """A worker process for ``key``: of the base Python, or of ``venv``'s, inheriting its own lease on it
        (held until the process exits)."""
        user = uid_user(key[4]) if key[4] is not None else self._user
        env = _worker_env(key, user, spare=spare, threads=self._threads)
        workdir = self._workdirs.new(user)
        if user is not None:
            env["HOME"] = workdir  # not the server user's home directory, which it cannot (and must not) use
        ids = (user.uid, user.gid) if user is not None else None
        max_procs = self._max_procs if user is not None else None
        umask = 0o077 if key[4] is not None else None  # a namespace's own uid: what its jobs write is its own
        if venv is None:
            return WorkerProcess(env, ids, contain=True, workdir=workdir, max_procs=max_procs, umask=umask)
        lease = self._environments.lease(venv) if self._environments is not None else None
        if lease is None:
            with self._lock:
                self._venvs.pop(venv.key, None)  # evicted: no more spares of it
            raise WorkerStartError(
                f"the environment {venv.path} is gone (evicted from the cache, or no cache configured); "
                "run the job again to rebuild it"
            )
        try:
            return WorkerProcess(
                env,
                ids,
                python=venv.python,
                pass_fds=(lease,),
                contain=True,
                workdir=workdir,
                max_procs=max_procs,
                umask=umask,
            )
        finally:
            os.close(lease)  # the worker holds its inherited copy

    def _release(self, key: _Key, worker: WorkerProcess) -> None:
        retire: list[WorkerProcess] = [worker]
        with self._lock:
            if not self._closed.is_set() and key not in self._idle:
                self._idle[key] = (worker, time.monotonic())
                retire = []
                same_set = [k for k in self._idle if k[0] == key[0] and k[1] == key[1]]
                used = [k for k in same_set if k[2] is not None]
                if len(used) > self._max_idle_per_set:  # this device set's least recently used
                    used.sort(key=lambda k: self._idle[k][1])
                    retire += [self._idle.pop(k)[0] for k in used[: len(used) - self._max_idle_per_set]]
                env_spares = [k for k in same_set if k[2] is None and k[3] is not None]
                if len(env_spares) > _ENV_SPARES_PER_DEVICE_SET:  # the most recently used environments' stay
                    env_spares.sort(key=lambda k: self._idle[k][1])
                    retire += [self._idle.pop(k)[0] for k in env_spares[: len(env_spares) - _ENV_SPARES_PER_DEVICE_SET]]
                uid_spares = [k for k in same_set if k[2] is None and k[3] is None and k[4] is not None]
                if len(uid_spares) > _NAMESPACE_SPARES_PER_DEVICE_SET:  # the most recently used namespaces' stay
                    uid_spares.sort(key=lambda k: self._idle[k][1])
                    extra = len(uid_spares) - _NAMESPACE_SPARES_PER_DEVICE_SET
                    retire += [self._idle.pop(k)[0] for k in uid_spares[:extra]]
                if len(self._idle) > self._max_idle:
                    oldest = min(self._idle, key=lambda k: self._idle[k][1])
                    retire.append(self._idle.pop(oldest)[0])
                if len(self._setup_digests) > 4 * self._max_idle:
                    self._setup_digests = {k: v for k, v in self._setup_digests.items() if k in self._idle}
        if retire == [worker]:
            worker.stop(self._grace_s)  # not pooled: the caller's worker, stopped before it goes on
        elif retire:
            self._retire(retire)

    def _retire(self, workers: list[WorkerProcess]) -> None:
        """Stop pooled workers in the background: a job's result must not wait for another's exit."""

        def stop() -> None:
            try:
                for worker in workers:
                    worker.stop(self._grace_s)
            finally:
                with self._lock:
                    self._spawners.discard(threading.current_thread())

        with self._lock:
            thread = threading.Thread(target=stop, name="lancefn-retire", daemon=True)
            self._spawners.add(thread)
            thread.start()

    def _prewarm(self, key: _Key, *, quiet: bool = False) -> None:
        """Start a worker for ``key`` in the background unless one is already idle.

        ``quiet`` (a replacement for the spare a job took): only once no job runs on its devices. In a
        batch the next chunk comes at once, and a spare's imports (about a second of CPU) would slow
        the chunks down on a small machine."""

        def spawn() -> None:
            try:
                while quiet and self._devices_busy(key[0]):
                    if self._closed.wait(_SPARE_QUIET_S):
                        return
                with self._lock:
                    venv = self._venvs.get(key[3]) if key[3] is not None else None
                if key[3] is not None and venv is None:
                    return
                self._release(key, self._start(key, venv, spare=True))
            except WorkerStartError:
                log.warning("could not pre-start a worker for devices %s", key[0], exc_info=True)
            finally:
                with self._lock:
                    self._spawners.discard(threading.current_thread())
                    self._spawning.discard(key)

        with self._lock:
            if self._closed.is_set() or key in self._idle or key in self._spawning:
                return
            self._spawning.add(key)
            thread = threading.Thread(target=spawn, name="lancefn-prewarm", daemon=True)
            self._spawners.add(thread)
            thread.start()  # under the lock, so shutdown never joins a thread that isn't started

    def _devices_busy(self, devices: tuple[str, ...]) -> bool:
        wanted = set(devices)
        with self._lock:
            return any(
                (wanted & set(run.task.devices)) if wanted else not run.task.devices for run in self._runs.values()
            )

    def _watch_running(self) -> None:
        """A running job's worker stopped from outside (SIGSTOP by another process of its user) would hold the
        job IN_PROGRESS for ever: one found stopped on two looks in a row is killed and its job fails, saying
        so ("Job processes"). A job past the server's maximum run time is stopped ("Scheduling"). Each look also
        reaps the zombies jobs left as our children (``reap.reap_strays``)."""
        suspects: set[int] = set()
        while not self._closed.wait(STOPPED_CHECK_S):
            reap.reap_strays()  # zombies of what jobs left as our children ("Job processes")
            with self._lock:
                runs = [run for run in self._runs.values() if run.worker is not None and run.outcome is None]
            now = time.monotonic()
            for run in runs:
                if run.deadline is not None and now >= run.deadline:
                    self._stop(run, "timeout")
                self._watch_memory(run)
            stopped = {id(run): run for run in runs if run.worker is not None and not run.worker.usable()}
            for key, run in stopped.items():
                if key in suspects and run.worker is not None and run.worker.alive():
                    log.warning("job %s: its worker %d is stopped; killing it", run.task.job_id, run.worker.pid)
                    self._stop(run, "stopped")
            suspects = set(stopped)

    def _watch_memory(self, run: _Run) -> None:
        """Without the kernel's ``memory.max``, a running job whose worker holds more than its ``memory=`` is
        stopped, failing in phase ``resources`` ("Compute resources")."""
        limit, worker = run.task.resources.memory, run.worker
        if limit is None or worker is None or not run.sent or worker.held is None or worker.held.kernel_memory:
            return
        used = worker.memory_used()
        if used > limit:
            run.memory_used = used
            log.info("job %s: its worker %d holds %d bytes, over its memory=", run.task.job_id, worker.pid, used)
            self._stop(run, "resources")

    def _retire_idle(self) -> None:
        while not self._closed.wait(min(self._idle_timeout_s, 30.0)):
            deadline = time.monotonic() - self._idle_timeout_s
            with self._lock:
                expired = [
                    key for key, (worker, since) in self._idle.items() if since < deadline or not worker.usable()
                ]
                retired = [self._idle.pop(key)[0] for key in expired]
            for worker in retired:
                worker.stop(self._grace_s)
