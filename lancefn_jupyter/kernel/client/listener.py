"""The background event listener: `GET /v1/jobs/events` (SSE) → widgets and Job handles (runs in the kernel).

The kernel has one, owned by the session (`session.listener()`), which hands it the client to
follow; this module never imports the session.

Why one thread and not a poller per widget: every widget of a kernel shows a slice of the same
stream (a job, all jobs, GPU usage), so one connection feeds them all and a state change reaches a
widget model in about a millisecond plus the network. Updates are sent from this thread, which is
what keeps widgets live while the kernel is busy running another cell (kernel → frontend comm
messages work from any thread; frontend → kernel messages, e.g. button clicks, wait for the kernel).

Design:
- Subscriptions are held through `weakref.WeakMethod`, so a widget that is closed (or a `Job`
  handle that is dropped) is collected and silently unsubscribed. Subscribing never starts a thread;
  `start()` does (widgets call it).
- Connecting without a resume point means "changes from now on" (the server's rule), so after such a
  connect the listener re-reads, over REST, everything its subscribers show (`resync`); the stream is
  already subscribed on the server when its first event (always a `usage` event) arrives, so nothing
  falls between the two.
- Reconnects use `Last-Event-ID` (the server replays what was missed from its durable event log),
  with exponential backoff (50 ms doubling to 3 s) while the control plane is down or restarting. A
  change of connection (`%lancefn connect …`) starts afresh instead, since event ids belong to one
  server.
- Queue positions: a pending job's own event carries its position when that job changes; when the
  queue moves, the server sends a `queue` event listing each class's pending jobs in start order
  (docs/ARCHITECTURE.md, "Events"), and the listener re-delivers every shown pending job whose
  position or expected start it moved, as the panel's `applyQueueEvent` does. The stream's first
  `queue` event is a snapshot, so a fresh connect needs no priming.
- A second small thread ("ticker", 1 s) refreshes what changes with the clock (elapsed time of
  running jobs, open log views) and notices a changed connection; it never touches the network for
  state.
- `stop()` (also `session.stop_listener()`, `unload_ipython_extension`, atexit) sets a flag, shuts the
  stream's socket down so a blocked read returns at once, and joins both threads. Both threads are
  daemons, so a kernel shutdown is never held up.
"""

from __future__ import annotations

import random
import socket
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from lancefn_jupyter.kernel.client.errors import LancefnError
from lancefn_jupyter.kernel.client.events import parse_sse_lines
from lancefn_jupyter.kernel.client.logs import log

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client
    from lancefn_jupyter.wire.models import Job

__all__ = ["EventListener", "queue_positions", "running_threads"]

_BACKOFF_INITIAL_S = 0.05
_BACKOFF_MAX_S = 3.0
_TICK_S = 1.0
_READ_TIMEOUT_S = 45.0  # the server sends a keepalive every 15 s
_STREAM_THREAD, _TICKER_THREAD = "lancefn-events", "lancefn-widgets-ticker"


class _Subscribers:
    """Weak callbacks grouped by key; dead ones are dropped as they are met."""

    def __init__(self) -> None:
        self._by_key: dict[Any, list[weakref.WeakMethod]] = {}

    def add(self, key: Any, callback: Callable) -> None:
        ref = weakref.WeakMethod(callback)
        refs = self._by_key.setdefault(key, [])
        if not any(existing() == callback for existing in refs):
            refs.append(ref)

    def get(self, key: Any) -> list[Callable]:
        refs = self._by_key.get(key)
        if not refs:
            return []
        alive = [(ref, ref()) for ref in refs]
        live = [cb for _, cb in alive if cb is not None]
        if len(live) != len(refs):
            kept = [ref for ref, cb in alive if cb is not None]
            if kept:
                self._by_key[key] = kept
            else:
                del self._by_key[key]
        return live

    def keys(self) -> list[Any]:
        return list(self._by_key)

    def discard_owner(self, owner: Any, key: Any = None) -> None:
        keys = [key] if key is not None else list(self._by_key)
        for k in keys:
            refs = self._by_key.get(k)
            if not refs:
                continue
            kept = [ref for ref in refs if ref() is not None and getattr(ref(), "__self__", None) is not owner]
            if kept:
                self._by_key[k] = kept
            else:
                self._by_key.pop(k, None)

    def count(self) -> int:
        return sum(1 for key in list(self._by_key) for _ in self.get(key))


