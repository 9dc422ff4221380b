"""Inside Ray: the task body, the warm job actor, the event hub actor and output capture (per Ray worker process)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from lancefn_jupyter.server.executors.ray.cluster import NAMESPACE
from lancefn_jupyter.worker.capture import Capture, flush_output, tag_rows
from lancefn_jupyter.worker.protocol import flush_stdio

_HUB_FLUSH_S = 0.02  # a running task's events reach the hub (and the control plane) this often
_FLUSHER_PARK_S = 1.0  # an actor's flusher thread stops ticking when no task has run this long


class EventHub:
    """Async actor (0 CPUs) collecting task events until the bridge drains them (long poll). Any process of the
    cluster may push: each push names its job's token (``hub_token``, which only that job's call carries), and the
    bridge relays only what names the right one."""

    def __init__(self) -> None:
        import asyncio

        self._events: list = []
        self._ready = asyncio.Event()

    async def push(self, job_id: str, token: str, events: list) -> None:
        self._events.extend([job_id, token, seq, event] for seq, event in events)
        self._ready.set()

    async def drain(self, timeout: float) -> list:
        import asyncio

        if not self._events and timeout > 0:
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                pass
        self._ready.clear()
        events, self._events = self._events, []
        return events


class _HubSender:
    """Numbered, ordered events from a task to the hub, flushed every ``_HUB_FLUSH_S`` once the
    task has run that long.

    ``send`` only appends (it never waits on Ray), so output readers can call it directly.  A
    task that ends within ``_HUB_FLUSH_S`` sends nothing through the hub, whenever the flusher
    happens to wake: :meth:`close` hands back the unflushed events, which travel inline with the
    outcome.  So a short job costs no extra round trip, and a long one shows ``started``, logs
    and progress live.
    """

    def __init__(self, hub: Any, job_id: str, token: str) -> None:
        self._hub, self._job_id, self._token = hub, job_id, token
        self._lock = threading.Lock()
        # [number, event] lists, not tuples: Ray packs lists, dicts and scalars with msgpack, but pickles each tuple
        self._pending: list[list] = []
        self._closed = False
        self.seq = 0  # events numbered so far
        self.flushed = 0  # highest number pushed to the hub
        self._due = time.monotonic() + _HUB_FLUSH_S  # no flush before: a short job's events go inline
        _flusher().add(self)

    def send(self, **event: Any) -> None:
        with self._lock:
            self.seq += 1
            if self._closed:  # a late line after close: straight to the hub
                self._hub.push.remote(self._job_id, self._token, [[self.seq, event]])
            else:
                self._pending.append([self.seq, event])

    def flush(self) -> None:
        if time.monotonic() < self._due:
            return
        with self._lock:  # pushed under the lock: submission order is hub order
            if self._pending and not self._closed:
                batch, self._pending = self._pending, []
                self._hub.push.remote(self._job_id, self._token, batch)
                self.flushed = batch[-1][0]

    def close(self) -> list[list]:
        """Stop flushing; return the events not pushed (they go with the outcome)."""
        _flusher().discard(self)
        with self._lock:
            self._closed = True
            tail, self._pending = self._pending, []
        return tail


class _Flusher:
    """One thread per Ray worker process flushing every live task's events to the hub.

    It ticks every ``_HUB_FLUSH_S`` while tasks come, and parks once none has run for
    ``_FLUSHER_PARK_S`` (a warm actor may idle for minutes, and its wake-ups would cost CPU).  A
    task wakes it only if it is parked: in a stream of short jobs no job pays for a thread wake-up
    (a thread taking the GIL from the job) when it starts."""

    def __init__(self) -> None:
        self._senders: set[_HubSender] = set()
        self._lock = threading.Lock()
        self._busy = threading.Event()
        self._parked = True
        threading.Thread(target=self._run, name="lancefn-hub-flush", daemon=True).start()

    def add(self, sender: _HubSender) -> None:
        with self._lock:
            self._senders.add(sender)
            if self._parked:
                self._parked = False
                self._busy.set()

    def discard(self, sender: _HubSender) -> None:
        with self._lock:
            self._senders.discard(sender)

    def _run(self) -> None:
        idle_ticks = int(_FLUSHER_PARK_S / _HUB_FLUSH_S)
        while True:
            self._busy.wait()
            quiet = 0
            while quiet < idle_ticks:
                time.sleep(_HUB_FLUSH_S)
                with self._lock:
                    senders = list(self._senders)
                quiet = 0 if senders else quiet + 1
                for sender in senders:
                    try:
                        sender.flush()
                    except Exception:  # the hub is gone (driver ended): the task is being torn down
                        pass
            with self._lock:
                if not self._senders:  # else a task came since: tick on
                    self._parked = True
                    self._busy.clear()


_flushers: list[_Flusher] = []
_flushers_lock = threading.Lock()


def _flusher() -> _Flusher:
    if not _flushers:
        with _flushers_lock:
            if not _flushers:
                _flushers.append(_Flusher())
    return _flushers[0]


class _ActorOutput:
    """fds 1 and 2 of this actor process, captured once for its life; their lines become ``log``
    events of the job running now (an actor runs one job at a time).

    The local worker's reader threads (``worker.capture.Capture``) do the reading; a job ends with their sync
    marker, so every line it wrote is queued on its sender before the outcome.  Lines written
    between jobs (Ray's own, a stray thread's) go to the fds Ray gave the process (its log files).
    """

    def __init__(self) -> None:
        flush_stdio()
        self.current: Callable[..., None] | None = None
        self._saved = {"stdout": os.dup(1), "stderr": os.dup(2)}
        self.captures = [Capture(self, "stdout", 1), Capture(self, "stderr", 2)]
        for capture in self.captures:
            capture.start()
        for std in (sys.stdout, sys.stderr):  # line-buffered, so prints show up live
            try:
                std.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            except (AttributeError, ValueError):
                pass
        tag_rows()

    def send(self, **event: Any) -> None:  # from the reader threads
        target = self.current
        if target is not None:
            target(**event)
        else:
            os.write(self._saved[event["stream"]], "".join(line + "\n" for line in event["lines"]).encode())

    @contextlib.contextmanager
    def to(self, send: Callable[..., None]) -> Iterator[None]:
        """Output goes to ``send`` until every line written inside the block has been handed over."""
        self.current = send
        try:
            yield
        finally:
            flush_output(self.captures)
            self.current = None


_node: list[str] = []  # per Ray worker process: its node id


def _node_id() -> str:
    if not _node:
        import ray

        _node.append(ray.get_runtime_context().get_node_id())
    return _node[0]


class JobActor:
    """A warm worker of one (class, GPUs, function version, namespace): runs its jobs one at a time
    (a GPU one holds its GPUs for its whole life, so where it runs is read once).

    ``version`` is what every job of its version shares (the artifact, its entrypoint, filename,
    packages and state, the hub's name): sent once, when the actor is made, so each job's call
    carries only its own fields (id, rows, env).  The runner keeps the version's module loaded in
    this process between jobs (docs/ARCHITECTURE.md, "Warm state")."""

    def __init__(self, version: dict) -> None:
        import ray

        from lancefn_jupyter.worker import reap

        reap.become_subreaper()  # what its jobs detach (setsid, double fork) stays findable by the sweep ("Job processes")
        self._task = version["task"]
        self._hub = ray.get_actor(version["hub"], namespace=NAMESPACE)
        self._where = {"devices": [str(gpu) for gpu in ray.get_gpu_ids()], "node": _node_id()}
        self._output = _ActorOutput()
        self._ready_at = time.time()  # wall clock: the bridge, which asked for this actor, counts its start
        self._env: dict[str, str] = {}  # the last job's function env, which the teardown sees too
        # Its GPUs sampled through NVML while each job runs (docs/ARCHITECTURE.md, "Cost"), as the local executor
        # does; False once NVML could not open them (no driver: a simulated class), so no job tries again.
        self._sample_gpus = bool(self._where["devices"])

    def run(self, job: dict) -> dict:
        """Run one job: ``job`` holds its own task fields (task_id, rows, env, data plane), and ``version_task`` when
        the job is of another version with the same setup digest: this actor serves that version from now on
        (the runner rebinds its code onto the live module: docs/ARCHITECTURE.md, "Setup reuse")."""
        self._task = job.pop("version_task", None) or self._task
        self._env = job.get("env") or {}
        sampler = None
        if self._sample_gpus:
            from lancefn_jupyter.worker.gpustats import GpuSampler

            sampler = GpuSampler(os.getpid(), self._where["devices"])
            if not sampler.start():
                self._sample_gpus, sampler = False, None
        try:
            outcome = _run_job(self._hub, {**self._task, **job}, self._where, self._output)
        finally:
            stats = sampler.stop() if sampler is not None else {}
        if stats:
            final = outcome["final"]
            final["timings"] = {**(final.get("timings") or {}), **stats}
        return {**outcome, "ready_at": self._ready_at}

    def teardown(self) -> None:
        """The actor retires: tear down the version it holds (bounded in the runner); then it is killed."""
        from lancefn_jupyter.worker.runner import release

        with _task_env(self._env):
            release()


@contextlib.contextmanager
def _task_env(env: dict[str, str]) -> Iterator[None]:
    """The function's env in ``os.environ`` for the task's duration, then the previous values back.

    Set in-process (never at exec), so the values are in no ``/proc/<pid>/environ``."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _slice_failure(task: dict) -> dict | None:
    """A backfill chunk: read its rows from the table here, in the Ray worker, as the task's
    ``rows_ipc`` (docs/ARCHITECTURE.md, "Backfills"); the ``failed`` event when they cannot be read."""
    table_slice = task.pop("table_slice", None)
    if table_slice is None:
        return None
    from lancefn_jupyter.tables.slices import slice_ipc
    from lancefn_jupyter.wire.backfill_models import TableSlice

    try:
        task["rows_ipc"] = slice_ipc(TableSlice.from_wire(table_slice), task.get("input_types") or {})
    except Exception as error:  # the table moved or changed under the backfill: the chunk fails, saying why
        return {
            "event": "failed",
            "phase": "validation",
            "message": f"could not read the chunk's rows from the table: {error}",
        }
    return None


def _run_job(hub: Any, task: dict, where: dict, output: _ActorOutput) -> dict:
    """One job on an actor: report where it runs, run the artifact like the local worker, return the outcome."""
    from lancefn_jupyter.worker.runner import run_task_inline

    sender = _HubSender(hub, task["task_id"], str(task.pop("hub_token", "")))
    node = where["node"]
    sender.send(event="started", **where)
    env = task.get("env")
    try:
        with output.to(sender.send), _task_env(env) if env else contextlib.nullcontext():
            final = _slice_failure(task) or run_task_inline(task, sender.send)
    finally:
        tail = sender.close()
    if final.get("event") == "result":  # a result means every row is done: its progress would be one more event
        tail = [[seq, event] for seq, event in tail if event.get("event") != "progress"]
    if final.get("event") == "failed" and final.get("phase") == "environment":
        final["message"] = f"{final.get('message', '')} [on Ray node {node}]"
    # The bridge relays events 1..last_seq from the hub, then the tail, then the outcome.
    return {"last_seq": sender.flushed, "tail": tail, "final": final}
