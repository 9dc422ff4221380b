"""The control-plane side: `RayExecutor` and the bridge child process it supervises (imports no Ray).

Over 600 lines: one concern, the bridge child and its supervision (start, lines in and out, restart, the
failures it reports) over one state; the bridge's lines are read in ``feed.py``."""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.executors.base import Executor, ExecutorCallbacks, TaskSpec, redact_env
from lancefn_jupyter.server.executors.ray.cluster import (
    class_resource,
    default_temp_dir,
    environment_runtime_env,
    kill_session,
    local_cluster_plan,
    needs_resolution,
)
from lancefn_jupyter.server.executors.ray.feed import BridgeFeed
from lancefn_jupyter.server.executors.ray.scaling import scaling_config
from lancefn_jupyter.server.executors.relay import ALL_PHASES, event_problem, failure_of, relay
from lancefn_jupyter.server.policy.demand import scaling_reason
from lancefn_jupyter.wire.jsontext import loads
from lancefn_jupyter.worker.process import ProtocolLines, invalid_event
from lancefn_jupyter.worker.protocol import TEARDOWN_S, LineTooLong

if TYPE_CHECKING:
    from lancefn_jupyter.environments.cache import EnvironmentCache
    from lancefn_jupyter.environments.request import EnvironmentRequest
    from lancefn_jupyter.server.executors.isolation import WorkerUser
    from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig

log = logging.getLogger("lancefn.server")

_SECRET_ENV = ("LANCEFN_API_KEY",)  # the server's admin key must not reach Ray or user code
_START_ATTEMPTS = 3  # failed starts in a row before the jobs waiting for Ray fail (retryable)
# The bridge keeps the artifacts of the versions launched last, so a version's later jobs come
# to it without theirs (the artifact then goes to each new actor of the version from there).
_BRIDGE_ARTIFACTS = 64
_BRIDGE_ARTIFACT_BYTES = 64 * 1024 * 1024
_INLINE_ARTIFACT_BYTES = 24 * 1024  # a larger artifact is encoded by the pipe's writer thread (``_Outbox.launch``)
_JOB_EVENTS = ("started", "log", "progress", "result", "failed")  # what the bridge reports of a job


class _BridgeDown(RuntimeError):
    pass