class EventListener:
    """Reads the control plane's event stream on a daemon thread and feeds subscribers.

    `client_provider()` is the client to stream from (None: no control plane chosen yet); it is asked
    again on every connect and tick, so a new connection replaces the stream."""

    def __init__(
        self,
        client_provider: Callable[[], Client | None],
        *,
        backoff_initial_s: float = _BACKOFF_INITIAL_S,
        backoff_max_s: float = _BACKOFF_MAX_S,
        tick_s: float = _TICK_S,
    ):
        self._client_provider = client_provider
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.tick_s = tick_s
        self._lock = threading.RLock()
        self._jobs = _Subscribers()  # job_id → callbacks(Job)
        self._all_jobs = _Subscribers()  # None → callbacks(Job)
        self._usage = _Subscribers()  # None → callbacks(list[GpuUsage])
        self._resync = _Subscribers()  # None → callbacks(client) after a fresh connect
        self._ticks = _Subscribers()  # None → callbacks() once per tick
        self._batches = _Subscribers()  # batch_id (None: every batch) → callbacks(Batch); `batch` events
        self._terminal: set[str] = set()  # subscribed jobs last seen terminal (no resync needed)
        self._pending: dict[str, Any] = {}  # last Job model of each shown pending job
        self.queue_positions: dict[str, int] = {}  # job_id → 1-based position, from the last `queue` event
        self.usage: list | None = None
        self.last_event_id: int | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # cuts a backoff wait short (stop, or a new connection)
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        self._stream_client: Client | None = None
        self._socket: socket.socket | None = None
        # Counters and the last problem, for `%lancefn`-style diagnostics and tests.
        self.connects = 0
        self.resumes = 0
        self.events = 0
        self.failures = 0
        self.last_error: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def connected(self) -> bool:
        return self.running and self._connected.is_set()

    def is_live(self) -> bool:
        """True while events flow: subscribed state is current without asking over HTTP."""
        return self.connected

    def wait_connected(self, timeout: float = 10.0) -> bool:
        return self._connected.wait(timeout)

    def start(self) -> EventListener:
        with self._lock:
            if self.running:
                return self
            self._stop.clear()
            self._wake.clear()
            self._thread = threading.Thread(target=self._run, name=_STREAM_THREAD, daemon=True)
            self._ticker = threading.Thread(target=self._tick_loop, name=_TICKER_THREAD, daemon=True)
            self._thread.start()
            self._ticker.start()
            return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads (idempotent); subscriptions are kept for a later `start()`."""
        self._stop.set()
        self._wake.set()
        self._interrupt_stream()
        for thread in (self._thread, self._ticker):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout)
        self._connected.clear()
        with self._lock:
            self._thread = self._ticker = None

    def threads(self) -> list[threading.Thread]:
        return [t for t in (self._thread, self._ticker) if t is not None and t.is_alive()]

    def _interrupt_stream(self) -> None:
        sock = self._socket
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -------------------------------------------------------------- subscriptions

    def subscribe_job(self, job_id: str, callback: Callable[[Any], None]) -> None:
        """`callback(job)` (a bound method, held weakly) on every change of `job_id`."""
        with self._lock:
            self._jobs.add(job_id, callback)
            self._terminal.discard(job_id)

    def subscribe_jobs(self, callback: Callable[[Any], None], *, resync: Callable[[Any], None] | None = None) -> None:
        """`callback(job)` on every job change; `resync(client)` after a fresh (non-resumed) connect."""
        with self._lock:
            self._all_jobs.add(None, callback)
            if resync is not None:
                self._resync.add(None, resync)

    def subscribe_usage(self, callback: Callable[[list], None]) -> None:
        """`callback(list[GpuUsage])` on every usage event (sent after each placement change)."""
        with self._lock:
            self._usage.add(None, callback)

    def subscribe_batch(self, batch_id: str | None, callback: Callable[[Any], None]) -> None:
        """`callback(batch)` on every `batch` event of `batch_id` (None: of every batch)."""
        with self._lock:
            self._batches.add(batch_id, callback)

    def subscribe_tick(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._ticks.add(None, callback)

    def unsubscribe(self, owner: Any, job_id: str | None = None) -> None:
        """Drop every callback bound to `owner` (or only its subscription to `job_id`)."""
        with self._lock:
            if job_id is not None:
                self._jobs.discard_owner(owner, job_id)
                return
            for group in (self._jobs, self._all_jobs, self._usage, self._resync, self._ticks, self._batches):
                group.discard_owner(owner)

    def subscriber_count(self) -> int:
        with self._lock:
            return sum(
                g.count() for g in (self._jobs, self._all_jobs, self._usage, self._resync, self._ticks, self._batches)
            )

    def observe_rest(self, job: Job) -> Job:
        """A job read over REST by a widget: kept for queue moves; returns the snapshot to show
        (at the position the stream last gave, which a REST read never overrides)."""
        with self._lock:
            if self.running and job.job_state == "PENDING" and job.placement.queue_position is not None:
                position = self.queue_positions.get(job.job_id)
                if position is not None and position != job.placement.queue_position:
                    job = _placed(job, queue_position=position)
                return self._pending.setdefault(job.job_id, job)
        return job

    # ------------------------------------------------------------------- threads

    def _run(self) -> None:
        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            client = self._client_provider()
            if client is None:
                self._wake.wait(self.tick_s)
                self._wake.clear()
                continue
            if client is not self._stream_client:
                self._stream_client = client
                self.last_event_id = None  # event ids belong to one server
            try:
                delivered = self._stream_once(client)
            except Exception as error:  # never let the thread die; report and retry
                self.failures += 1
                self.last_error = f"{type(error).__name__}: {error}"
                log.debug("lancefn event stream failed: %s", self.last_error)
                delivered = False
            finally:
                self._connected.clear()
                self._socket = None
            if self._stop.is_set():
                break
            backoff = self.backoff_initial_s if delivered else min(self.backoff_max_s, backoff * 2)
            self._wake.wait(backoff * (0.75 + 0.5 * random.random()))
            self._wake.clear()

    def _stream_once(self, client: Client) -> bool:
        """One connection: returns True if it got as far as receiving events."""
        resume = self.last_event_id
        response = client.open_event_stream(last_event_id=resume, read_timeout=_READ_TIMEOUT_S, connect_timeout=5.0)
        try:
            self._socket = response.socket
            if self._stop.is_set():
                return False
            established = False
            for event in parse_sse_lines(response.iter_lines()):
                if self._stop.is_set():
                    break
                if not established:
                    established = True
                    self.connects += 1
                    if resume is not None:
                        self.resumes += 1
                    else:
                        self._fresh_sync(client)
                    self._connected.set()
                self._dispatch(event)
            return established
        except (LancefnError, OSError) as error:
            if not self._stop.is_set():
                self.failures += 1
                self.last_error = f"{type(error).__name__}: {error}"
            return self._connected.is_set()
        finally:
            response.close()

    def _fresh_sync(self, client: Client) -> None:
        """After a connect without resume point: re-read what subscribers show, over REST."""
        from lancefn_jupyter.wire.models import TERMINAL_STATES

        with self._lock:
            self.queue_positions.clear()
            self._pending.clear()
            job_ids = [k for k in self._jobs.keys() if k not in self._terminal]  # noqa: SIM118 (_Subscribers is no mapping)
            resyncs = self._resync.get(None)
        for job_id in job_ids:
            if self._stop.is_set():
                return
            try:
                job = client.jobs.describe(job_id)
            except Exception:
                continue
            with self._lock:
                if job.job_state in TERMINAL_STATES:
                    self._terminal.add(job_id)
                elif job.job_state == "PENDING":
                    self._pending[job_id] = job
            for callback in self._callbacks_for(job_id):
                _call(callback, job)
        for callback in resyncs:
            _call(callback, client)
        try:
            usage = client.gpu.usage()
        except Exception:
            return
        self._deliver_usage(usage)

    def _callbacks_for(self, job_id: str) -> list[Callable]:
        with self._lock:
            return self._jobs.get(job_id)

    def _dispatch(self, event: Any) -> None:
        from lancefn_jupyter.wire.models import TERMINAL_STATES, GpuUsage, Job

        self.events += 1
        if event.id is not None:  # job events carry the durable sequence number
            self.last_event_id = event.id
        if event.event == "job" and isinstance(event.data, dict):
            data = event.data
            job_id = cast(str, data.get("job_id"))
            with self._lock:
                direct = self._jobs.get(job_id)
                everyone = self._all_jobs.get(None)
            job = None
            if direct or everyone:
                try:
                    job = Job.from_wire(data)
                except Exception as error:  # a newer server's shape we cannot read: skip, keep going
                    self.last_error = f"unreadable job event: {error}"
                    return
            with self._lock:
                if job is not None and job.job_state == "PENDING":
                    self._pending[job_id] = job
                else:
                    self._pending.pop(job_id, None)
                if job is not None and job.job_state in TERMINAL_STATES and direct:
                    self._terminal.add(job_id)
            if job is not None:
                for callback in direct:
                    _call(callback, job)
                for callback in everyone:
                    _call(callback, job)
        elif event.event == "queue" and isinstance(event.data, dict):
            self._dispatch_queue(event.data)
        elif event.event == "batch" and isinstance(event.data, dict):
            self._dispatch_batch(event.data)
        elif event.event == "usage" and isinstance(event.data, dict):
            try:
                usage = [GpuUsage.from_wire(item) for item in event.data.get("classes", [])]
            except Exception as error:
                self.last_error = f"unreadable usage event: {error}"
                return
            self._deliver_usage(usage)

    def _dispatch_queue(self, data: dict) -> None:
        """Re-deliver each shown pending job whose position or expected start the queue event moves
        (an event without `expected_start_ms` leaves expected starts as they were)."""
        positions = queue_positions(data)
        expected = data.get("expected_start_ms")
        expected = expected if isinstance(expected, dict) else {}
        uncertain = data.get("expected_start_uncertain")
        uncertain = uncertain if isinstance(uncertain, dict) else {}
        with self._lock:
            self.queue_positions = positions
            everyone = self._all_jobs.get(None)
            changed = []
            for job_id, previous in list(self._pending.items()):
                update: dict[str, Any] = {}
                position = positions.get(job_id)
                if position is not None and position != previous.placement.queue_position:
                    update["queue_position"] = position
                at = expected.get(job_id, previous.placement.expected_start_ms)
                if (at is None or isinstance(at, int)) and at != previous.placement.expected_start_ms:
                    update["expected_start_ms"] = at
                vague = (
                    uncertain.get(job_id) is True if job_id in expected else previous.placement.expected_start_uncertain
                )
                if vague != previous.placement.expected_start_uncertain:
                    update["expected_start_uncertain"] = vague
                if update:
                    updated = self._pending[job_id] = _placed(previous, **update)
                    changed.append((updated, self._jobs.get(job_id)))
        for updated, callbacks in changed:
            for callback in [*callbacks, *everyone]:
                _call(callback, updated)

    def _dispatch_batch(self, data: dict) -> None:
        with self._lock:
            callbacks = self._batches.get(data.get("batch_id")) + self._batches.get(None)
        if not callbacks:
            return
        from lancefn_jupyter.wire.batch_models import Batch

        try:
            batch = Batch.from_wire(data)
        except Exception as error:
            self.last_error = f"unreadable batch event: {error}"
            return
        for callback in callbacks:
            _call(callback, batch)

    def _deliver_usage(self, usage: list) -> None:
        self.usage = usage
        with self._lock:
            callbacks = self._usage.get(None)
        for callback in callbacks:
            _call(callback, usage)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            # A new connection (`%lancefn connect …`) replaces the stream at once.
            client = self._client_provider()
            if self._stream_client is not None and client is not self._stream_client:
                self._interrupt_stream()
                self._wake.set()
            with self._lock:
                callbacks = self._ticks.get(None)
            for callback in callbacks:
                if self._stop.is_set():
                    return
                _call(callback)


def queue_positions(data: dict) -> dict[str, int]:
    """job_id → 1-based queue position from a `queue` event (`{"classes": {class: [job_id, …]}}`);
    another namespace's job is listed as null: it counts for positions but names nothing."""
    classes = data.get("classes")
    if not isinstance(classes, dict):
        return {}
    return {
        str(job_id): index
        for ids in classes.values()
        if isinstance(ids, list)
        for index, job_id in enumerate(ids, start=1)
        if job_id is not None
    }


def _placed(job: Job, **placement: Any) -> Job:
    """`job` with some placement fields replaced (models are frozen)."""
    return job.model_copy(update={"placement": job.placement.model_copy(update=placement)})


def _call(callback: Callable, *args: Any) -> None:
    try:
        callback(*args)
    except Exception:  # one broken widget must not stop the others' updates
        log.exception("lancefn widget update failed")


def running_threads() -> list[threading.Thread]:
    """Threads the listener owns that are still alive (empty after `stop_listener()`)."""
    return [t for t in threading.enumerate() if t.name in (_STREAM_THREAD, _TICKER_THREAD)]
