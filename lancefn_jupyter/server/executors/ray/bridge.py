"""The bridge: the Ray driver process (`ray.init`), talking JSON lines with `RayExecutor` (`bridge_main`).

Over 600 lines because it is one process's one loop: the messages it takes, the actor queues it keeps
(the bookkeeping itself is in `pool.py`), placement and capacity polling, and the outcomes it reports all
act on the same driver state under one lock; split apart they would share that state through every call.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lancefn_jupyter.server.executors.ray.cluster import NAMESPACE, class_resource, kill_session
from lancefn_jupyter.server.executors.ray.pool import ActorPool
from lancefn_jupyter.server.executors.ray.scaling import DemandPublisher, ScalingReport, bundles_of, scaling_of
from lancefn_jupyter.server.executors.ray.task import EventHub, JobActor
from lancefn_jupyter.server.executors.ray_plugin import PLUGIN
from lancefn_jupyter.server.executors.relay import event_problem
from lancefn_jupyter.server.policy.demand import Ask, Demand, Job, allowances, shape_demand
from lancefn_jupyter.server.policy.limits import timed_out_message
from lancefn_jupyter.wire.jsontext import loads
from lancefn_jupyter.worker.process import invalid_event, long_line
from lancefn_jupyter.worker.protocol import LINE_MAX_BYTES, TEARDOWN_S, LineTooLong, Protocol, cap_text
from lancefn_jupyter.worker.result import result_too_large

log = logging.getLogger("lancefn.server")

_OUTCOME_GRACE_S = 5.0  # how long an outcome waits for the task's last events to arrive
_CAPACITY_POLL_S = 2.0
# A new GPU actor not running its job after this long may lack GPUs that idle actors hold on its
# node (the driver counts GPUs cluster-wide, and a dead node counts until Ray notices): one more
# idle actor of its class retires, least recently used first, each time this passes.
_UNPLACED_S = 10.0
_ACTOR_IDLE_S = 300.0  # a warm GPU actor idle this long is killed (LANCEFN_RAY_ACTOR_IDLE_S)
_GETTERS = 4  # threads waiting for jobs' calls with ray.get (``_Getters``)
# What a job's call may push to the hub (its outcome is what the call returns), and what that outcome may be.
_PUSHED = ("started", "log", "progress")
_OUTCOMES = ("result", "failed")


def actor_options(job: dict) -> dict[str, Any]:
    """The Ray actor options of a job's actor: its GPUs and class, and its version's ``cpu`` / ``memory``
    (docs/ARCHITECTURE.md, "Compute resources"; docs/ray.md) as ``num_cpus`` / ``memory``."""
    gpus = int(job.get("num_gpus") or 0)
    options: dict[str, Any] = {"max_restarts": 0, "max_concurrency": 1}  # a crash fails the job, never re-run
    if gpus:
        options.update(num_cpus=0, num_gpus=gpus)  # bounded by GPUs, not by the node's cores
        if job.get("gpu_class"):
            options["resources"] = {class_resource(job["gpu_class"]): gpus}
    # A CPU actor keeps Ray's actor default: it needs a CPU to be placed and holds none once
    # alive (an idle one must not block other work); the bridge bounds how many run.
    if job.get("cpu") is not None:  # asked for: Ray places it where that many are free and holds them
        options["num_cpus"] = job["cpu"]
    if job.get("memory") is not None:
        options["memory"] = int(job["memory"])
    return options


class _Getters:
    """Threads that wait for a job's call with ``ray.get`` and then report it (``done(job_id, future)``): a call's
    end wakes a waiting ``ray.get`` sooner than it runs a future's callback on Ray's own thread (about 0.05 ms of a
    quick job's 1 ms call here). At most ``_GETTERS`` threads; a call that finds none idle (they wait for long jobs)
    gets the callback."""

    def __init__(self, ray: Any, done: Callable[[str, Future], None]) -> None:
        self._ray, self._done = ray, done
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue] = []  # each idle getter's inbox
        self._count = 0

    def watch(self, job_id: str, ref: Any) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None and self._count < _GETTERS:
                self._count += 1
                inbox = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(inbox,), name="lancefn-ray-get", daemon=True).start()
        if inbox is None:
            ref.future().add_done_callback(lambda future: self._done(job_id, future))
        else:
            inbox.put((job_id, ref))

    def _run(self, inbox: queue.SimpleQueue) -> None:
        while True:
            job_id, ref = inbox.get()
            future: Future = Future()
            try:
                future.set_result(self._ray.get(ref))
            except BaseException as error:  # the call failed: reported as the callback would
                future.set_exception(error)
            try:
                self._done(job_id, future)
            except Exception:  # a bug of ours: this getter goes on
                log.exception("ray bridge: could not report job %s", job_id)
            with self._lock:
                self._idle.append(inbox)


@dataclass(eq=False)
class _BridgeJob:
    job_id: str
    ref: Any
    timeout_s: float | None
    rows_total: int
    timeout_limit: bool = False  # timeout_s is the server's --max-job-run-s ("Scheduling")
    seen: int = 0  # events relayed
    rows_done: int = 0
    deadline: float | None = None
    outcome: dict | None = None  # parked until `seen` reaches its last_seq
    outcome_due: float = 0.0
    finished: bool = False
    actor: Any = None  # the warm actor running it
    pool_key: tuple | None = None  # (class, GPUs, name, version, namespace): which actors may run it
    pool: ActorPool | None = None  # the bridge's queue for it: the CPU pool or its GPU class's
    payload: dict | None = None  # kept until the job starts on an actor
    options: dict | None = None  # for a new actor of its pool key
    version: dict | None = None  # a new actor's argument: what its pool key's jobs share
    started: bool = False
    unplaced_since: float | None = None  # a new GPU actor of it, not yet running it, since
    result_file: str | None = None  # where an Arrow result goes (the bridge shares the server's disk)
    result_fsync: bool = True
    created_at: float | None = None  # wall clock when a new actor was asked for this job (None: a warm one)
    token: str = ""  # what its call's hub pushes name: another job's call cannot push for it (``EventHub``)
    result_max_bytes: int | None = None  # a larger Arrow result is refused (--max-arrow-result-bytes)
    reused_from: str | None = None  # the version whose idle actor runs it ("Setup reuse")


class _Driver:
    """The bridge: submits tasks, relays their events, enforces timeouts, watches the cluster."""

    def __init__(self, config: dict, proto: Protocol) -> None:
        import ray

        self.ray = ray
        self.config = config
        self.proto = proto
        self.local = config.get("local") is not None
        self.classes: list[str] = list(config.get("classes") or ())
        self.lost_after_s = float(config.get("lost_after_s", 30.0))
        self.max_rss_mb = config.get("worker_max_rss_mb")
        self.jobs: dict[str, _BridgeJob] = {}
        # (name, version, namespace) → artifact: sent with a version's first job, dropped when the
        # executor says (``forget``), which keeps the same list (``_BridgeProcess.launch``)
        self.artifacts: dict[tuple[str, str, str], str] = {}
        self.lock = threading.Lock()
        self.inbox: queue.Queue = queue.Queue()
        self.stopping = threading.Event()
        self.last_ok = time.monotonic()
        self.capacity: dict[str, int] = {}
        self.largest: dict[str, int] = {}
        self.nodes: dict[str, int] = {}  # per class: live nodes that have it
        self.warm_sent: dict[str, list[float]] = {}  # per class: its idle actors' retire times, as last reported
        # Classes an autoscaler scales: their queue is asked of it (``_scale``; docs/ray.md, "Scaling with the queue")
        self.scaling = scaling_of(config)
        self.caps: dict[str, int] = {str(k): int(v) for k, v in (config.get("caps") or {}).items()}
        self.demand_wake = threading.Event()
        self.publisher: DemandPublisher | None = None  # made with the hub's name, below
        # Named, so each job actor looks it up once, when it is made, instead of receiving a
        # handle with every call (a handle argument costs each call a borrower round trip).
        self.hub_name = f"lancefn-hub-{uuid.uuid4().hex[:16]}"
        if self.scaling:  # its KV entry is named like the hub: one per driver
            self.publisher = DemandPublisher(self.hub_name)
        # Pinned to this driver's node: the hub then shares the driver's fate and no other node's
        # loss can stop every job's events (Ray would not restart it, and its events would be lost).
        self.hub = (
            ray.remote(num_cpus=0)(EventHub)
            .options(name=self.hub_name, namespace=NAMESPACE, scheduling_strategy=self._driver_node())
            .remote()
        )
        ray.get(self.hub.drain.remote(0.0), timeout=120)  # type: ignore[attr-defined]
        # Every job runs in a warm actor of its (class, GPUs, name, version, namespace), queued by
        # the bridge (ActorPool): one pool for CPU jobs, one per GPU class weighted by GPUs.  A Ray
        # worker process never runs two versions or namespaces.
        self.job_actor = ray.remote(JobActor)
        self.actor_idle_s = float(os.environ.get("LANCEFN_RAY_ACTOR_IDLE_S") or _ACTOR_IDLE_S)
        self.daemons = self._local_daemons() if self.local else []
        self.capacity, self.largest, self.nodes, cpus = self._read_capacity()
        self.cpu_slots_fixed = int(os.environ.get("LANCEFN_RAY_CPU_ACTORS") or 0)
        self.cpu_pool = ActorPool(self._cpu_slots(cpus), self.actor_idle_s)
        self.gpu_pools: dict[str, ActorPool] = {}  # per class: slots are its GPUs in the cluster
        self.getters = _Getters(ray, self._done)

    def _cpu_slots(self, cpus: int) -> int:
        """CPU jobs at once: ``LANCEFN_RAY_CPU_ACTORS``, else the cluster's CPUs; at least one, so
        a cluster scaled to zero CPUs still sees a CPU job's demand (an autoscaler adds a node)."""
        return self.cpu_slots_fixed or max(cpus, 1)

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
        threads = [(self._pump, "pump"), (self._report, "report"), (self._watch, "watch")]
        if self.scaling:
            threads.append((self._scale, "scale"))
        for target, name in threads:
            threading.Thread(target=target, name=f"lancefn-ray-{name}", daemon=True).start()
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            command = loads(line)
            op = command.get("op")
            if op == "shutdown":
                break
            try:
                if op == "launch":
                    self.launch(command["job"])
                elif op == "cancel":
                    self.cancel(command["job_id"])
                elif op == "forget":
                    self.artifacts.pop(tuple(command["key"]), None)
            except Exception as error:  # one bad job must not take the driver down
                log.exception("ray bridge: %s failed", op)
                if op == "launch":
                    with self.lock:
                        self.jobs.pop(command["job"]["job_id"], None)
                    self.proto.send(
                        event="failed",
                        job_id=command["job"]["job_id"],
                        phase="executor",
                        message=cap_text(f"could not submit the job to Ray: {type(error).__name__}: {error}"),
                        retryable=True,
                    )

    def launch(self, job: dict) -> None:
        from lancefn_jupyter.worker.protocol import artifact_filename

        job_id = job["job_id"]
        key = (job["name"], job["version"], job.get("namespace") or "")
        if "artifact_b64" in job:  # the first job of its version since the executor's mirror dropped it
            self.artifacts[key] = job["artifact_b64"]
        gpus = int(job.get("num_gpus") or 0)
        options = actor_options(job)
        runtime_env = self._runtime_env(job)
        if runtime_env:
            options["runtime_env"] = runtime_env
        data = job.get("data") or {}
        # What every job of the version shares goes to its actors once, when one is made
        # (``_JobActor``); each call carries only the job's own fields.
        version = {
            "hub": self.hub_name,
            "task": {
                "artifact_b64": self.artifacts[key],
                "entrypoint": job["entrypoint"],
                "filename": artifact_filename(job["name"], job["version"]),
                "packages": job.get("packages") or [],
                "state": job.get("state") or "per_worker",
                **({"python_version": job["python_version"]} if job.get("python_version") else {}),
                **({"setup_digest": job["setup_digest"]} if job.get("setup_digest") else {}),
            },
        }
        token = secrets.token_hex(16)
        payload = {
            "task_id": job_id,
            "hub_token": token,
            "rows": job["rows"],
            # with the task, never in runtime_env: env values stay out of /proc/<pid>/environ
            "env": {str(k): str(v) for k, v in (job.get("env") or {}).items()},
            **PLUGIN.ship(data, job.get("table_slice")),  # per job: a version's jobs may send JSON or Arrow rows
        }
        record = _BridgeJob(
            job_id,
            None,
            job.get("timeout_s"),
            int(data.get("rows_total", len(job["rows"]))),
            timeout_limit=bool(job.get("timeout_limit")),
        )
        record.result_file = data.get("result_file")
        record.result_fsync = bool(data.get("result_fsync", True))
        record.token, record.result_max_bytes = token, data.get("result_max_bytes")
        record.pool_key = (
            job.get("gpu_class") if gpus else None,
            gpus,
            job["name"],
            job["version"],
            job.get("namespace") or "",
        )
        record.payload, record.options, record.version = payload, options, version
        digest = job.get("setup_digest")
        setup = (*record.pool_key[:3], record.pool_key[4], digest) if digest else None  # all but the version
        with self.lock:  # registered first: the task's events may arrive before .remote() returns
            self.jobs[job_id] = record
            if gpus:
                gpu_class = job.get("gpu_class") or ""
                if gpu_class not in self.gpu_pools:
                    self.gpu_pools[gpu_class] = ActorPool(self.capacity.get(gpu_class, 0), self.actor_idle_s)
                record.pool = self.gpu_pools[gpu_class]
            else:
                record.pool = self.cpu_pool
            record.pool.submit(job_id, record.pool_key, max(gpus, 1), setup)
        self._dispatch()

    def _pools(self) -> list[ActorPool]:
        """Every pool (lock held)."""
        return [self.cpu_pool, *self.gpu_pools.values()]

    def _dispatch(self) -> None:
        """Start the queued jobs that have room now."""
        starts, retire = [], []
        with self.lock:
            if self.stopping.is_set():
                return
            for pool in self._pools():
                pool_starts, pool_retire = pool.dispatch()
                starts += pool_starts
                retire += pool_retire
            records = [(self.jobs.get(job_id), actor) for job_id, actor in starts]
            for job_id, _ in starts:
                record = self.jobs.get(job_id)
                reused = record.pool.reused_from(job_id) if record is not None and record.pool is not None else None
                if record is not None and reused is not None:
                    record.reused_from = reused[3]  # type: ignore[index]  # pool keys are (class, GPUs, name, version, namespace)
        self._retire(retire)
        for record, actor in records:
            if record is not None:
                self._start(record, actor)
        if self.scaling:  # a job came, started, ended or left: the demand follows at once
            self.demand_wake.set()

    def _start(self, record: _BridgeJob, actor: Any) -> None:
        """Run the job on ``actor``, or on a warm or new actor of its pool key."""
        job_id = record.job_id
        try:
            if actor is None:
                record.created_at = time.time()
                actor = self.job_actor.options(**record.options).remote(record.version)  # type: ignore[arg-type]
                with self.lock:
                    bound = record.pool.bind(job_id, actor)  # type: ignore[union-attr]
                if not bound:  # cancelled while the actor was being created
                    self._kill_actor(actor)
                    return
                if record.pool is not self.cpu_pool:
                    record.unplaced_since = time.monotonic()
            elif record.timeout_s is not None:  # a warm actor runs it now: its timeout runs whatever it sends
                record.deadline = time.monotonic() + float(record.timeout_s)
            record.actor = actor
            payload = record.payload
            if record.reused_from is not None:  # another version's actor: it takes this version's shared part too
                payload = {**(payload or {}), "version_task": record.version["task"]}  # type: ignore[index]
            ref = actor.run.remote(payload)
        except Exception as error:  # e.g. an invalid runtime_env
            if actor is not None:
                self._kill_actor(actor)
            with self.lock:
                self.jobs.pop(job_id, None)
                record.pool.release(job_id, 0.0, reuse=False)  # type: ignore[union-attr]
            self._dispatch()
            self.proto.send(
                event="failed", job_id=job_id, phase="environment", message=cap_text(f"Ray refused the task: {error}")
            )
            return
        with self.lock:
            record.ref, record.payload, record.version = ref, None, None
            cancelled = record.finished  # cancelled while being submitted
        if cancelled:
            self._stop(record)
            return
        self.getters.watch(job_id, ref)

    def _kill_actor(self, actor: Any) -> None:
        try:
            self.ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or the cluster is going away
            pass

    def _teardown_and_kill(self, actors: list[Any]) -> None:
        """Retire idle actors: each tears its version down (the runner bounds it by ``TEARDOWN_S``),
        then is killed, however that went."""
        refs = []
        for actor in actors:
            try:
                refs.append(actor.teardown.remote())
            except Exception:  # already dead
                pass
        if refs:
            try:
                self.ray.wait(refs, num_returns=len(refs), timeout=TEARDOWN_S + 2.0)
            except Exception:
                pass
        for actor in actors:
            self._kill_actor(actor)

    def _retire(self, actors: list[Any]) -> None:
        """:meth:`_teardown_and_kill` in the background: no caller waits for a teardown."""
        if actors:
            threading.Thread(
                target=self._teardown_and_kill, args=(actors,), name="lancefn-ray-retire", daemon=True
            ).start()

    def _reusable(self, final: dict) -> bool:
        """Whether the actor that sent ``final`` may run its key's next job ("Warm state")."""
        if final.get("event") == "failed" and final.get("phase") == "setup":
            return False
        rss = final.get("rss_mb")
        if self.max_rss_mb is not None and isinstance(rss, (int, float)) and rss > float(self.max_rss_mb):
            log.info("ray bridge: retiring an actor at %.0f MB (worker limit %s MB)", rss, self.max_rss_mb)
            return False
        return True

    def _runtime_env(self, job: dict) -> dict:
        # The function's env travels with the task (see _run_job), never here: runtime_env
        # env_vars land in the worker's /proc/<pid>/environ.  The simulator switch must be set
        # before numba.cuda is imported, so it alone stays at exec (it is no secret).
        runtime_env: dict[str, Any] = {}
        if job.get("simulated"):
            runtime_env["env_vars"] = {"NUMBA_ENABLE_CUDASIM": "1"}
        # The version's environment: Ray's uv with the packages the control plane resolved, or an image
        # (``environment_runtime_env``, decided in the control plane once per environment).
        runtime_env.update(job.get("runtime_env") or {})
        return runtime_env

    def cancel(self, job_id: str) -> None:
        with self.lock:
            record = self.jobs.pop(job_id, None)
            if record is not None:
                record.finished = True
        if record is not None:
            self._stop(record)

    def _stop(self, record: _BridgeJob) -> None:
        """Stop a job: its actor is killed (Ray cannot force-cancel an actor's task), which frees
        its GPUs or its CPU slot for the next queued job; a queued job just leaves the queue."""
        with self.lock:
            actor = record.pool.remove(record.job_id)  # type: ignore[union-attr]
        if actor is not None:
            self._kill_actor(actor)
        self._dispatch()

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            records = list(self.jobs.values())
            self.jobs.clear()
        for record in records:
            self._stop(record)
        with self.lock:
            idle = [actor for pool in self._pools() for actor in pool.clear()]
        self._teardown_and_kill(idle)  # busy ones were killed above with their jobs
        if self.publisher is not None:  # this control plane's demand goes with it (others' stays)
            try:
                self.publisher.withdraw()
            except Exception:
                pass
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
                        for entry in first:
                            self._relay(entry)
                    elif kind == "outcome":
                        self._outcome(first, second)
                    else:
                        self._dispatch()
                self._tick()
            except Exception:
                log.exception("ray bridge: reporter error")

    def _next_wakeup(self) -> float:
        now, wake = time.monotonic(), 0.5
        with self.lock:
            for record in self.jobs.values():
                for due in (record.deadline, record.outcome_due if record.outcome else None):
                    if due is not None:
                        wake = min(wake, max(0.0, due - now))
        return wake

    def _relay(self, entry: Any) -> None:
        """One ``[job_id, token, seq, event]`` a call pushed to the hub: relayed when it names its running job's token
        (anything else, which another job's call may push, is dropped), and fails the job when its event is not
        one a call may push (docs/ARCHITECTURE.md, "Worker protocol")."""
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)):
            return
        job_id, token, seq, event = entry
        with self.lock:
            record = self.jobs.get(job_id)
            if record is None or record.finished or token != record.token or type(seq) is not int:
                return
            problem = event_problem(event, job_id, kinds=_PUSHED)
            if problem is None:
                record.seen = max(record.seen, seq)
                kind = event["event"]
                if kind == "started":
                    record.started, record.unplaced_since = True, None
                    if record.timeout_s is not None and record.deadline is None:
                        record.deadline = time.monotonic() + float(record.timeout_s)
                if kind == "progress":
                    record.rows_done = event["rows_done"]
                parked = record.outcome if record.outcome and record.seen >= record.outcome.get("last_seq", 0) else None
                if parked is not None:
                    record.outcome = None
        if problem is not None:
            self._refuse(job_id, invalid_event(event, problem))
            return
        try:
            self.proto.send(**{**event, "job_id": job_id})
        except LineTooLong:
            self._refuse(job_id, long_line("the Ray task"))
            return
        if parked is not None:
            self._finish(job_id, parked)

    def _refuse(self, job_id: str, message: str) -> None:
        """The job's call broke the protocol: it fails in phase ``worker`` and its actor is killed, never reused."""
        with self.lock:
            record = self.jobs.pop(job_id, None)
            if record is None or record.finished:
                return
            record.finished = True
        self._stop(record)
        self.proto.send(event="failed", job_id=job_id, phase="worker", message=message)

    def _done(self, job_id: str, future: Any) -> None:
        """A job's call ended (on a getter's thread or Ray's callback thread, which must not wait on Ray or the disk).

        The usual case, a job that returned with all its events inline (it pushed none to the
        hub, so no relay of its events can be under way on the reporter thread) and no Arrow
        result to store, is reported from here: its actor turns idle and its outcome goes out, one
        thread hop sooner.  Anything else goes to the reporter thread (:meth:`_outcome`), as does
        starting the jobs queued behind it (a Ray call)."""
        try:
            value = future.result()
        except BaseException:  # the call failed: its actor is killed (a Ray call)
            self.inbox.put(("outcome", job_id, future))
            return
        if _value_problem(value, job_id) is not None:  # the reporter thread refuses it (a Ray call)
            self.inbox.put(("outcome", job_id, future))
            return
        final = dict(value.get("final") or {})
        with self.lock:
            record = self.jobs.get(job_id)
            quick = (
                record is not None
                and not record.finished
                and not value.get("last_seq")
                and "result_ipc" not in final
                and self._reusable(final)  # else its actor retires: Ray calls
            )
            if quick and record is not None:
                self.jobs.pop(job_id)
                record.finished = True
                record.pool.release(job_id, time.monotonic(), reuse=True)  # type: ignore[union-attr]
                record.actor = None
                waiting = any(pool.waiting() for pool in self._pools())
                _add_start(final, record, value)
        if not quick:
            self.inbox.put(("outcome", job_id, future))
            return
        self._report_outcome(job_id, value.get("tail") or (), final)
        if waiting:
            self.inbox.put(("dispatch", None, None))

    def _outcome(self, job_id: str, future: Any) -> None:
        returned = True
        try:
            value = future.result()
        except BaseException as error:  # the task did not return: cancelled, crashed, lost, …
            value = {"last_seq": 0, "final": _failure_from_ray_error(error, self.ray)}
            returned = False
        problem = _value_problem(value, job_id) if returned else None
        if problem is not None:  # its actor is killed, never reused: the job's code may have changed anything in it
            final = value.get("final") if isinstance(value, dict) else None
            failure = {"event": "failed", "phase": "worker", "message": invalid_event(final or value, problem)}
            value, returned = {"last_seq": 0, "final": failure}, False
        with self.lock:
            record = self.jobs.get(job_id)
            if record is None or record.finished:
                return
            final = value.get("final") or {}
            reuse = returned and self._reusable(final)
            # It ran the job and lives: warm for its key's next job (crashed or lost: never reused;
            # failed its setup or over the memory limit: retired).
            freed = record.pool.release(job_id, time.monotonic(), reuse=reuse)  # type: ignore[union-attr]
            record.actor = None
            if returned:
                _add_start(final, record, value)
            parked = record.seen < int(value.get("last_seq", 0))
            if parked:
                record.outcome, record.outcome_due = value, time.monotonic() + _OUTCOME_GRACE_S
        if freed is not None:
            if returned:
                self._retire([freed])
            else:
                self._kill_actor(freed)
        self._dispatch()  # its room is free (its actor idle, or killed if it crashed)
        if not parked:
            self._finish(job_id, value)

    def _finish(self, job_id: str, value: dict) -> None:
        with self.lock:
            record = self.jobs.pop(job_id, None)
            if record is None or record.finished:
                return
            record.finished = True
        final = dict(value.get("final") or {})
        if "result_ipc" in final:  # Arrow IPC bytes Ray carried natively: stored as the job's result file
            final = _store_result(final, record.result_file, record.result_fsync, record.result_max_bytes)
        self._report_outcome(job_id, value.get("tail") or (), final)

    def _report_outcome(self, job_id: str, tail: Any, final: dict) -> None:
        """The events the task had not pushed to the hub, then its outcome, in one line: the
        control plane wakes once for them; one line each when together they pass the line limit."""
        final.setdefault("event", "failed")
        if final["event"] == "failed":
            final.setdefault("phase", "executor")
            final.setdefault("message", "the Ray task ended without a result")
        events = [event for _, event in tail] + [final]
        try:
            self.proto.send(job_id=job_id, event="events", events=events)
            return
        except LineTooLong:
            pass
        for event in events:
            try:
                self.proto.send(**{**event, "job_id": job_id})
            except LineTooLong:
                self.proto.send(job_id=job_id, event="failed", phase="worker", message=long_line("the Ray task"))
                return

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
                message=timed_out_message(
                    float(record.timeout_s),  # type: ignore[arg-type]  # a deadline means a timeout
                    record.timeout_limit,
                    record.rows_done,
                    record.rows_total,
                ),
            )
        for job_id, value in overdue:
            self._finish(job_id, value)
        with self.lock:
            retire = [actor for pool in self._pools() for actor in pool.expire(now)]
            for record in self.jobs.values():
                if record.unplaced_since is not None and now - record.unplaced_since >= _UNPLACED_S:
                    record.unplaced_since = now
                    retire.append(record.pool.retire_least_recent())  # type: ignore[union-attr]
        self._retire([actor for actor in retire if actor is not None])
        self._report_warm()
        if now - self.last_ok > self.lost_after_s:
            self._lost(f"the Ray cluster has not answered for {self.lost_after_s:g} s")

    def _report_warm(self) -> None:
        """Each GPU class's idle actors, when they retire unused (epoch ms), sent when that changes: the usage's
        ``warm_retire_ms`` (the side panel's warm line). Looked at every tick, so at most half a second late."""
        with self.lock:
            warm = {name: times for name, pool in self.gpu_pools.items() if (times := pool.retire_times())}
        if warm == self.warm_sent:
            return
        self.warm_sent = warm
        offset = time.time() - time.monotonic()
        classes = {name: [int((at + offset) * 1000) for at in times] for name, times in warm.items()}
        self.proto.send(event="warm", classes=classes)

    def _watch(self) -> None:
        """Capacity per class (from the cluster's resources), and whether the cluster is alive."""
        while not self.stopping.wait(_CAPACITY_POLL_S):
            dead = [name for name, proc in self.daemons if not _alive(proc)]
            if dead:
                self._lost(f"the local Ray's {' and '.join(dead)} stopped")
            try:
                capacity, largest, nodes, cpus = self._read_capacity()
            except Exception:
                continue  # the reporter declares the cluster lost once this stays stale
            self.last_ok = time.monotonic()
            if nodes != self.nodes:
                self.nodes = nodes
                self.demand_wake.set()
            if self._cpu_slots(cpus) != self.cpu_pool.slots:
                with self.lock:
                    self.cpu_pool.slots = self._cpu_slots(cpus)
                self._dispatch()
            if (capacity, largest) != (self.capacity, self.largest):
                self.capacity, self.largest = capacity, largest
                with self.lock:
                    for gpu_class, pool in self.gpu_pools.items():
                        pool.slots = capacity.get(gpu_class, 0)
                self._dispatch()
                self.proto.send(event="capacity", capacity=capacity, largest=largest)

    def _read_capacity(self) -> tuple[dict[str, int], dict[str, int], dict[str, int], int]:
        """GPUs per class in the cluster, and on its biggest live node (a task never spans nodes:
        a job asking more than that waits until an autoscaler or operator adds a bigger node);
        the live nodes of each class; and the cluster's CPUs (how many CPU jobs run at once)."""
        resources = self.ray.cluster_resources()
        capacity = {name: int(resources.get(class_resource(name), 0)) for name in self.classes}
        largest = dict.fromkeys(self.classes, 0)
        nodes = dict.fromkeys(self.classes, 0)
        for node in self.ray.nodes():
            if node.get("Alive"):
                have = node.get("Resources") or {}
                for name in self.classes:
                    fit = int(min(have.get(class_resource(name), 0), have.get("GPU", 0)))
                    largest[name] = max(largest[name], fit)
                    nodes[name] += 1 if have.get(class_resource(name), 0) > 0 else 0
        return capacity, largest, nodes, int(resources.get("CPU", 0))

    # ------------------------------------------------------------------ scaling with the queue

    def _demands(self) -> dict[str, Demand]:
        """Each scaling class's demand: its running and queued jobs shaped into node bundles, each namespace within
        its cap less what it holds in the other classes (lock held)."""
        running = {name: self._demand_jobs(pool.running()) for name, pool in self.gpu_pools.items()}
        demands = {}
        for name, scaling in self.scaling.items():
            elsewhere: dict[str, int] = {}
            for job in (job for other, jobs in running.items() if other != name for job in jobs):
                elsewhere[job.namespace] = elsewhere.get(job.namespace, 0) + job.ask.gpus
            pool = self.gpu_pools.get(name)
            queued = self._demand_jobs(pool.queued()) if pool else []
            demands[name] = shape_demand(running.get(name, []), queued, scaling, allowances(self.caps, elsewhere))
        return demands

    def _demand_jobs(self, job_ids: list[str]) -> list[Job]:
        """Jobs as the demand sees them: their GPUs, the CPUs and memory their versions ask (their actors' options),
        and their namespaces (lock held)."""
        jobs = []
        for record in filter(None, map(self.jobs.get, job_ids)):
            options = record.options or {}
            gpus, cpus, memory = options.get("num_gpus"), options.get("num_cpus"), options.get("memory")
            namespace = record.pool_key[4] if record.pool_key else ""
            jobs.append(Job(Ask(int(gpus or 0), float(cpus or 0), int(memory or 0)), namespace))
        return jobs

    def _scale(self) -> None:
        """Ask the autoscaler for what the scaling classes' jobs need, at once when they change and every few
        seconds anyway; report nodes up / starting to the control plane."""
        publisher = self.publisher
        assert publisher is not None  # runs only for scaling classes
        report = ScalingReport(self.scaling)
        while not self.stopping.is_set():
            self.demand_wake.wait(_CAPACITY_POLL_S)
            self.demand_wake.clear()
            if self.stopping.is_set():
                break
            with self.lock:
                demands = self._demands()
            now = time.monotonic()
            bundles = [bundle for name, demand in demands.items() for bundle in bundles_of(name, demand)]
            if publisher.due(bundles, now):
                try:
                    publisher.publish(bundles, now)
                except Exception:  # the cluster is going away, or refuses: the next round retries
                    log.warning("ray bridge: could not ask the autoscaler for %s", bundles, exc_info=True)
                    continue
            changed = report.update(now, demands, self.nodes)
            if changed is not None:
                self.proto.send(event="scaling", classes=changed)

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


