"""Ray executor: each job is one Ray task; a Ray cluster (KubeRay on Kubernetes) is how users
outgrow one machine.  Operator guide: ``docs/ray.md``.

Three processes take part::

    control plane (RayExecutor)  ──JSON lines──▶  Ray driver ("bridge")  ──Ray──▶  task on a node
      imports no Ray at all      ◀──────────────   ray.init, event hub    ◀──hub──   runs the artifact

* The **bridge** is a child process that is the Ray driver (``ray.init``).  Ray is never loaded
  into the control plane: a lost Ray cluster makes Ray terminate its driver process, and that
  must cost us the bridge, not the server.  The executor restarts the bridge with backoff, and
  fails the jobs that were in flight with a *retryable* ``executor`` failure.  The bridge runs
  in its own session, so whatever local Ray processes it started are swept (by session id)
  when it ends, however it ends.
* Each job is a Ray **task** asking ``num_gpus`` GPUs plus as many units of the class resource
  ``lancefn_gpu_class:<class>`` (operators label nodes / KubeRay worker groups with it), with
  the function's ``env`` (and, by the rule in :func:`pip_requirements`, pip packages) in its
  ``runtime_env``.  Ray queues it until a node has room (an autoscaler can add one), so the
  executor *owns queuing* (``owns_queue``): the core launches at once and the job stays PENDING
  until the task itself reports ``started`` from the node, with the node id and the GPU ids Ray
  gave it (``CUDA_VISIBLE_DEVICES`` is set by Ray from those ids).
* Inside the task the artifact runs in the Ray worker process through
  :func:`lancefn_jupyter.server.worker.run_task_inline` — the same code as the local warm worker,
  so results, phases and user-only tracebacks are identical.  fds 1/2 are captured for the
  task's duration and streamed as logs.  Events (started, log, progress) go to a small async
  **event hub** actor that the bridge long-polls (flushed every 20 ms; a task that ends sooner
  returns its events inline instead); the outcome comes back as the task's return value, with
  the number of events flushed before it, so the bridge reports the outcome only after the
  last log line.
* Cancel is ``ray.cancel(force=True)``; a timeout (counted from ``started``, like the local
  executor) is an executor-side deadline that cancels the task and reports ``timeout``.
  Tasks are owned by the bridge, so if the control plane dies Ray stops them (fate sharing) and
  the restarted core re-queues them: nothing runs twice concurrently, nothing is lost.

Real-GPU jobs run on **warm GPU actors**: a pool per (class, GPU count, function name and
version, namespace).  An actor holds its GPUs for its whole life (a CUDA context stays bound to
the devices a process first saw, so a plain reused Ray worker could not be trusted with other
GPU ids), runs that version's later jobs one at a time, and is killed when idle for
``LANCEFN_RAY_ACTOR_IDLE_S`` (default 300 s), when a job of another key of its class needs the
GPUs it sits on, after a crash, or when its job is cancelled or times out (``ray.kill``: the
GPUs are freed; the next job starts a new actor).  Actors are never shared across versions or
namespaces.  CPU and simulated-GPU tasks reuse Ray's warm workers.

Size: over 600 lines because it holds code for three processes (``RayExecutor`` in the server,
the bridge ``_Driver``, the task body in Ray workers) that share one wire format; sections are
marked, and the next split is a package by process.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from ..worker_io import Protocol, flush_stdio, relay
from .base import Executor, ExecutorCallbacks, TaskSpec, redact_env

if TYPE_CHECKING:
    from ..gpu_classes import GpuClassConfig

__all__ = [
    "RayExecutor",
    "CLASS_RESOURCE_PREFIX",
    "class_resource",
    "local_cluster_plan",
    "pip_requirements",
    "default_temp_dir",
]

log = logging.getLogger(__name__)

CLASS_RESOURCE_PREFIX = "lancefn_gpu_class:"
_NAMESPACE = "lancefn"  # Ray namespace of the event hub actors
_SECRET_ENV = ("LANCEFN_API_KEY",)  # the server's admin key must not reach Ray or user code
_MAX_SOCKET_DIR = 40  # Ray's unix sockets live under <temp_dir>/session_…/sockets (107-char limit)
_OUTCOME_GRACE_S = 5.0  # how long an outcome waits for the task's last events to arrive
_CAPACITY_POLL_S = 2.0
_HUB_FLUSH_S = 0.02  # a running task's events reach the hub (and the control plane) this often
_START_ATTEMPTS = 3  # failed starts in a row before the jobs waiting for Ray fail (retryable)
_ACTOR_IDLE_S = 300.0  # a warm GPU actor idle this long is killed (LANCEFN_RAY_ACTOR_IDLE_S)


def class_resource(gpu_class: str) -> str:
    """The Ray custom resource of a GPU class: one unit per GPU of the class on a node."""
    return CLASS_RESOURCE_PREFIX + gpu_class


def local_cluster_plan(classes: "GpuClassConfig | None") -> dict:
    """What a local Ray started by the executor gets: ``{"gpu_ids": [...], "resources": {...}}``.

    Every configured device becomes one logical Ray GPU (real classes keep their CUDA ids, so
    Ray hands tasks real device ids; simulated classes get ``sim0, sim1, …`` numbered across
    classes) and each class gets its class resource with one unit per device.  Ray enforces the
    per-class *counts*; on one node it may hand a task of one class a GPU id listed for another.
    """
    gpu_ids: list[str] = []
    resources: dict[str, int] = {}
    sim = 0
    for spec in classes.classes if classes is not None else ():
        if spec.simulated:
            ids = [f"sim{sim + i}" for i in range(len(spec.devices))]
            sim += len(ids)
        else:
            ids = list(spec.devices)
        gpu_ids += ids
        if ids:
            resources[class_resource(spec.name)] = len(ids)
    return {"gpu_ids": gpu_ids, "resources": resources}


def default_temp_dir(home: str | os.PathLike[str] | None) -> str:
    """Ray's temp dir for a local cluster: ``<home>/ray`` when short enough for Ray's unix
    sockets, else a per-home directory under the system temp dir."""
    if os.environ.get("LANCEFN_RAY_TEMP_DIR"):
        return os.environ["LANCEFN_RAY_TEMP_DIR"]
    if home is not None:
        candidate = os.path.join(os.path.abspath(home), "ray")
        if len(candidate) <= _MAX_SOCKET_DIR:
            return candidate
    import hashlib
    import tempfile

    tag = hashlib.sha256(str(home).encode()).hexdigest()[:8]
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return os.path.join(base, f"lancefn-ray-{os.getuid() if hasattr(os, 'getuid') else 0}-{tag}")


def pip_requirements(packages: Sequence[str], mode: str = "auto") -> list[str]:
    """Which declared packages go into a task's ``runtime_env["pip"]``.

    ``auto`` (default): only PEP 508 requirements that are *not* satisfied in the control
    plane's own environment — the same check the worker makes.  A local Ray shares that
    environment, and a cluster image is expected to be built like it, so installed packages
    are not re-installed per task (and a cluster without internet keeps working).
    ``always``: every PEP 508 requirement.  ``never``: none.  Conda specs never go to pip; the
    worker's check in the task still fails such a job in phase ``environment`` naming them.
    """
    if mode == "never" or not packages:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    pep508 = []
    for text in packages:
        try:
            Requirement(text)
        except InvalidRequirement:
            continue
        pep508.append(text)
    if mode == "always":
        return pep508
    from ..worker import missing_packages

    missing = {text for text, _ in missing_packages(pep508)}
    return [text for text in pep508 if text in missing]


# =========================================================================== control plane side


class _BridgeDown(RuntimeError):
    pass


class _BridgeProcess:
    """The control plane's handle on one bridge (Ray driver) process."""

    def __init__(self, config: dict, env: Mapping[str, str], scrub: Callable[[str], str]) -> None:
        code = "from lancefn_jupyter.server.executors.ray import _bridge_main; raise SystemExit(_bridge_main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,  # its session id marks every local Ray process it starts
        )
        self.sid = self.proc.pid
        self._scrub = scrub  # Ray may quote a task's runtime_env (function env values) in its output
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self._write_lock = threading.Lock()
        threading.Thread(target=self._forward_stderr, name="lancefn-ray-stderr", daemon=True).start()
        self.send(config)

    def _forward_stderr(self) -> None:
        """Ray's own messages go to the server's log, and the last ones into failure messages."""
        for raw in self.proc.stderr:  # type: ignore[union-attr]
            line = self._scrub(raw.decode("utf-8", "replace").rstrip())
            if line:
                self.tail.append(line)
                try:
                    sys.stderr.write(f"[ray] {line}\n")
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass

    def send(self, message: dict) -> None:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._write_lock:
            try:
                self.proc.stdin.write(data)  # type: ignore[union-attr]
                self.proc.stdin.flush()  # type: ignore[union-attr]
            except (BrokenPipeError, OSError, ValueError):  # gone: its EOF is handled by the reader
                pass

    def events(self) -> Iterator[dict]:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError:
                    log.warning("ray bridge sent a malformed line: %r", line[:200])

    def problem(self) -> str:
        """The most telling recent line Ray wrote (an error if there is one)."""
        lines = list(self.tail)
        for line in reversed(lines):
            if any(word in line for word in ("Error", "error", "Failed", "failed", "refused")):
                return line[-500:]
        return lines[-1][-500:] if lines else ""

    def stop(self, grace_s: float) -> int:
        """Ask it to shut down (cancel tasks, ``ray.shutdown``), then make sure of it."""
        if self.proc.poll() is None:
            self.send({"op": "shutdown"})
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self) -> int:
        """SIGTERM/SIGKILL the bridge and every process left in its session; reap it."""
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    self.proc.wait(3.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        _kill_session(self.sid)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
        return self.proc.wait()


def _session_pids(sid: int) -> list[int]:
    import psutil  # a dependency; portable where /proc is not

    found = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            if os.getsid(pid) == sid:
                found.append(pid)
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return found


def _kill_session(sid: int, grace_s: float = 2.0) -> None:
    """Stop the processes a bridge left behind (Ray's raylet, GCS, agents, workers)."""
    pids = _session_pids(sid)
    if not pids:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _session_pids(sid):
        time.sleep(0.1)
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class RayExecutor(Executor):
    """Runs each job as a Ray task (see the module docstring)."""

    name = "ray"
    owns_queue = True  # Ray queues and places jobs; the core launches at once (docs/ray.md)

    def __init__(
        self,
        address: str | None = None,
        classes: "GpuClassConfig | None" = None,
        home: str | os.PathLike[str] | None = None,
        *,
        temp_dir: str | None = None,
        pip_mode: str | None = None,
        lost_after_s: float | None = None,
        start_timeout_s: float = 180.0,
        stop_grace_s: float = 10.0,
    ) -> None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # say so at startup, not at the first job
            raise RuntimeError("the ray executor needs Ray; install it with: pip install 'lancefn-jupyter[ray]'")
        self._address = address or None
        self._classes = classes
        self._home = home
        self._temp_dir = temp_dir
        self._pip_mode = (pip_mode or os.environ.get("LANCEFN_RAY_PIP") or "auto").lower()
        if self._pip_mode not in ("auto", "always", "never"):
            raise ValueError(f"LANCEFN_RAY_PIP is {self._pip_mode!r}; use auto, always or never")
        self._lost_after_s = float(lost_after_s or os.environ.get("LANCEFN_RAY_LOST_AFTER_S") or 30.0)
        self._start_timeout_s = start_timeout_s
        self._stop_grace_s = stop_grace_s
        self._callbacks: ExecutorCallbacks = None  # type: ignore[assignment]  # set by start(), before any launch
        self._lock = threading.Lock()
        self._state = "stopped"  # starting | up | stopped
        self._bridge: _BridgeProcess | None = None  # the live bridge (also while it starts)
        self._buffer: list[TaskSpec] = []  # launched while the bridge starts
        self._inflight: dict[str, TaskSpec] = {}  # sent to the bridge, no outcome yet
        self._recent_envs: collections.deque[dict[str, str]] = collections.deque(maxlen=64)
        self._capacity: dict[str, int] | None = None
        self._largest: dict[str, int] = {}  # per class: GPUs of its biggest node (from the bridge)
        self._start_failures = 0
        if self._address is None and classes is not None:
            plan = local_cluster_plan(classes)["resources"]
            self._capacity = {spec.name: int(plan.get(class_resource(spec.name), 0)) for spec in classes.classes}
        self._closed = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"Ray cluster at {self._address}" if self._address else "local Ray started by the control plane"

    # ------------------------------------------------------------------ Executor interface

    def start(self, callbacks: ExecutorCallbacks) -> None:
        """Returns at once: Ray starts in the background (jobs launched meanwhile wait PENDING)."""
        self._callbacks = callbacks
        if self._address is None and self._classes is not None:
            empty = [spec.name for spec in self._classes.classes if not spec.devices]
            if empty:
                log.warning(
                    "GPU classes %s list no devices, so the local Ray has no GPUs for them; "
                    "give them devices/simulated or pass --ray-address",
                    ", ".join(empty),
                )
        with self._lock:
            self._state = "starting"
        self._supervisor = threading.Thread(target=self._supervise, name="lancefn-ray", daemon=True)
        self._supervisor.start()

    def launch(self, task: TaskSpec) -> None:
        with self._lock:
            if self._closed.is_set():
                raise _BridgeDown("the Ray executor is shutting down")
            if self._state != "up" or self._bridge is None:
                self._buffer.append(task)
                return
            self._inflight[task.job_id] = task
            bridge = self._bridge
        bridge.send({"op": "launch", "job": _job_payload(task)})

    def cancel(self, job_id: str) -> None:
        with self._lock:
            self._buffer = [task for task in self._buffer if task.job_id != job_id]
            task = self._forget(job_id)
            bridge = self._bridge if self._state == "up" else None
        if task is not None and bridge is not None:
            bridge.send({"op": "cancel", "job_id": job_id})

    def capacity(self) -> dict[str, int] | None:
        with self._lock:
            return dict(self._capacity) if self._capacity is not None else None

    def pending_reason(self, gpu_class: str | None, num_gpus: int) -> str | None:
        with self._lock:
            largest = self._largest.get(gpu_class) if gpu_class and num_gpus else None
        if largest is None or num_gpus <= largest:
            return None
        return (
            f"no node of GPU class {gpu_class!r} can currently fit {num_gpus} GPUs (the largest has {largest}); "
            "the job waits for the autoscaler or a bigger node to join"
        )

    def _forget(self, job_id: str) -> TaskSpec | None:
        """Drop an in-flight job (lock held); Ray's lines about it may still come, so its env
        stays in the scrub list a while."""
        task = self._inflight.pop(job_id, None)
        if task is not None and task.env:
            self._recent_envs.append(task.env)
        return task

    def _scrub(self, text: str) -> str:
        """``text`` without the env values of any job Ray holds, is about to get or just ended."""
        with self._lock:
            envs = [task.env for task in (*self._buffer, *self._inflight.values()) if task.env]
            envs += self._recent_envs
        return redact_env(text, envs) if envs else text

    def shutdown(self) -> None:
        self._closed.set()
        with self._lock:
            bridge = self._bridge
            self._state = "stopped"
        if bridge is not None:
            bridge.stop(self._stop_grace_s)
        if self._supervisor is not None:
            self._supervisor.join(self._stop_grace_s + 10)

    # ------------------------------------------------------------------ the bridge's life

    def _bridge_config(self) -> tuple[dict, dict[str, str]]:
        env = {name: value for name, value in os.environ.items() if name not in _SECRET_ENV}
        # Simulated classes get NUMBA_ENABLE_CUDASIM per task; it must not leak into real ones.
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Backstop: if our own loss detection does not fire, Ray ends the driver itself.
        env.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", str(int(self._lost_after_s + 30)))
        config: dict[str, Any] = {
            "op": "configure",
            "address": self._address,
            "classes": [spec.name for spec in self._classes.classes] if self._classes else [],
            "pip_mode": self._pip_mode,
            "lost_after_s": self._lost_after_s,
        }
        if self._address is None:
            plan = local_cluster_plan(self._classes)
            config["local"] = {
                "num_gpus": len(plan["gpu_ids"]),
                "resources": plan["resources"],
                "temp_dir": self._temp_dir or default_temp_dir(self._home),
            }
            # The raylet inherits this: Ray then hands out exactly these ids (see local_cluster_plan).
            env["CUDA_VISIBLE_DEVICES"] = ",".join(plan["gpu_ids"])
        return config, env

    def _supervise(self) -> None:
        backoff = 1.0
        while not self._closed.is_set():
            try:
                up = self._run_bridge()
            except Exception:  # a bug here must not leave the executor silently dead
                log.exception("ray executor: supervisor error")
                up = False
            if up:
                backoff = 1.0  # it was up: reconnect quickly
            if self._closed.is_set():
                return
            self._closed.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _run_bridge(self) -> bool:
        """One bridge's life; returns whether it came up."""
        config, env = self._bridge_config()
        with self._lock:
            if self._closed.is_set():
                return False
            self._state = "starting"
            try:
                bridge = _BridgeProcess(config, env, self._scrub)
            except OSError as error:
                bridge = None
                spawn_error = str(error)
            self._bridge = bridge
        if bridge is None:
            self._start_failed(f"could not start the Ray driver process: {spawn_error}")
            return False
        timer = threading.Timer(self._start_timeout_s, bridge.kill)
        timer.daemon = True
        timer.start()
        events = bridge.events()
        ready = next(events, None)
        timer.cancel()
        if ready is None or ready.get("event") != "ready":
            rc = bridge.kill()
            detail = (ready or {}).get("message") or bridge.problem() or _describe_exit(rc)
            self._start_failed(f"could not start or reach the {self.where}: {detail}")
            return False
        log.warning("ray executor: connected to %s (%s)", self.where, ready.get("address"))
        with self._lock:
            self._start_failures = 0
            self._capacity = {str(k): int(v) for k, v in ready.get("capacity", {}).items()}
            self._largest = {str(k): int(v) for k, v in ready.get("largest", {}).items()}
            self._state = "up"
            buffered, self._buffer = self._buffer, []
            for task in buffered:
                self._inflight[task.job_id] = task
        for task in buffered:
            bridge.send({"op": "launch", "job": _job_payload(task)})
        lost = None
        for event in events:
            if event.get("event") == "lost":
                lost = event.get("message")
            else:
                try:
                    self._on_event(event)
                except Exception:
                    log.exception("ray executor: could not handle %s event", event.get("event"))
        rc = bridge.kill()
        if self._closed.is_set():
            return True
        reason = lost or bridge.problem() or _describe_exit(rc)
        self._went_down(f"lost the {self.where}: {reason}", lost=True)
        return True

    def _start_failed(self, reason: str) -> None:
        """A start attempt failed.  Jobs waiting for Ray keep waiting through a few attempts
        (a busy machine can make Ray's own 30 s startup wait expire once), then fail."""
        with self._lock:
            self._bridge = None
            self._start_failures += 1
            give_up = self._start_failures >= _START_ATTEMPTS
        log.warning("ray executor: %s (attempt %d)", reason, self._start_failures)
        if give_up:
            self._went_down(reason, lost=False)

    def _went_down(self, reason: str, *, lost: bool) -> None:
        """Fail what was waiting on this bridge (retryable), and stay down until the next try."""
        with self._lock:
            self._bridge = None
            # New launches wait (PENDING) for the next attempt; if it fails too, they fail then.
            self._state = "stopped" if self._closed.is_set() else "starting"
            failed = list(self._buffer) + list(self._inflight.values())
            self._buffer, self._inflight = [], {}
            self._recent_envs.extend(task.env for task in failed if task.env)
        log.warning("ray executor: %s", reason)
        from ...models import JobFailure

        suffix = (
            "the job did not finish; run it again (the control plane reconnects in the background)"
            if lost
            else "run the job again once Ray is reachable (the control plane keeps retrying)"
        )
        for task in failed:
            self._callbacks.task_failed(
                task.job_id, JobFailure(phase="executor", message=f"{reason}; {suffix}", retryable=True)
            )

    def _on_event(self, event: dict) -> None:
        kind, callbacks = event.get("event"), self._callbacks
        job_id = event.get("job_id", "")
        if kind == "capacity":
            with self._lock:
                self._capacity = {str(k): int(v) for k, v in event.get("capacity", {}).items()}
                self._largest = {str(k): int(v) for k, v in event.get("largest", {}).items()}
            return
        with self._lock:
            known = job_id in self._inflight
            if kind in ("result", "failed"):
                self._forget(job_id)
        if not known:
            return  # cancelled meanwhile: the core has already finished it
        relay(callbacks, job_id, event)


def _describe_exit(returncode: int | None) -> str:
    from ..worker import describe_exit

    return describe_exit(returncode).replace("worker process", "the Ray driver process")  # type: ignore[arg-type]


def _ray_data_fields(data: dict) -> dict:
    """The data plane's task fields for a Ray task: Arrow rows go as IPC bytes (the task may run
    on another node) and the result comes back as IPC bytes (``result_ipc``), never as JSON."""
    if not data:
        return {}
    fields = {"input_types": data.get("input_types") or {}, "output_type": data.get("output_type"), "result_ipc": True}
    if "rows_file" in data:
        fields["rows_ipc"] = Path(data["rows_file"]).read_bytes()
    return fields


def _store_result(final: dict, path: str | None, durable: bool) -> dict:
    """Write a task's ``result_ipc`` atomically to the job's result file; the ``result`` event."""
    from ...dataplane import write_bytes_file

    if path is None:
        return {"event": "failed", "phase": "executor", "message": "an Arrow result arrived for a job without a result file"}
    try:
        nbytes = write_bytes_file(path, final["result_ipc"], durable=durable)
    except OSError as error:
        return {"event": "failed", "phase": "executor", "message": f"could not store the result ({error})", "retryable": True}
    return {"event": "result", "result_file": path, "nbytes": nbytes, "summary": final.get("summary") or {}}


def _job_payload(task: TaskSpec) -> dict:
    return {
        "job_id": task.job_id,
        "name": task.name,
        "version": task.version,
        "artifact_b64": base64.b64encode(task.artifact).decode("ascii"),
        "entrypoint": task.entrypoint,
        "rows": task.rows,
        "gpu_class": task.gpu_class,
        "num_gpus": task.num_gpus,
        "simulated": task.simulated,
        "env": dict(task.env),
        "packages": list(task.packages),
        "timeout_s": task.timeout_s,
        "namespace": task.namespace,
        "data": dict(task.data),
    }


# =========================================================================== bridge (Ray driver)


@dataclass(eq=False)
class _BridgeJob:
    job_id: str
    ref: Any
    timeout_s: float | None
    rows_total: int
    seen: int = 0  # events relayed
    rows_done: int = 0
    deadline: float | None = None
    outcome: dict | None = None  # parked until `seen` reaches its last_seq
    outcome_due: float = 0.0
    finished: bool = False
    actor: Any = None  # the warm GPU actor running it (real-GPU jobs)
    pool_key: tuple | None = None
    started: bool = False
    result_file: str | None = None  # where an Arrow result goes (the bridge shares the server's disk)
    result_fsync: bool = True


class _Driver:
    """The bridge: submits tasks, relays their events, enforces timeouts, watches the cluster."""

    def __init__(self, config: dict, proto: Protocol) -> None:
        import ray

        self.ray = ray
        self.config = config
        self.proto = proto
        self.local = config.get("local") is not None
        self.classes: list[str] = list(config.get("classes") or ())
        self.pip_mode = config.get("pip_mode", "auto")
        self.lost_after_s = float(config.get("lost_after_s", 30.0))
        self.jobs: dict[str, _BridgeJob] = {}
        self.lock = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.last_ok = time.monotonic()
        self.capacity: dict[str, int] = {}
        self.largest: dict[str, int] = {}
        # Named, so tasks look it up once per worker process instead of receiving a handle
        # with every task (a handle argument costs each task a borrower round trip).
        self.hub_name = f"lancefn-hub-{uuid.uuid4().hex[:16]}"
        # Pinned to this driver's node: the hub then shares the driver's fate and no other node's
        # loss can stop every job's events (Ray would not restart it, and its events would be lost).
        self.hub = (
            ray.remote(num_cpus=0)(_EventHub)
            .options(name=self.hub_name, namespace=_NAMESPACE, scheduling_strategy=self._driver_node())
            .remote()
        )
        ray.get(self.hub.drain.remote(0.0), timeout=120)  # type: ignore[attr-defined]
        # CPU and simulated tasks reuse Ray's warm workers; real-GPU jobs use warm actors (_actor_for).
        self.reusable = ray.remote(max_calls=0)(_run_job)
        self.gpu_actor = ray.remote(_GpuActor)
        self.actor_idle_s = float(os.environ.get("LANCEFN_RAY_ACTOR_IDLE_S") or _ACTOR_IDLE_S)
        self.idle_actors: dict[tuple, list[tuple[Any, float]]] = {}  # pool key → (actor, idle since)
        self._submitters: dict[str, Any] = {}
        self.daemons = self._local_daemons() if self.local else []
        self.capacity, self.largest = self._read_capacity()

    def _driver_node(self) -> Any:
        """A hard affinity to the node this driver runs on ("DEFAULT" when Ray cannot say, e.g.
        over Ray Client, where the driver runs on the head anyway)."""
        try:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            return NodeAffinitySchedulingStrategy(node_id=self.ray.get_runtime_context().get_node_id(), soft=False)
        except Exception:
            return "DEFAULT"

    # ------------------------------------------------------------------ commands (main thread)

    def serve(self) -> None:
        try:
            address = self.ray.get_runtime_context().gcs_address
        except Exception:  # e.g. Ray Client (ray://) connections
            address = self.config.get("address") or "local"
        self.proto.send(event="ready", capacity=self.capacity, largest=self.largest, address=address)
        for target, name in ((self._pump, "pump"), (self._report, "report"), (self._watch, "watch")):
            threading.Thread(target=target, name=f"lancefn-ray-{name}", daemon=True).start()
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            command = json.loads(line)
            op = command.get("op")
            if op == "shutdown":
                break
            try:
                if op == "launch":
                    self.launch(command["job"])
                elif op == "cancel":
                    self.cancel(command["job_id"])
            except Exception as error:  # one bad job must not take the driver down
                logging.getLogger(__name__).exception("ray bridge: %s failed", op)
                if op == "launch":
                    with self.lock:
                        self.jobs.pop(command["job"]["job_id"], None)
                    self.proto.send(
                        event="failed",
                        job_id=command["job"]["job_id"],
                        phase="executor",
                        message=f"could not submit the job to Ray: {type(error).__name__}: {error}",
                        retryable=True,
                    )

    def launch(self, job: dict) -> None:
        from ..worker import artifact_filename

        job_id = job["job_id"]
        gpus = int(job.get("num_gpus") or 0)
        options: dict[str, Any] = {
            "num_cpus": 0 if gpus else 1,  # GPU tasks are bounded by GPUs, not by the node's cores
            "num_gpus": gpus,
            "max_retries": 0,  # a crash fails the job (phase worker); it is never silently re-run
            "name": f"lancefn:{job['name']}@{job['version']}",
        }
        if gpus and job.get("gpu_class"):
            options["resources"] = {class_resource(job["gpu_class"]): gpus}
        runtime_env = self._runtime_env(job)
        if runtime_env:
            options["runtime_env"] = runtime_env
        pooled = bool(gpus and not job.get("simulated"))
        payload = {
            "job_id": job_id,
            "hub": self.hub_name,
            "task": {
                "task_id": job_id,
                "artifact_b64": job["artifact_b64"],
                "entrypoint": job["entrypoint"],
                "filename": artifact_filename(job["name"], job["version"]),
                "rows": job["rows"],
                "packages": job.get("packages") or [],
                **_ray_data_fields(job.get("data") or {}),
            },
        }
        data = job.get("data") or {}
        record = _BridgeJob(job_id, None, job.get("timeout_s"), int(data.get("rows_total", len(job["rows"]))))
        record.result_file = data.get("result_file")
        record.result_fsync = bool(data.get("result_fsync", True))
        with self.lock:  # registered first: the task's events may arrive before .remote() returns
            self.jobs[job_id] = record
        try:
            if pooled:
                record.pool_key = (job.get("gpu_class"), gpus, job["name"], job["version"], job.get("namespace") or "")
                record.actor = self._actor_for(record.pool_key, options)
                ref = record.actor.run.remote(payload)
            else:
                ref = self._submitter(options).remote(payload)
        except Exception as error:  # e.g. an invalid runtime_env
            if record.actor is not None:
                self._kill_actor(record.actor)
            with self.lock:
                self.jobs.pop(job_id, None)
            self.proto.send(
                event="failed", job_id=job_id, phase="environment", message=f"Ray refused the task: {error}"
            )
            return
        with self.lock:
            record.ref = ref
            cancelled = record.finished  # cancelled while being submitted
        if cancelled:
            self._stop(record)
            return
        ref.future().add_done_callback(lambda future, job_id=job_id: self.inbox.put(("outcome", job_id, future)))

    def _actor_for(self, key: tuple, options: dict) -> Any:
        """A warm actor of ``key`` (most recently idle first), else a new one holding the GPUs.
        Idle actors of the same class but another key are killed first: their GPUs may be the
        ones this job needs."""
        retire = []
        with self.lock:
            idle = self.idle_actors.get(key)
            if idle:
                actor, _ = idle.pop()
                return actor
            for other in [k for k in self.idle_actors if k[0] == key[0]]:
                retire += [actor for actor, _ in self.idle_actors.pop(other)]
        for actor in retire:
            self._kill_actor(actor)
        actor_options = {k: v for k, v in options.items() if k in ("num_gpus", "resources", "runtime_env")}
        return self.gpu_actor.options(
            num_cpus=0, max_restarts=0, max_concurrency=1, name=None, **actor_options
        ).remote()

    def _kill_actor(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or the cluster is going away
            pass

    def _submitter(self, options: dict) -> Any:
        """``remote.options(**options)``, cached: Ray parses and serializes the runtime_env on
        every ``.options()`` call, and most jobs share a handful of option sets."""
        key = json.dumps(options, sort_keys=True)
        submitter = self._submitters.pop(key, None)
        if submitter is None:
            submitter = self.reusable.options(**options)
        self._submitters[key] = submitter  # most recently used last
        while len(self._submitters) > 256:
            self._submitters.pop(next(iter(self._submitters)))
        return submitter

    def _runtime_env(self, job: dict) -> dict:
        env_vars = {str(k): str(v) for k, v in (job.get("env") or {}).items()}
        # Ray pools warm workers per runtime_env: this keeps simulated tasks (numba imported in
        # simulator mode) out of the CPU tasks' workers.
        if job.get("simulated"):
            env_vars["NUMBA_ENABLE_CUDASIM"] = "1"
        runtime_env: dict[str, Any] = {}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        pip = pip_requirements(job.get("packages") or (), self.pip_mode)
        if pip:
            runtime_env["pip"] = pip
        return runtime_env

    def cancel(self, job_id: str) -> None:
        with self.lock:
            record = self.jobs.pop(job_id, None)
            if record is not None:
                record.finished = True
        if record is not None:
            self._stop(record)

    def _stop(self, record: _BridgeJob) -> None:
        """Stop a job's task; a warm actor is killed (Ray cannot force-cancel an actor's task),
        which frees its GPUs."""
        if record.actor is not None:
            self._kill_actor(record.actor)
            return
        if record.ref is None:
            return
        try:
            self.ray.cancel(record.ref, force=True)
        except Exception:  # already finished, or the cluster is going away
            pass

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            records = list(self.jobs.values())
            self.jobs.clear()
        for record in records:
            self._stop(record)
        with self.lock:
            idle = [actor for actors in self.idle_actors.values() for actor, _ in actors]
            self.idle_actors.clear()
        for actor in idle:
            self._kill_actor(actor)
        try:
            self.ray.shutdown()
        except Exception:
            pass

    # ------------------------------------------------------------------ threads

    def _pump(self) -> None:
        """Long-poll the hub; events go to the reporter in the order tasks sent them."""
        while not self.stopping.is_set():
            try:
                batch = self.ray.get(self.hub.drain.remote(1.0), timeout=30)  # type: ignore[attr-defined]
            except Exception:
                if self.stopping.is_set():
                    return
                time.sleep(0.5)
                continue
            if batch:
                self.inbox.put(("events", batch, None))

    def _report(self) -> None:
        while not self.stopping.is_set():
            try:
                item = self.inbox.get(timeout=self._next_wakeup())
            except queue.Empty:
                item = None
            try:
                if item is not None:
                    kind, first, second = item
                    if kind == "events":
                        for job_id, seq, event in first:
                            self._relay(job_id, seq, event)
                    else:
                        self._outcome(first, second)
                self._tick()
            except Exception:
                logging.getLogger(__name__).exception("ray bridge: reporter error")

    def _next_wakeup(self) -> float:
        now, wake = time.monotonic(), 0.5
        with self.lock:
            for record in self.jobs.values():
                for due in (record.deadline, record.outcome_due if record.outcome else None):
                    if due is not None:
                        wake = min(wake, max(0.0, due - now))
        return wake

    def _relay(self, job_id: str, seq: int, event: dict) -> None:
        with self.lock:
            record = self.jobs.get(job_id)
            if record is None or record.finished:
                return
            record.seen = max(record.seen, seq)
            kind = event.get("event")
            if kind == "started":
                record.started = True
                if record.timeout_s is not None:
                    record.deadline = time.monotonic() + float(record.timeout_s)
            if kind == "progress":
                record.rows_done = int(event.get("rows_done", 0))
            parked = record.outcome if record.outcome and record.seen >= record.outcome.get("last_seq", 0) else None
            if parked is not None:
                record.outcome = None
        self.proto.send(job_id=job_id, **event)
        if parked is not None:
            self._finish(job_id, parked)

    def _outcome(self, job_id: str, future: Any) -> None:
        returned = True
        try:
            value = future.result()
        except BaseException as error:  # the task did not return: cancelled, crashed, lost, …
            value = {"last_seq": 0, "final": _failure_from_ray_error(error, self.ray)}
            returned = False
        with self.lock:
            record = self.jobs.get(job_id)
            if record is None or record.finished:
                return
            if record.actor is not None:
                # It ran the job and lives: warm for the version's next job, unless a job of
                # another version of the class waits (its GPUs may be the ones it needs).
                key = record.pool_key
                waiting = any(
                    other.pool_key is not None and other.pool_key[0] == key[0] and other.pool_key != key  # type: ignore[index]
                    and not other.started and not other.finished
                    for other in self.jobs.values()
                )
                if returned and not waiting:
                    self.idle_actors.setdefault(key, []).append((record.actor, time.monotonic()))  # type: ignore[arg-type]
                else:
                    self._kill_actor(record.actor)  # crashed or lost: never reused
                record.actor = None
            if record.seen < int(value.get("last_seq", 0)):
                record.outcome, record.outcome_due = value, time.monotonic() + _OUTCOME_GRACE_S
                return
        self._finish(job_id, value)

    def _finish(self, job_id: str, value: dict) -> None:
        for seq, event in value.get("tail") or ():  # events the task had not pushed to the hub
            self._relay(job_id, seq, event)
        with self.lock:
            record = self.jobs.pop(job_id, None)
            if record is None or record.finished:
                return
            record.finished = True
        final = dict(value.get("final") or {})
        if "result_ipc" in final:  # Arrow IPC bytes Ray carried natively: stored as the job's result file
            final = _store_result(final, record.result_file, record.result_fsync)
        final.setdefault("event", "failed")
        if final["event"] == "failed":
            final.setdefault("phase", "executor")
            final.setdefault("message", "the Ray task ended without a result")
        self.proto.send(job_id=job_id, **final)

    def _tick(self) -> None:
        now = time.monotonic()
        expired, overdue = [], []
        with self.lock:
            for record in list(self.jobs.values()):
                if record.deadline is not None and now >= record.deadline and not record.finished:
                    record.finished = True
                    self.jobs.pop(record.job_id, None)
                    expired.append(record)
                elif record.outcome is not None and now >= record.outcome_due:
                    overdue.append((record.job_id, record.outcome))
                    record.outcome = None
        for record in expired:
            self._stop(record)
            self.proto.send(
                event="failed",
                job_id=record.job_id,
                phase="timeout",
                message=f"the job ran longer than its timeout of {float(record.timeout_s):g} s and was stopped "  # type: ignore[arg-type]
                f"({record.rows_done} of {record.rows_total} rows done)",
            )
        for job_id, value in overdue:
            self._finish(job_id, value)
        retire = []
        with self.lock:
            for key in list(self.idle_actors):
                keep = [(actor, since) for actor, since in self.idle_actors[key] if now - since < self.actor_idle_s]
                retire += [actor for actor, since in self.idle_actors[key] if now - since >= self.actor_idle_s]
                if keep:
                    self.idle_actors[key] = keep
                else:
                    del self.idle_actors[key]
        for actor in retire:
            self._kill_actor(actor)
        if now - self.last_ok > self.lost_after_s:
            self._lost(f"the Ray cluster has not answered for {self.lost_after_s:g} s")

    def _watch(self) -> None:
        """Capacity per class (from the cluster's resources), and whether the cluster is alive."""
        while not self.stopping.wait(_CAPACITY_POLL_S):
            dead = [name for name, proc in self.daemons if not _alive(proc)]
            if dead:
                self._lost(f"the local Ray's {' and '.join(dead)} stopped")
            try:
                capacity, largest = self._read_capacity()
            except Exception:
                continue  # the reporter declares the cluster lost once this stays stale
            self.last_ok = time.monotonic()
            if (capacity, largest) != (self.capacity, self.largest):
                self.capacity, self.largest = capacity, largest
                self.proto.send(event="capacity", capacity=capacity, largest=largest)

    def _read_capacity(self) -> tuple[dict[str, int], dict[str, int]]:
        """GPUs per class in the cluster, and on its biggest live node (a task never spans nodes:
        a job asking more than that waits until an autoscaler or operator adds a bigger node)."""
        resources = self.ray.cluster_resources()
        capacity = {name: int(resources.get(class_resource(name), 0)) for name in self.classes}
        largest = dict.fromkeys(self.classes, 0)
        for node in self.ray.nodes():
            if node.get("Alive"):
                have = node.get("Resources") or {}
                for name in self.classes:
                    fit = int(min(have.get(class_resource(name), 0), have.get("GPU", 0)))
                    largest[name] = max(largest[name], fit)
        return capacity, largest

    def _lost(self, message: str) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.proto.send(event="lost", message=message)
        os._exit(3)  # Ray cannot shut down cleanly now; the control plane sweeps our session

    def _local_daemons(self) -> list[tuple[str, Any]]:
        try:
            import psutil

            return [
                (proc.name(), proc)
                for proc in psutil.Process().children(recursive=True)
                if proc.name() in ("raylet", "gcs_server")
            ]
        except Exception:
            return []


def _alive(proc: Any) -> bool:
    try:
        import psutil

        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _failure_from_ray_error(error: BaseException, ray: Any) -> dict:
    """A failed event for a task that raised instead of returning its outcome."""
    exceptions = ray.exceptions
    text = str(error).strip()
    short = text.splitlines()[-1][:1000] if text else type(error).__name__
    if isinstance(error, exceptions.TaskCancelledError):
        return {"event": "failed", "phase": "executor", "message": "the Ray task was cancelled outside lancefn"}
    if isinstance(error, exceptions.RuntimeEnvSetupError):
        return {
            "event": "failed",
            "phase": "environment",
            "message": f"Ray could not set up the job's runtime_env (pip packages / env): {text[-1500:]}",
        }
    if isinstance(error, exceptions.OutOfMemoryError):
        return {"event": "failed", "phase": "worker", "message": f"Ray killed the worker for lack of memory: {short}"}
    if isinstance(error, exceptions.WorkerCrashedError) or (
        isinstance(error, exceptions.ActorDiedError) and "worker process has died" in text
    ):  # a warm GPU actor's process died (its node dying instead stays a retryable loss)
        return {
            "event": "failed",
            "phase": "worker",
            "message": "the Ray worker process died while running the job (a crash in native code, or killed); "
            "its output so far is in the job's logs",
        }
    if isinstance(error, exceptions.RayTaskError):
        cause = getattr(error, "cause", None)
        if isinstance(cause, ModuleNotFoundError) and "lancefn_jupyter" in str(cause):
            return {
                "event": "failed",
                "phase": "environment",
                "message": "lancefn-jupyter is not installed on the Ray node that ran the job; install the "
                "same lancefn-jupyter version in the cluster's image (see docs/ray.md)",
            }
        return {"event": "failed", "phase": "executor", "message": f"the Ray task failed outside the function: {short}"}
    return {
        "event": "failed",
        "phase": "executor",
        "retryable": True,
        "message": f"Ray lost the job ({type(error).__name__}: {short}); the job did not finish; run it again",
    }


def _bridge_main() -> int:
    """Entry point of the bridge process (started by :class:`RayExecutor`)."""
    proto = Protocol(os.dup(1), strict=False)
    os.dup2(2, 1)  # anything Ray or a library prints goes to stderr, never into the protocol
    config = json.loads(sys.stdin.buffer.readline() or b"{}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    driver: _Driver | None = None
    once = threading.Lock()

    def finish(code: int) -> None:
        """Cancel tasks, stop Ray, sweep what is left in our session, exit.  Runs once."""
        if not once.acquire(blocking=False):
            return
        watchdog = threading.Timer(20.0, lambda: (_kill_session(os.getpid()), os._exit(code or 1)))  # type: ignore[func-returns-value]
        watchdog.daemon = True
        watchdog.start()
        if driver is not None:
            driver.shutdown()
        _kill_session(os.getpid())  # we lead our session: anything in it is a Ray process we started
        os._exit(code)

    parent = os.getppid()

    def exit_with_parent() -> None:  # stdin EOF normally tells us first; this is the fallback
        while os.getppid() == parent:
            time.sleep(1.0)
        finish(1)

    threading.Thread(target=exit_with_parent, name="lancefn-parent-watch", daemon=True).start()
    try:
        import ray

        kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
        local = config.get("local")
        if local is not None:
            Path(local["temp_dir"]).mkdir(parents=True, exist_ok=True)
            kwargs.update(
                address="local",
                num_gpus=int(local["num_gpus"]),
                resources={str(k): float(v) for k, v in local["resources"].items()},
                _temp_dir=local["temp_dir"],
            )
        else:
            kwargs.update(address=config["address"])
            kwargs.pop("include_dashboard")
        ray.init(**kwargs)
        driver = _Driver(config, proto)
    except BaseException as error:  # say why, then end
        message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        proto.send(event="error", message=f"{type(error).__name__}: {message}"[:2000])
        finish(2)
    driver.serve()  # type: ignore[union-attr]  # returns on "shutdown" or when the control plane goes away (stdin EOF)
    finish(0)
    return 0


# =========================================================================== inside Ray


class _EventHub:
    """Async actor (0 CPUs) collecting task events until the bridge drains them (long poll)."""

    def __init__(self) -> None:
        import asyncio

        self._events: list = []
        self._ready = asyncio.Event()

    async def push(self, job_id: str, events: list) -> None:
        self._events.extend((job_id, seq, event) for seq, event in events)
        self._ready.set()

    async def drain(self, timeout: float) -> list:
        import asyncio

        if not self._events and timeout > 0:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        self._ready.clear()
        events, self._events = self._events, []
        return events


class _HubSender:
    """Numbered, ordered events from a task to the hub, flushed every ``_HUB_FLUSH_S``.

    ``send`` only appends (it never waits on Ray), so output readers can call it directly.  A
    task that ends before the first flush sends nothing through the hub: :meth:`close` hands
    back the unflushed events, which travel inline with the outcome.  So a short job costs no
    extra round trip, and a long one shows ``started``, logs and progress live.
    """

    def __init__(self, hub: Any, job_id: str) -> None:
        self._hub, self._job_id = hub, job_id
        self._lock = threading.Lock()
        self._pending: list[tuple[int, dict]] = []
        self._closed = False
        self.seq = 0  # events numbered so far
        self.flushed = 0  # highest number pushed to the hub
        _flusher().add(self)

    def send(self, **event: Any) -> None:
        with self._lock:
            self.seq += 1
            if self._closed:  # a late line after close: straight to the hub
                self._hub.push.remote(self._job_id, [(self.seq, event)])
            else:
                self._pending.append((self.seq, event))

    def flush(self) -> None:
        with self._lock:  # pushed under the lock: submission order is hub order
            if self._pending and not self._closed:
                batch, self._pending = self._pending, []
                self._hub.push.remote(self._job_id, batch)
                self.flushed = batch[-1][0]

    def close(self) -> list[tuple[int, dict]]:
        """Stop flushing; return the events not pushed (they go with the outcome)."""
        _flusher().discard(self)
        with self._lock:
            self._closed = True
            tail, self._pending = self._pending, []
        return tail


class _Flusher:
    """One thread per Ray worker process flushing every live task's events to the hub."""

    def __init__(self) -> None:
        self._senders: set[_HubSender] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="lancefn-hub-flush", daemon=True).start()

    def add(self, sender: _HubSender) -> None:
        with self._lock:
            self._senders.add(sender)

    def discard(self, sender: _HubSender) -> None:
        with self._lock:
            self._senders.discard(sender)

    def _run(self) -> None:
        while True:
            time.sleep(_HUB_FLUSH_S)
            with self._lock:
                senders = list(self._senders)
            for sender in senders:
                try:
                    sender.flush()
                except Exception:  # the hub is gone (driver ended): the task is being torn down
                    pass


_flushers: list[_Flusher] = []
_flushers_lock = threading.Lock()


def _flusher() -> _Flusher:
    if not _flushers:
        with _flushers_lock:
            if not _flushers:
                _flushers.append(_Flusher())
    return _flushers[0]


class _CapturedOutput:
    """fds 1 and 2 into pipes for the task's duration; their lines become ``log`` events.

    Reader threads hand lines to ``send`` (which only queues them, see :class:`_HubSender`).
    On exit the fds are restored and the readers drain to EOF, so every line precedes the outcome.
    """

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self._saved: dict[int, int] = {}
        self._readers: list[threading.Thread] = []
        self._buffering: list[tuple[Any, bool]] = []

    def __enter__(self) -> "_CapturedOutput":
        flush_stdio()
        for fd, stream in ((1, "stdout"), (2, "stderr")):
            read_fd, write_fd = os.pipe()
            self._saved[fd] = os.dup(fd)
            os.dup2(write_fd, fd)
            os.close(write_fd)
            thread = threading.Thread(target=self._read, args=(read_fd, stream), daemon=True)
            thread.start()
            self._readers.append(thread)
        for std in (sys.stdout, sys.stderr):  # line-buffered, so prints show up live
            try:
                self._buffering.append((std, std.line_buffering))  # type: ignore[arg-type]
                std.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # AttributeError handled below
            except (AttributeError, ValueError):
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        flush_stdio()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)  # closes the pipe's write end at fd: the reader sees EOF
            os.close(saved)
        for thread in self._readers:
            thread.join(5.0)  # bounded: a process the user started may still hold the pipe
        for stream, buffering in self._buffering:
            try:
                stream.reconfigure(line_buffering=buffering)
            except (AttributeError, ValueError):
                pass

    def _read(self, read_fd: int, stream: str) -> None:
        pending = b""
        try:
            while chunk := os.read(read_fd, 65536):
                *complete, pending = (pending + chunk).split(b"\n")
                if complete:
                    self._send(event="log", stream=stream, lines=[line.decode("utf-8", "replace") for line in complete])
            if pending:
                self._send(event="log", stream=stream, lines=[pending.decode("utf-8", "replace")])
        finally:
            os.close(read_fd)


_hubs: dict[str, Any] = {}  # per Ray worker process: hub name → actor handle
_node: list[str] = []  # per Ray worker process: its node id


def _node_id() -> str:
    if not _node:
        import ray

        _node.append(ray.get_runtime_context().get_node_id())
    return _node[0]


class _GpuActor:
    """A warm real-GPU worker (see the module docstring): holds its GPUs, runs one job at a time."""

    def run(self, payload: dict) -> dict:
        return _run_job(payload)


def _run_job(payload: dict) -> dict:
    """The Ray task: report where it runs, run the artifact like the local worker, return the outcome."""
    import ray

    from ..worker import run_task_inline

    hub = _hubs.get(payload["hub"])
    if hub is None:
        hub = _hubs[payload["hub"]] = ray.get_actor(payload["hub"], namespace=_NAMESPACE)
    sender = _HubSender(hub, payload["job_id"])
    node = _node_id()
    sender.send(event="started", devices=[str(gpu) for gpu in ray.get_gpu_ids()], node=node)
    try:
        with _CapturedOutput(sender.send):
            final = run_task_inline(payload["task"], sender.send)
    finally:
        tail = sender.close()
    if final.get("event") == "failed" and final.get("phase") == "environment":
        final["message"] = f"{final.get('message', '')} [on Ray node {node}]"
    # The bridge relays events 1..last_seq from the hub, then the tail, then the outcome.
    return {"last_seq": sender.flushed, "tail": tail, "final": final}