class _Outbox:
    """The pipe to a bridge, written without blocking: a job is launched by the event loop or by a thread
    holding the core's lock, so it writes what the pipe takes at once (the usual case, no thread hop before
    the bridge wakes) and leaves the rest, and anything sent while a rest waits, to a writer thread that
    waits for room (and encodes a large artifact)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._send_lock = threading.Lock()  # never held across a wait
        # bytes to write; a callable: a launch line the writer thread encodes first (``launch``)
        self._backlog: collections.deque[bytes | Callable[[], bytes]] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        # (name, version, namespace) → its artifact's size: the versions whose artifact the bridge holds
        self._artifacts: collections.OrderedDict[tuple[str, str, str], int] = collections.OrderedDict()
        threading.Thread(target=self._write_out, name="lancefn-ray-stdin", daemon=True).start()

    def send(self, message: dict) -> None:
        data = _line(message)
        with self._send_lock:
            self._put(data)

    def launch(self, task: TaskSpec, runtime_env: Mapping[str, Any] | None = None) -> None:
        """Send a job (with its environment's ``runtime_env`` fields); its version's artifact only if this bridge
        does not hold it already.

        The bridge keeps the artifacts of the versions launched last (``_BRIDGE_ARTIFACTS``,
        ``_BRIDGE_ARTIFACT_BYTES``), and drops one when told to: decided here under the send lock,
        so the bridge sees launches and ``forget`` messages in the order this mirror changed."""
        job = _job_payload(task)
        if runtime_env:
            job["runtime_env"] = dict(runtime_env)
        key = (task.name, task.version, task.namespace or "")
        with self._send_lock:
            artifact = None
            if key in self._artifacts:
                self._artifacts.move_to_end(key)
            else:
                artifact = task.artifact
                self._artifacts[key] = 4 * ((len(artifact) + 2) // 3)  # its base64 length
            forget = b""
            while len(self._artifacts) > 1 and (
                len(self._artifacts) > _BRIDGE_ARTIFACTS or sum(self._artifacts.values()) > _BRIDGE_ARTIFACT_BYTES
            ):
                forget += _line({"op": "forget", "key": list(self._artifacts.popitem(last=False)[0])})
            if artifact is None or len(artifact) <= _INLINE_ARTIFACT_BYTES:
                if artifact is not None:
                    job["artifact_b64"] = _b64(artifact)
                self._put(_line({"op": "launch", "job": job}) + forget)
            elif not self._closed:
                # Encoded by the writer thread, in its place in the line order: whoever launches (the event
                # loop, or a core thread holding the job table's lock) must not spend milliseconds on it.
                self._backlog.append(functools.partial(_launch_line, job, artifact, forget))
                self._wake.set()

    def _put(self, data: bytes) -> None:
        """Into the pipe now, or after what is waiting (send lock held)."""
        if self._closed:
            return
        if not self._backlog:  # nothing ahead of it: straight into the pipe
            data = data[self._write_some(data) :]
            if not data:
                return
        self._backlog.append(data)
        self._wake.set()

    def _write_some(self, data: bytes) -> int:
        """Bytes of ``data`` the pipe took now (send lock held); all of them once the bridge is
        gone (its EOF is handled by the reader)."""
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError:
            return len(data)

    def _write_out(self) -> None:
        """Write the backlog, in order, as the pipe makes room; a line still to encode is encoded here first,
        outside the send lock (only this thread takes from the backlog, so it stays first meanwhile)."""
        room = select.poll()
        room.register(self._fd, select.POLLOUT)
        while True:
            self._wake.wait()
            with self._send_lock:
                front = self._backlog[0] if self._backlog else None
            if callable(front):
                encoded = front()
                with self._send_lock:
                    self._backlog[0] = encoded
            room.poll(1000)  # bounded: the fd may be closed meanwhile (then ``_closed`` is set)
            with self._send_lock:
                if self._closed:
                    return
                while self._backlog:
                    data = self._backlog[0]
                    if callable(data):  # queued meanwhile behind what was written: encoded next time round
                        break
                    done = self._write_some(data)
                    if done < len(data):
                        self._backlog[0] = data[done:]
                        break
                    self._backlog.popleft()
                else:
                    self._wake.clear()

    def close(self) -> None:
        """Nothing is written from now on (the fd is about to be closed); the writer thread ends."""
        with self._send_lock:
            self._closed = True
            self._wake.set()


class _BridgeProcess:
    """The control plane's handle on one bridge (Ray driver) process."""

    def __init__(self, config: dict, env: Mapping[str, str], scrub: Callable[[str], str]) -> None:
        code = "from lancefn_jupyter.server.executors.ray.bridge import bridge_main; raise SystemExit(bridge_main())"
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", code],  # no cwd on its sys.path (docs/ARCHITECTURE.md, "Isolation")
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**env, "PYTHONSAFEPATH": "1"},  # and none on the Ray processes it starts
            cwd="/",
            start_new_session=True,  # its session id marks every local Ray process it starts
        )
        self.sid = self.proc.pid
        self._scrub = scrub  # Ray may quote a task's runtime_env (function env values) in its output
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.outbox = _Outbox(self.proc.stdin.fileno())  # type: ignore[union-attr]
        self._out = ProtocolLines(self.proc.stdout)  # type: ignore[arg-type]
        self._feed: BridgeFeed | None = None
        threading.Thread(target=self._forward_stderr, name="lancefn-ray-stderr", daemon=True).start()
        self.outbox.send(config)

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

    def events(self) -> Iterator[dict]:
        """Its event lines, read on this thread (its first, ``ready``; all of them when there is no event loop)."""
        while True:
            try:
                line = self._out.readline()
            except LineTooLong as error:  # the bridge sends none (it fails the job instead): never buffered whole
                log.warning("ray executor: the bridge sent %s; dropped", error)
                continue
            if not line:
                return
            if line.strip():
                try:
                    event = loads(line)
                except ValueError:
                    log.warning("ray bridge sent a malformed line: %r", line[:200])
                    continue
                if isinstance(event, dict):
                    yield event

    def follow(
        self,
        loop: asyncio.AbstractEventLoop,
        hold_now: Callable[[], Callable[[], None] | None],
        handle: Callable[[dict], None],
        on_loop: Callable[[dict], bool],
    ) -> BridgeFeed:
        """The event loop reads its event lines from now on, from what :meth:`events` left in the buffer."""
        self._feed = BridgeFeed(self._out, loop, hold_now=hold_now, handle=handle, on_loop=on_loop)
        self._feed.start()
        return self._feed

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
            self.outbox.send({"op": "shutdown"})
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
        kill_session(self.sid)
        if self._feed is not None:  # the event loop never watches a pipe that is closed
            self._feed.let_go()
        self.outbox.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass
        return self.proc.wait()