def _add_start(final: dict, record: _BridgeJob, value: dict) -> None:
    """``start_ms`` into the outcome's timings: asking for this job's new actor → its ``__init__``
    done (scheduling and the process start included); 0 on a warm actor."""
    if "timings" not in final:
        return
    ready_at = value.get("ready_at")
    start_ms = 0.0
    if record.created_at is not None and isinstance(ready_at, (int, float)):
        start_ms = max(0.0, (ready_at - record.created_at) * 1000.0)
    final["timings"] = {**final["timings"], "start_ms": start_ms}
    final.pop("setup_reused_from", None)  # the bridge's word only: the executor moves it into the timings
    if record.reused_from is not None and final["timings"].get("setup_reused"):  # the actor rebound its code
        final["setup_reused_from"] = record.reused_from


def _value_problem(value: object, job_id: str) -> str | None:
    """Why what a job's call returned (``{last_seq, tail, final}``: ``task._run_job``) is not what the protocol
    allows, or None: the tail holds events a call may push, the outcome is one (``result_ipc``: Arrow bytes)."""
    if not isinstance(value, dict) or type(value.get("last_seq", 0)) is not int:
        return "the call's return value is malformed"
    tail = value.get("tail") or []
    if not isinstance(tail, list) or not all(isinstance(entry, list) and len(entry) == 2 for entry in tail):
        return "the call's events are malformed"
    for _, event in tail:
        if (problem := event_problem(event, job_id, kinds=_PUSHED)) is not None:
            return problem
    final = value.get("final")
    if isinstance(final, dict) and "result_ipc" in final:
        arrow = isinstance(final["result_ipc"], bytes) and isinstance(final.get("summary", {}), dict)
        return None if arrow else "its Arrow result is malformed"
    return event_problem(final, job_id, kinds=_OUTCOMES)