class RayExecutor(Executor):
    """Runs each job on a warm Ray actor of its version (see the module docstring)."""

    name = "ray"
    owns_queue = True  # Ray queues and places jobs; the core launches at once (docs/ray.md)

    def __init__(
        self,
        address: str | None = None,
        classes: GpuClassConfig | None = None,
        home: str | os.PathLike[str] | None = None,
        *,
        temp_dir: str | None = None,
        pip_mode: str | None = None,
        lost_after_s: float | None = None,
        start_timeout_s: float = 180.0,
        stop_grace_s: float = TEARDOWN_S + 5.0,  # idle actors' teardown runs during the driver's shutdown
        worker_max_rss_mb: float | None = None,
        environments: EnvironmentCache | None = None,
        worker_user: WorkerUser | None = None,
    ) -> None:
        """``environments``: the control plane's environment cache, whose ``plan`` resolves a version's packages
        over the control plane's own for Ray's ``uv`` (default: one on ``default_cache_dir``, made when first
        needed). ``worker_user``: whom that resolution runs as (it runs build backends: never root; None: the
        server's own user, for a server that is not root)."""
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
        cpu_actors = os.environ.get("LANCEFN_RAY_CPU_ACTORS") or ""
        if cpu_actors and not (cpu_actors.isdigit() and int(cpu_actors) > 0):  # the bridge reads it
            raise ValueError(
                f"LANCEFN_RAY_CPU_ACTORS is {cpu_actors!r}; use a whole number of at least 1 (CPU jobs "
                "running at once), or unset it to use the cluster's CPUs"
            )
        self._lost_after_s = float(lost_after_s or os.environ.get("LANCEFN_RAY_LOST_AFTER_S") or 30.0)
        self._start_timeout_s = start_timeout_s
        self._stop_grace_s = stop_grace_s
        self._worker_max_rss_mb = worker_max_rss_mb
        self._callbacks: ExecutorCallbacks = None  # type: ignore[assignment]  # set by start(), before any launch
        self._lock = threading.Lock()
        self._state = "stopped"  # starting | up | stopped
        self._bridge: _BridgeProcess | None = None  # the live bridge (also while it starts)
        self._buffer: list[TaskSpec] = []  # launched while the bridge starts
        self._inflight: dict[str, TaskSpec] = {}  # sent to the bridge, no outcome yet
        # Launched by the event loop (``Intake.admit_on_loop``: a plain run, cheap to finish): the loop may handle their
        # events (``BridgeFeed``). Others (batch chunks, backfills) go to the feed's thread, since a chunk's outcome
        # may read its result file or submit the next chunks.
        self._loop_jobs: set[str] = set()
        self._recent_envs: collections.deque[dict[str, str]] = collections.deque(maxlen=64)
        self._capacity: dict[str, int] | None = None
        self._largest: dict[str, int] = {}  # per class: GPUs of its biggest node (from the bridge)
        self._scaling_config = scaling_config(classes)  # classes an autoscaler scales (docs/ray.md)
        self._scaling: dict[str, dict[str, Any]] = {}  # their nodes up / starting, as the bridge last reported
        self._warm: dict[str, list[int]] = {}  # per class: when its idle actors retire (epoch ms), the bridge's
        self._caps: dict[str, int] = {}  # namespace → max GPUs (``limit_namespaces``)
        self._start_failures = 0
        if self._address is None and classes is not None:
            plan = local_cluster_plan(classes)["resources"]
            self._capacity = {spec.name: int(plan.get(class_resource(spec.name), 0)) for spec in classes.classes}
        self._closed = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._environments = environments
        self._builder = BuildUser(worker_user.uid, worker_user.gid) if worker_user is not None else None
        # A version environment's runtime_env fields (docs/ARCHITECTURE.md, "Environments"), by what decides them;
        # resolved once (``uv pip compile`` on a thread), never evicted (a few small dicts per environment).
        self._env_fields: dict[tuple, dict[str, Any]] = {}
        self._resolving: dict[tuple, list[TaskSpec]] = {}  # jobs waiting for their environment's resolution
        self._reading: set[str] = set()  # jobs whose team's slice a table agent is reading ("Backfills")

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
        if self._on_server_loop():  # a run the loop queued (Intake.admit_on_loop)
            self._loop_jobs.add(task.job_id)
        if task.table_slice is not None and task.table_slice.root is not None:
            # A team's slice on a shared server: read here by its table agent, off the core's lock, and shipped
            # as the task's rows (a Ray worker has Ray's rights, not the team's; "Backfills", "Which tables").
            with self._lock:
                self._reading.add(task.job_id)
            threading.Thread(target=self._read_slice, args=(task,), name="lancefn-ray-slice", daemon=True).start()
            return
        key = _environment_key(task)
        with self._lock:
            if self._closed.is_set():
                raise _BridgeDown("the Ray executor is shutting down")
            if key is not None and key not in self._env_fields:
                if not needs_resolution(task.environment, task.packages, self._pip_mode):
                    self._env_fields[key] = self._runtime_fields(task)  # no resolution: quick, no I/O
                else:  # first job of this environment: resolve its packages off the core's lock
                    waiting = self._resolving.setdefault(key, [])
                    waiting.append(task)
                    if len(waiting) == 1:
                        threading.Thread(
                            target=self._resolve, args=(key, task), name="lancefn-ray-env", daemon=True
                        ).start()
                    return
        self._send(task)

    def _read_slice(self, task: TaskSpec) -> None:
        """A team's slice into the job's rows file, then the job is launched with those rows; a slice that cannot
        be read fails the job in phase ``validation``, as in the Ray worker."""
        import dataclasses

        from lancefn_jupyter.server.executors.table_agent import read_rows
        from lancefn_jupyter.wire.models import JobFailure

        try:
            read_rows(self.table_agents, task)
        except Exception as error:  # the table moved or changed under the backfill: the chunk fails, saying why
            with self._lock:
                self._reading.discard(task.job_id)
            message = f"could not read the chunk's rows from the table: {error}"
            self._callbacks.task_failed(task.job_id, JobFailure(phase="validation", message=message))
            return
        with self._lock:
            wanted = task.job_id in self._reading  # not cancelled meanwhile
            self._reading.discard(task.job_id)
        if wanted:
            self.launch(dataclasses.replace(task, table_slice=None))

    def _send(self, task: TaskSpec) -> None:
        """To the bridge, or into the buffer while it starts (its environment's fields are known by now)."""
        with self._lock:
            if self._state != "up" or self._bridge is None:
                self._buffer.append(task)
                return
            self._inflight[task.job_id] = task
            bridge = self._bridge
        bridge.outbox.launch(task, self._fields_of(task))

    def _fields_of(self, task: TaskSpec) -> dict[str, Any]:
        key = _environment_key(task)
        return self._env_fields.get(key, {}) if key is not None else {}

    def _runtime_fields(self, task: TaskSpec) -> dict[str, Any]:
        """The job's environment as ``runtime_env`` fields; may run ``uv pip compile`` (raises its failure)."""
        return environment_runtime_env(
            task.environment,
            task.packages,
            self._pip_mode,
            plan=lambda request: self._cache().plan(request, builder=self._builder),
            uv_args=lambda: self._cache().uv_args(),
        )

    def _cache(self) -> EnvironmentCache:
        if self._environments is None:
            from lancefn_jupyter.environments.cache import EnvironmentCache, default_cache_dir

            shared = hasattr(os, "geteuid") and os.geteuid() == 0
            self._environments = EnvironmentCache(default_cache_dir(shared), shared=shared)
        return self._environments

    def _resolve(self, key: tuple, first: TaskSpec) -> None:
        """Resolve an environment's packages for Ray's ``uv``, then launch the jobs that waited for it; a failure
        fails them in phase ``environment`` with uv's message (the next job of the environment tries again)."""
        from lancefn_jupyter.wire.models import JobFailure

        request = first.environment
        described = request.describe() if request is not None else f"{len(first.packages)} packages"
        try:
            fields: dict[str, Any] | None = self._runtime_fields(first)
            failure = None
        except Exception as error:
            fields, failure = None, _resolution_failure(error)
        with self._lock:
            waiting = self._resolving.pop(key, [])
            if fields is not None:
                self._env_fields[key] = fields
        uv = (fields or {}).get("uv")
        for task in waiting:
            if failure is not None:
                self._callbacks.task_log(task.job_id, "system", [f"[env] {line}" for line in failure.splitlines()])
                self._callbacks.task_failed(task.job_id, JobFailure(phase="environment", message=failure))
                continue
            if uv:
                line = f"[env] Ray's uv installs {', '.join(uv['packages'])} over the control plane's packages"
            else:
                line = f"[env] {described}: the control plane's packages satisfy them; nothing to install"
            self._callbacks.task_log(task.job_id, "system", [line])
            try:
                self._send(task)
            except Exception:  # e.g. shutting down: the core fails what it holds
                log.exception("ray executor: could not launch job %s", task.job_id)

    def environment_problem(self, request: EnvironmentRequest) -> str | None:
        """Ray workers run the cluster's Python, and Ray installs no conda packages: without an ``image`` a
        ``python_version`` other than the control plane's, or conda packages it lacks, cannot be honoured."""
        if request.image:
            return None  # the image decides; the worker checks python_version and packages in it
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        if request.python_version and request.python_version != here:
            return (
                f"python_version={request.python_version} cannot be honoured on Ray without an image: Ray workers run "
                f"the cluster's Python ({here}, the control plane's); give image= with Python "
                f"{request.python_version}, or drop python_version"
            )
        if request.conda:
            from lancefn_jupyter.worker.runner import missing_packages

            missing = [text for text, _ in missing_packages(request.conda)]
            if missing:
                return (
                    f"conda packages {', '.join(missing)} are not installed here, and Ray installs no conda packages: "
                    "install them in the control plane's environment and the cluster's image, or use pip="
                )
        return None

    def cancel(self, job_id: str) -> None:
        with self._lock:
            self._reading.discard(job_id)
            self._buffer = [task for task in self._buffer if task.job_id != job_id]
            for waiting in self._resolving.values():
                waiting[:] = [task for task in waiting if task.job_id != job_id]
            task = self._forget(job_id)
            bridge = self._bridge if self._state == "up" else None
        if task is not None and bridge is not None:
            bridge.outbox.send({"op": "cancel", "job_id": job_id})

    def capacity(self) -> dict[str, int] | None:
        with self._lock:
            return dict(self._capacity) if self._capacity is not None else None

    def scaling(self) -> dict[str, dict[str, int]] | None:
        if not self._scaling_config:
            return None
        with self._lock:
            reported = dict(self._scaling)
        classes = {}
        for name, entry in self._scaling_config.items():
            nodes = reported.get(name, {})
            classes[name] = {
                "nodes_up": int(nodes.get("nodes_up", 0)),
                "nodes_starting": int(nodes.get("nodes_starting", 0)),
                "nodes_max": int(entry["max_nodes"]),
            }
            if nodes.get("nodes_starting") and isinstance(nodes.get("next_up_ms"), int):
                classes[name]["next_up_ms"] = nodes["next_up_ms"]
        return classes

    def idle_retire_ms(self, class_of: Mapping[str, str]) -> list[tuple[str, int]]:
        with self._lock:
            return [(name, at) for name, times in self._warm.items() for at in times]

    def limit_namespaces(self, caps: Mapping[str, int]) -> None:
        self._caps = {str(namespace): int(cap) for namespace, cap in caps.items()}

    def pending_reason(self, gpu_class: str | None, num_gpus: int) -> str | None:
        with self._lock:
            largest = self._largest.get(gpu_class) if gpu_class and num_gpus else None
            scaled = self._scaling.get(gpu_class or "") if num_gpus else None
        if gpu_class in self._scaling_config and num_gpus:
            # A job never exceeds a node of a scaling class (the config says so at start): it waits for a node
            # the autoscaler starts, or its turn.
            scaled = scaled or {}
            return scaling_reason(int(scaled.get("nodes_starting", 0)), scaled.get("start_s"))
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
        self._loop_jobs.discard(job_id)
        if task is not None and task.env:
            self._recent_envs.append(task.env)
        return task

    def _scrub(self, text: str) -> str:
        """``text`` without the env values of any job Ray holds, is about to get or just ended."""
        with self._lock:
            resolving = [task for waiting in self._resolving.values() for task in waiting]
            envs = [task.env for task in (*self._buffer, *self._inflight.values(), *resolving) if task.env]
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
            "worker_max_rss_mb": self._worker_max_rss_mb,
            "scaling": self._scaling_config,
            "caps": self._caps,
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
        # Spawned outside the lock, which launches take on the event loop (``Executor.launch``).
        try:
            bridge = _BridgeProcess(config, env, self._scrub)
        except OSError as error:
            self._start_failed(f"could not start the Ray driver process: {error}")
            return False
        with self._lock:
            self._bridge = bridge
            closed = self._closed.is_set()  # set meanwhile: shutdown found no bridge to stop
        if closed:
            bridge.kill()
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
            bridge.outbox.launch(task, self._fields_of(task))
        lost: list[str] = []

        def handle(event: dict) -> None:
            if event.get("event") == "lost":
                lost.append(str(event.get("message") or ""))
            else:
                self._on_event(event)

        loop = self._callbacks.event_loop()
        if loop is not None:  # read on the loop: a quick job's outcome takes no thread (docs/ARCHITECTURE.md)
            feed = bridge.follow(loop, self._callbacks.hold_now, handle, self._on_loop_ok)
            while not feed.ended.wait(1.0) and not loop.is_closed():
                pass
        else:
            for event in events:
                try:
                    handle(event)
                except Exception:
                    log.exception("ray executor: could not handle %s event", event.get("event"))
        rc = bridge.kill()
        if self._closed.is_set():
            return True
        reason = (lost[-1] if lost else "") or bridge.problem() or _describe_exit(rc)
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
            self._warm = {}  # its actors went with it
            failed = list(self._buffer) + list(self._inflight.values())
            self._buffer, self._inflight = [], {}
            self._loop_jobs.difference_update(task.job_id for task in failed)
            self._recent_envs.extend(task.env for task in failed if task.env)
        log.warning("ray executor: %s", reason)
        from lancefn_jupyter.wire.models import JobFailure

        suffix = (
            "the job did not finish; run it again (the control plane reconnects in the background)"
            if lost
            else "run the job again once Ray is reachable (the control plane keeps retrying)"
        )
        for task in failed:
            self._callbacks.task_failed(
                task.job_id, JobFailure(phase="executor", message=f"{reason}; {suffix}", retryable=True)
            )

    def _on_server_loop(self) -> bool:
        """Whether this thread runs the server's event loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # a core or batch thread
            return False
        return self._callbacks is not None and running is self._callbacks.event_loop()

    def _on_loop_ok(self, event: dict) -> bool:
        """Whether the event loop may handle ``event`` (see ``_loop_jobs``); events of no job are quick."""
        job_id = event.get("job_id")
        return job_id is None or job_id in self._loop_jobs

    def _on_event(self, event: dict) -> None:
        kind, callbacks = event.get("event"), self._callbacks
        job_id = event.get("job_id", "")
        if kind == "events":  # a job's last events and its outcome, sent together
            for each in event.get("events", ()):
                self._on_event({**each, "job_id": job_id} if isinstance(each, dict) else {"job_id": job_id})
            return
        if kind == "capacity":
            with self._lock:
                self._capacity = {str(k): int(v) for k, v in event.get("capacity", {}).items()}
                self._largest = {str(k): int(v) for k, v in event.get("largest", {}).items()}
            callbacks.usage_changed()
            return
        if kind == "scaling":
            with self._lock:
                self._scaling = {str(k): dict(v) for k, v in event.get("classes", {}).items() if isinstance(v, dict)}
            callbacks.usage_changed()
            return
        if kind == "warm":
            classes = event.get("classes")
            warm = {
                str(name): [at for at in times if type(at) is int]
                for name, times in (classes.items() if isinstance(classes, dict) else ())
                if isinstance(times, list)
            }
            with self._lock:
                self._warm = warm
            callbacks.usage_changed()
            return
        problem = event_problem(event, str(job_id), kinds=_JOB_EVENTS, phases=ALL_PHASES)
        with self._lock:
            known = job_id in self._inflight
            if known and (kind in ("result", "failed") or problem is not None):
                self._forget(job_id)
                bridge = self._bridge
        if not known:
            return  # cancelled meanwhile: the core has already finished it
        if problem is None:
            reused = event.get("setup_reused_from")  # the bridge's: the earlier version whose actor ran it
            if isinstance(reused, str) and isinstance(event.get("timings"), dict):  # timings hold numbers until here
                event = {**event, "timings": {**event["timings"], "setup_reused_from": reused}}
            relay(callbacks, job_id, event)
            return
        # The bridge checks what jobs send: this is a last line of defence. The job fails; its actor is stopped.
        message = invalid_event(event, problem)
        log.warning("ray executor: job %s: %s", job_id, message)
        callbacks.task_failed(job_id, failure_of({"phase": "worker", "message": message}))
        if bridge is not None:
            bridge.outbox.send({"op": "cancel", "job_id": job_id})


def _describe_exit(returncode: int | None) -> str:
    from lancefn_jupyter.worker.process import describe_exit

    return describe_exit(returncode).replace("worker process", "the Ray driver process")  # type: ignore[arg-type]


def _line(message: dict) -> bytes:
    return (dumps(message) + "\n").encode()


def _b64(artifact: bytes) -> str:
    return base64.b64encode(artifact).decode("ascii")


def _launch_line(job: dict, artifact: bytes, forget: bytes) -> bytes:
    """A launch with its version's artifact, and the ``forget`` lines that follow it."""
    return _line({"op": "launch", "job": {**job, "artifact_b64": _b64(artifact)}}) + forget