def _store_result(final: dict, path: str | None, durable: bool, most: int | None = None) -> dict:
    """Write a task's ``result_ipc`` atomically to the job's result file; the ``result`` event (a failure in phase
    ``result`` for one over ``most`` bytes, which is never written)."""
    from lancefn_jupyter.wire.dataplane import write_bytes_file

    if most is not None and len(final["result_ipc"]) > most:
        return {"event": "failed", "phase": "result", "message": result_too_large(len(final["result_ipc"]), most)}
    if path is None:
        return {
            "event": "failed",
            "phase": "executor",
            "message": "an Arrow result arrived for a job without a result file",
        }
    try:
        nbytes = write_bytes_file(path, final["result_ipc"], durable=durable)
    except OSError as error:
        return {
            "event": "failed",
            "phase": "executor",
            "message": f"could not store the result ({error})",
            "retryable": True,
        }
    return {"event": "result", "result_file": path, "nbytes": nbytes, "summary": final.get("summary") or {}}


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
            "message": f"Ray could not set up the job's runtime_env (uv packages / image / env): {text[-1500:]}",
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


def bridge_main() -> int:
    """Entry point of the bridge process (started by :class:`RayExecutor`)."""
    proto = Protocol(os.dup(1), strict=False, max_line=LINE_MAX_BYTES)  # it forwards what jobs send
    os.dup2(2, 1)  # anything Ray or a library prints goes to stderr, never into the protocol
    config = json.loads(sys.stdin.buffer.readline() or b"{}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    driver: _Driver | None = None
    once = threading.Lock()

    def finish(code: int) -> None:
        """Cancel tasks, stop Ray, sweep what is left in our session, exit.  Runs once."""
        if not once.acquire(blocking=False):
            return
        watchdog = threading.Timer(20.0, lambda: (kill_session(os.getpid()), os._exit(code or 1)))  # type: ignore[func-returns-value]
        watchdog.daemon = True
        watchdog.start()
        if driver is not None:
            driver.shutdown()
        kill_session(os.getpid())  # we lead our session: anything in it is a Ray process we started
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