def _environment_key(task: TaskSpec) -> tuple | None:
    """What decides a job's ``runtime_env`` environment fields; None: nothing (no packages, no image)."""
    request = task.environment
    if request is None:
        return ("packages", task.packages) if task.packages else None
    if not (request.packages or request.image):
        return None
    return (request.kind, request.packages, request.image)


def _resolution_failure(error: BaseException) -> str:
    """The phase-``environment`` message of a failed resolution (uv's own lines are in the error's text)."""
    text = str(error).strip() or type(error).__name__
    return f"could not resolve the environment's packages for Ray's uv: {text}"[:4000]


def _job_payload(task: TaskSpec) -> dict:
    return {
        "job_id": task.job_id,
        "name": task.name,
        "version": task.version,
        "entrypoint": task.entrypoint,
        "rows": task.rows,
        "gpu_class": task.gpu_class,
        "num_gpus": task.num_gpus,
        # Its version's host CPU and memory: the actor's num_cpus / memory ("Compute resources"); None: not asked.
        "cpu": task.resources.cpu,
        "memory": task.resources.memory,
        "simulated": task.simulated,
        "env": dict(task.env),
        "packages": list(task.packages),
        "timeout_s": task.timeout_s,
        "timeout_limit": task.timeout_limit,
        "namespace": task.namespace,
        "data": task.data.fields(),
        # A backfill chunk: the Ray task reads its rows from the table itself (docs/ARCHITECTURE.md, "Backfills").
        **({"table_slice": task.table_slice.to_wire()} if task.table_slice is not None else {}),
        "state": task.state,
        "python_version": task.environment.python_version if task.environment is not None else None,
        "setup_digest": task.setup_digest,  # an idle actor of another version with it may run the job ("Setup reuse")
    }
