"""The control plane core: function catalog, job state machine, scheduling and events.

``ControlPlane`` ties together the store (durable truth), the pure scheduler (who gets
which devices), the executor (runs tasks) and the event bus (SSE fan-out).  Every method
but ``wait_job`` (async: it awaits a job's change on the event loop) is synchronous and
guarded by one re-entrant lock; executor callbacks arrive on executor threads and take the
same lock.  Events are handed to the asyncio loop with
``call_soon_threadsafe`` *while the lock is held*, so subscribers see them in seq order.

Job lifecycle::

    run → PENDING (queued; waiting_on_capacity, queue_position)
        → PENDING with devices (placed; the executor is starting the worker)
        → IN_PROGRESS (task_started) → DONE | FAILED | TIMED_OUT
    cancel at any non-terminal point → CANCELLED (devices freed at once)

Durability on start (decision): jobs that were IN_PROGRESS — or already placed on devices —
when the server died are **re-queued as PENDING** at their original place in their class's
FIFO, because the user asked for the work and a worker that died with the server produced
nothing.  Their progress is reset and a log line records the restart.  A job re-queued more
than ``MAX_REQUEUES`` (3) times is FAILED with a retryable ``server_restart`` failure so a
job that crashes the server cannot loop forever.  PENDING jobs stay queued in their original
order; after a restart no device is busy.

No input may produce a 5xx: every user-facing problem raises :class:`ApiError` with a 4xx
status and a message saying what is wrong and how to fix it.

Size: over 600 lines because the job state machine, its executor callbacks and its persistence
share one lock and must be read together; the event bus (``events.py``), the disk-full
bookkeeping (``unsaved.py``), scheduling (``scheduler.py``) and estimates live apart.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ..models import (
    TERMINAL_STATES,
    FunctionRegistrationRequest,
    FunctionVersion,
    JobFailure,
    JobState,
    decode_artifact,
    derive_version,
    rfc3339_now,
    version_id,
)
from .artifact_check import artifact_problem
from .batches import BatchManager
from .datastore import DataStore
from .estimates import QueueEstimator
from .events import EventBus, Subscriber  # noqa: F401  (Subscriber: re-exported)
from .executors.base import REDACTED, Executor, TaskSpec, redact_env
from .gpu_classes import GpuClassConfig
from .namespaces import DEFAULT_NAMESPACE, queue_view, visible
from .scheduler import SchedulerState
from .store import JobRecord, Store, VersionRow, is_storage_full
from .unsaved import UnsavedJobs

__all__ = [
    "ApiError",
    "ControlPlane",
    "EventBus",
    "format_validation_error",
    "redact_definition",
    "MAX_REQUEUES",
    "REDACTED",
]

log = logging.getLogger("lancefn.server")

MAX_REQUEUES = 3
MAX_LOG_LINES_PER_JOB = 20_000
MAX_LOG_LINE_CHARS = 8_192
QUEUE_HEAD_EVENT_LEN = 100  # pending job ids per class in each `queue` event
QUEUE_ESTIMATES_INTERVAL_S = 0.25  # `queue` events carry expected starts at most this often (a trailing one follows)
PROGRESS_EVENT_INTERVAL_S = 0.1  # progress events are coalesced per job; final states carry the final count
# A placement, start or progress change waits this long for the job's next change before it is
# committed, so a quick job's states (placed, started, last row, done) share one commit. A job
# not yet saved as placed or started is re-queued after a crash, like a running one: nothing
# acknowledged as finished is lost.
DEFER_COMMIT_S = 0.01
PAGE_LIMIT_MAX = 1000
DEFAULT_MAX_ARTIFACT_BYTES = 4 * 1024 * 1024  # --max-artifact-bytes

PENDING, IN_PROGRESS = JobState.PENDING.value, JobState.IN_PROGRESS.value
DONE, FAILED = JobState.DONE.value, JobState.FAILED.value
CANCELLED, TIMED_OUT = JobState.CANCELLED.value, JobState.TIMED_OUT.value
_TERMINAL = {state.value for state in TERMINAL_STATES}
_ACTIVE = (PENDING, IN_PROGRESS)


class ApiError(Exception):
    """A client-visible error: HTTP status, stable code, readable message."""

    CODES = {
        400: "invalid_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        409: "conflict",
        413: "payload_too_large",
    }

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code or self.CODES.get(status, "error")
        self.message = message


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """Readable pydantic errors naming each field; never echoes input values (they may be secrets)."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or 'body'}: {message}" if loc else message)
    return "; ".join(parts[:10]) + (f"; and {len(parts) - 10} more" if len(parts) > 10 else "")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _clean_text(text: str) -> str:
    """``text`` made storable: lone surrogates (from a worker's output) become U+FFFD-ish '?'."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def redact_definition(definition: dict) -> dict:
    """A FunctionVersion as replies show it: ``runtime.env`` values (often tokens or passwords)
    replaced by ``<redacted>``, names kept.  The stored definition keeps the values for the
    executor, and ``runtime_digest`` still covers them, so changing a value gives a new version."""
    runtime = definition.get("runtime")
    if not isinstance(runtime, dict) or not runtime.get("env"):
        return definition
    return {**definition, "runtime": {**runtime, "env": {name: REDACTED for name in runtime["env"]}}}


def _encode_token(seq: int) -> str:
    return base64.urlsafe_b64encode(f"lancefn:{seq}".encode()).decode().rstrip("=")


def _decode_token(token: str | None) -> int | None:
    if token is None or token == "":
        return None
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        prefix, _, seq = text.partition(":")
        # SQLite integers are 64-bit: a bigger number is no token of ours (and must not reach SQLite).
        if prefix == "lancefn" and seq.isascii() and seq.isdigit() and len(seq) <= 18:
            return int(seq)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        pass
    raise ApiError(
        400, "page_token is not a token this server issued; pass the page_token from the previous reply or omit it"
    )


def _callback(method):
    """Executor callbacks must never raise into executor threads, and a bookkeeping error
    must not leave the job hanging: the job is failed instead.  A full disk is not such an
    error: state changes are kept in memory and saved once space frees (``UnsavedJobs.keep``),
    log lines that do not fit are dropped, and the job goes on."""

    @functools.wraps(method)
    def guarded(self: "ControlPlane", job_id: str, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, job_id, *args, **kwargs)
        except Exception as error:
            if is_storage_full(error):
                log.error("%s(%s): the disk is full (%s); the job goes on", method.__name__, job_id, error)
                return
            log.exception("%s(%s) failed; failing the job", method.__name__, job_id)
            self._fail_after_error(job_id)

    return guarded


# --------------------------------------------------------------------------- core


@dataclass(frozen=True)
class _Resolved:
    """Where a function version's jobs run."""

    gpu_class: str | None
    num_gpus: int
    simulated: bool


class ControlPlane:
    max_artifact_bytes = DEFAULT_MAX_ARTIFACT_BYTES  # set by create_app

    def __init__(
        self,
        *,
        store: Store,
        classes: GpuClassConfig,
        executor: Executor | None,
        version: str = "0",
        cpu_slots: int | None = None,
        data: DataStore | None = None,
    ):
        self.store = store
        # Arrow rows and results live as files next to the database (docs/ARCHITECTURE.md).
        self.data = data or DataStore(store.path.parent)
        self.classes = classes
        self.executor = executor
        self.version = version
        self.bus = EventBus()
        self._lock = threading.RLock()
        # CPU functions run at most one per core at a time (each is a worker process).
        self._scheduler = SchedulerState(classes.devices(), cpu_slots=cpu_slots or os.cpu_count() or 1)
        self._active: dict[str, JobRecord] = {}  # PENDING and IN_PROGRESS jobs; the store has the rest
        self._job_env: dict[str, dict[str, str]] = {}  # launched jobs' function env (never logged)
        # Jobs whose latest change the full disk kept from being saved; memory is authoritative
        # for them (a finished job stays there, not in _active) until a retry saves them.
        self._unsaved = UnsavedJobs(
            store, self.bus, self._lock, lambda rec: _dumps(self._job_wire(rec)), lambda: self._started
        )
        self._log_pos: dict[str, int] = {}
        self._result_arrivals = 0
        self._progress_emitted: dict[str, float] = {}
        self._progress_held: set[str] = set()  # jobs whose latest count waits for the interval to end
        self._deferred: dict[str, list[str]] = {}  # job id → events of changes not committed yet
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._estimator = QueueEstimator()  # pending jobs' expected start, from recent run times
        self._estimates_sent = 0.0  # monotonic time of the last `queue` event that carried them
        self._estimates_timer: threading.Timer | None = None
        self.batches = BatchManager(self)  # fan-out of `map` over chunk jobs (server/batches.py)

    @property
    def executor_name(self) -> str:
        return self.executor.name if self.executor is not None else "none"

    @property
    def _executor_queues(self) -> bool:
        """The executor queues and places jobs itself (Ray): the core launches them at once,
        bypassing the scheduler, and they stay PENDING until the executor reports them started."""
        return bool(getattr(self.executor, "owns_queue", False))

    # ---------------------------------------------------------------- lifecycle

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self.bus.attach(loop)

    def start(self) -> None:
        """Recover durable state, start the executor and place whatever can run."""
        with self._lock:
            if self.executor is not None:
                self.executor.start(self)
                self._apply_executor_capacity()
            self.data.sweep_temp()
            self._recover()
            for done in reversed(self.store.list_jobs(states=(DONE,), job_type="run_function", limit=1000)):
                self._note_run_time(done)
            self._enforce_retention()
            self.batches.recover()
            self._started = True
            self._dispatch()
            if self._executor_queues:  # recovered jobs, oldest first
                for rec in list(self._active.values()):
                    self._launch(rec)

    def begin_shutdown(self) -> None:
        """First step of a graceful stop (on the loop thread): end streams and long polls now
        so open connections don't hold the server up."""
        self.bus.close()
        with self._lock:
            self._started = False
            for job_id in list(self._waiters):
                self._wake_waiters(job_id)

    def shutdown(self) -> None:
        with self._lock:
            self._started = False
            executor, self.executor = self.executor, None
        if executor is not None:
            try:
                executor.shutdown()
            except Exception:  # shutting down anyway; the reason goes to the log
                log.exception("executor shutdown failed")
        with self._lock:
            for job_id in list(self._deferred):
                self._flush_deferred(job_id)
            self._unsaved.cancel_retry()
            if self._estimates_timer is not None:
                self._estimates_timer.cancel()
            self._unsaved.save(retry=False)
        # Waiters get the job as it stands now rather than hanging until their timeout.
        with self._lock:
            for job_id in list(self._waiters):
                self._wake_waiters(job_id)

    def _apply_executor_capacity(self) -> None:
        capacity = self.executor.capacity() if self.executor is not None else None
        for spec in self.classes.classes:
            count = (capacity or {}).get(spec.name)
            if count is not None and not spec.devices:
                # Classes without local devices (Ray) get one slot id per GPU the executor reports.
                self._scheduler.set_devices(spec.name, tuple(f"slot{i}" for i in range(count)))
            elif not spec.devices:
                self._scheduler.set_devices(
                    spec.name, tuple(f"slot{i}" for i in range(spec.gpu_class.max_gpu_count_per_worker))
                )

    def _recover(self) -> None:
        unfinished = self.store.list_jobs(states=_ACTIVE, limit=10**9, oldest_first=True)
        with self.store.batch():
            for rec in unfinished:
                if rec.state == IN_PROGRESS or rec.devices:
                    rec.requeues += 1
                    if rec.requeues > MAX_REQUEUES:
                        rec.state, rec.finished_ms = FAILED, _now_ms()
                        rec.failure = JobFailure(
                            phase="server_restart",
                            message=f"the control plane restarted {rec.requeues} times while this job ran; "
                            "it was not re-queued again. Submit it again to retry.",
                            retryable=True,
                        ).to_wire()
                        rec.devices, rec.node = (), None
                        self._persist(rec, new=False)
                        continue
                    rec.state, rec.started_ms, rec.devices, rec.node, rec.rows_done = PENDING, None, (), None, 0
                    self._append_log(
                        rec, "system", [f"[lancefn] control plane restarted; job re-queued (restart {rec.requeues})"]
                    )
                    self._persist(rec, new=False)
                problem = self._capacity_problem(rec.gpu_class, rec.num_gpus) if rec.num_gpus else None
                if problem:
                    rec.state, rec.finished_ms = FAILED, _now_ms()
                    rec.failure = JobFailure(phase="validation", message=problem).to_wire()
                    self._persist(rec, new=False)
                    continue
                self._active[rec.job_id] = rec
                if not self._executor_queues:
                    self._scheduler.enqueue(rec.job_id, rec.gpu_class, rec.num_gpus)

    # ---------------------------------------------------------------- functions

    def register(self, body: Any, namespace: str = DEFAULT_NAMESPACE) -> str:
        """Validate and record a function version in ``namespace``; returns the (already DONE) job's id."""
        if not isinstance(body, Mapping):
            raise ApiError(400, "the body must be a JSON object: a function registration request")
        try:
            request = FunctionRegistrationRequest.from_wire(body)
        except ValidationError as error:
            raise ApiError(400, "invalid registration request: " + format_validation_error(error)) from None
        runtime = request.runtime
        if runtime.kind not in ("python", "python_v2"):
            raise ApiError(
                400,
                f"runtime.kind {runtime.kind!r} is not supported by this server; use 'python' (CPU) or 'python_v2' (GPU)",
            )
        try:
            artifact = decode_artifact(request.artifact)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        if len(artifact) > self.max_artifact_bytes:
            raise ApiError(
                413,
                f"the artifact is {len(artifact)} bytes, over this server's limit of {self.max_artifact_bytes}; "
                "keep data out of the function's source, or start lancefn-server with a larger --max-artifact-bytes",
            )
        self._check_artifact(artifact, request.artifact.entrypoint)
        if runtime.resources is not None:
            resources = runtime.resources
            problem = self._capacity_problem(resources.gpu_class, resources.num_gpus)
            if problem:
                raise ApiError(400, problem)
        vid = version_id(request)
        with self._lock:
            row = self.store.get_version(request.name, vid, namespace)
            with self.store.batch():
                if row is None:
                    version = derive_version(request, rfc3339_now())
                    definition = version.to_canonical_json()
                    self.store.insert_version(request.name, vid, definition, artifact, version.created_at, namespace)
                else:
                    definition = row.definition
                    if row.dropped:  # registering it again brings a dropped version back
                        self.store.set_dropped(request.name, vid, False, namespace)
                now = _now_ms()
                rec = JobRecord(
                    job_id=uuid.uuid4().hex,
                    job_type="create_function",
                    state=DONE,
                    creation_ms=now,
                    started_ms=now,
                    finished_ms=now,
                    spec={"name": request.name, "version": vid},
                    name=request.name,
                    result=redact_definition(json.loads(definition)),
                    namespace=namespace,
                )
                self._persist(rec, new=True)
            return rec.job_id

    @staticmethod
    def _check_artifact(artifact: bytes, entrypoint: str) -> None:
        problem = artifact_problem(artifact, entrypoint)
        if problem:
            raise ApiError(400, problem)

    def _capacity_problem(self, gpu_class: str | None, num_gpus: int) -> str | None:
        spec = self.classes.get(gpu_class)
        if spec is None:
            available = ", ".join(
                f"{s.name} (max {s.gpu_class.max_gpu_count_per_worker} GPUs/worker)" for s in self.classes.classes
            )
            return f"unknown gpu_class {gpu_class!r}; available GPU classes: {available}"
        limit = spec.gpu_class.max_gpu_count_per_worker
        if num_gpus > limit:
            return (
                f"num_gpus={num_gpus} exceeds GPU class {spec.name!r} (max_gpu_count_per_worker of {limit}); "
                f"request at most {limit} GPU{'' if limit == 1 else 's'} or pick another class ({self._class_limits()})"
            )
        return None

    def _class_limits(self) -> str:
        return ", ".join(f"{s.name}: {s.gpu_class.max_gpu_count_per_worker}" for s in self.classes.classes)

    def _version_row(self, name: str, version: str, namespace: str | None, scope: str | None, home: str) -> VersionRow:
        """The version a caller means (see ``namespaces``); 404 if never registered *or not the
        caller's to see*, with the same message either way so nothing leaks."""
        row = None
        if namespace is not None:
            if visible(scope, namespace):
                row = self.store.get_version(name, version, namespace)
        else:  # the admin named no namespace: its own first, else wherever it is
            row = self.store.get_version(name, version, home) or self.store.get_version(name, version, None)
        if row is None:
            raise ApiError(
                404, f"function version {name}@{version} not found; list versions with POST /v1/functions/list"
            )
        return row

    def _version(
        self,
        name: str,
        version: str,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> tuple[dict, bool, str]:
        """The version's definition, whether it is dropped, and its namespace; 404 if never registered."""
        row = self._version_row(name, version, namespace, scope, home)
        return json.loads(row.definition), row.dropped, row.namespace

    def describe_function(
        self,
        name: str,
        version: str,
        *,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        definition, dropped, _ = self._version(name, version, namespace, scope, home)
        if dropped:
            raise ApiError(404, f"function version {name}@{version} was dropped; register it again to restore it")
        return redact_definition(definition)  # exactly the FunctionVersion; lists and jobs name the namespace

    def function_artifact(
        self,
        name: str,
        version: str,
        *,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        """The version's artifact bytes (base64), so any process can run or diff it (`lookup`, `.local()`)."""
        self.describe_function(name, version, namespace=namespace, scope=scope, home=home)  # 404s, same messages
        row = self._version_row(name, version, namespace, scope, home)
        definition = json.loads(row.definition)["artifact"]
        data = base64.b64encode(row.artifact).decode("ascii")
        return {
            "name": name,
            "version": version,
            "entrypoint": definition["entrypoint"],
            "digest": definition["digest"],
            "encoding": "base64",
            "data": data,
        }

    def _one_namespace(self, name: str | None, namespace: str | None, scope: str | None, home: str) -> str | None:
        """The one namespace a history/diff request means: the caller's own, or for the admin the one
        it names, else its own if that has ``name``, else the first that does.  None when the caller
        may not see it (its replies are then those of an unknown name)."""
        if namespace is None and scope is None and name is not None:
            if not self.store.list_versions(name=name, after_seq=0, limit=1, namespace=home):
                first = self.store.list_versions(name=name, after_seq=0, limit=1)
                namespace = first[0][4] if first else None
        namespace = namespace or home
        return namespace if visible(scope, namespace) else None

    def _live_versions(
        self, name: str | None, namespace: str | None = DEFAULT_NAMESPACE
    ) -> dict[str, list[FunctionVersion]]:
        """Live versions (env values redacted) of one namespace by name, registration order."""
        grouped: dict[str, list[FunctionVersion]] = {}
        if namespace is None:
            return grouped
        for _, fname, _, definition, _ in self.store.list_versions(
            name=name, after_seq=0, limit=10**9, namespace=namespace
        ):
            grouped.setdefault(fname, []).append(FunctionVersion.from_wire(redact_definition(json.loads(definition))))
        return grouped

    def _source(self, name: str, version: str, namespace: str | None = DEFAULT_NAMESPACE) -> str:
        row = self.store.get_version(name, version, namespace)
        assert row is not None  # callers pass versions they just listed
        return row.artifact.decode("utf-8", errors="replace")

    def function_history(
        self,
        name: str | None,
        limit: int,
        *,
        namespace: str | None = None,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        """Each function's newest `limit` versions, newest first, with their one-line change (`versions`)."""
        from ..versions import history

        functions = []
        ns = self._one_namespace(name, namespace, scope, home)
        for fname, known in sorted(self._live_versions(name, ns).items()):
            shown = known[-(limit + 1) :]  # one more, so the oldest row shown still has a change line
            rows = history(fname, shown, [self._source(fname, fv.version, ns) for fv in shown])[:limit]
            functions.append(
                {
                    "name": fname,
                    "versions": [
                        {"version": r.version, "created_at": r.created_at, "change": r.change, "snippet": r.snippet}
                        for r in rows
                    ],
                }
            )
        if name is not None and not functions:
            raise ApiError(
                404, f"no function named {name!r} is registered; list functions with POST /v1/functions/list"
            )
        return {"functions": functions}

    def function_diff(
        self,
        name: str,
        old: str | None,
        new: str | None,
        *,
        namespace: str | None = None,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        """Source diff and runtime differences of two versions (`versions.diff_pair` picks them)."""
        from ..versions import VersionLookupError, diff_pair, diff_versions

        ns = self._one_namespace(name, namespace, scope, home)
        known = {fv.version: fv for fv in self._live_versions(name, ns).get(name, [])}
        try:
            old_id, new_id = diff_pair(name, list(known), old, new)
        except VersionLookupError as error:
            raise ApiError(404 if error.unknown else 400, str(error)) from None
        sources = [self._source(name, v, ns) for v in (old_id, new_id)]
        return diff_versions(known[old_id], known[new_id], *sources).to_wire()

    def list_functions(
        self,
        *,
        name: str | None,
        include_definition: bool,
        page_token: str | None,
        limit: int = 100,
        scope: str | None = None,
    ) -> dict:
        after = _decode_token(page_token) or 0
        limit = max(1, min(limit, PAGE_LIMIT_MAX))
        rows = self.store.list_versions(name=name, after_seq=after, limit=limit + 1, namespace=scope)
        reply: dict[str, Any] = {"functions": []}
        for _seq, fname, fversion, definition, owner in rows[:limit]:
            item: dict[str, Any] = {"name": fname, "version": fversion, "namespace": owner}
            if include_definition:
                item["definition"] = redact_definition(json.loads(definition))
            reply["functions"].append(item)
        if len(rows) > limit:
            reply["page_token"] = _encode_token(rows[limit - 1][0])
        return reply

    def drop_function(
        self,
        name: str,
        version: str,
        *,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> dict:
        with self._lock:
            _, dropped, owner = self._version(name, version, namespace, scope, home)
            if not dropped:
                self.store.set_dropped(name, version, True, owner)
            return {"dropped": not dropped}

    # --------------------------------------------------------------------- runs

    def run(
        self,
        name: str,
        version: str,
        rows: Any,
        timeout_s: float | None = None,
        *,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
        arrow_rows: Any = None,
        spec_extra: dict | None = None,
        rows_checked: bool = False,
    ) -> str:
        """Queue a job; it belongs to the function's namespace (whose env it runs with).
        ``arrow_rows``: the path of an Arrow IPC rows file (instead of JSON ``rows``): a body the
        route streamed to a temp file, or a client's upload; it is checked, then kept as the job's rows.
        A batch's chunk jobs pass ``spec_extra`` (batch_id, chunk, row_start: kept in the job's spec)
        and ``rows_checked`` (their rows were checked when the batch was created)."""
        definition, dropped, owner = self._version(name, version, namespace, scope, home)
        if dropped:
            raise ApiError(404, f"function version {name}@{version} was dropped; register it again to run it")
        fv = FunctionVersion.from_wire(definition)
        if arrow_rows is not None:
            rows = self._take_arrow_rows(fv, arrow_rows)
        elif not rows_checked:
            self._check_rows(fv, rows)
        if timeout_s is not None and not (
            isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0
        ):
            raise ApiError(400, "timeout_s must be a number of seconds > 0, or omitted for no timeout")
        resources = fv.runtime.resources
        if resources is None:
            where = _Resolved(None, 0, False)
        else:
            problem = self._capacity_problem(resources.gpu_class, resources.num_gpus)
            if problem:  # the config changed since registration
                raise ApiError(400, problem)
            spec = self.classes.get(resources.gpu_class)
            assert spec is not None  # _capacity_problem found the class
            where = _Resolved(spec.name, resources.num_gpus, spec.simulated)
        rows_total = rows["rows_total"] if isinstance(rows, dict) else len(rows)
        job_spec: dict[str, Any] = {"name": name, "version": version, "rows_total": rows_total}
        if timeout_s is not None:
            job_spec["timeout_s"] = timeout_s
        if isinstance(rows, dict):
            job_spec["rows_format"] = "arrow"
        if spec_extra:
            job_spec.update(spec_extra)
        with self._lock:
            rec = JobRecord(
                job_id=uuid.uuid4().hex,
                job_type="run_function",
                state=PENDING,
                creation_ms=_now_ms(),
                spec=job_spec,
                name=name,
                gpu_class=where.gpu_class,
                num_gpus=where.num_gpus,
                rows_total=rows_total,
                namespace=owner,
            )
            self._active[rec.job_id] = rec
            if not self._executor_queues:
                self._scheduler.enqueue(rec.job_id, where.gpu_class, where.num_gpus)
            try:
                with self.store.batch():
                    if self._executor_queues:
                        self._persist(rec, new=True, rows=rows)
                    else:
                        self.store.insert_job(rec, rows)  # its first event follows placement, below
            except BaseException:  # not stored: it must not linger in memory either
                self._active.pop(rec.job_id, None)
                self._scheduler.release(rec.job_id)
                self.data.remove_rows(rows)
                raise
            if self._executor_queues:
                if self._started:
                    self._launch(rec)
                self._publish_usage()
            else:
                # Place it before its first event, so a job that starts at once is never shown as
                # "waiting for GPU capacity": placed, its first event already carries its devices.
                self._dispatch(changed=where.num_gpus > 0)
                if self._scheduler.is_pending(rec.job_id):
                    self._persist(rec, new=False)
            return rec.job_id

    def _take_arrow_rows(self, fv: FunctionVersion, tmp: Any) -> dict:
        """Check an Arrow rows body (a temp file) and keep it under its final name; the rows ref
        stored in place of JSON rows: ``{"arrow_file": "rows/<uuid>.arrow", "rows_total": n}``."""
        tmp = os.fspath(tmp)
        _, final = self.data.new_rows_file()
        try:
            count = self.data.check_rows(tmp, fv.signature.inputs, f"{fv.name}@{fv.version}")
            os.replace(tmp, final)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return {"arrow_file": os.path.relpath(final, self.data.root), "rows_total": count}

    @staticmethod
    def _check_rows(fv: FunctionVersion, rows: Any) -> None:
        if not isinstance(rows, list) or not rows:
            raise ApiError(400, "rows must be a non-empty list of objects, one {param: value} object per call")
        expected = [p.name for p in fv.signature.inputs]
        wanted = set(expected)
        optional = {p.name for p in fv.signature.inputs if p.default is not None}  # the worker applies the default
        takes = [p.name if p.default is None else f"{p.name}={p.default}" for p in fv.signature.inputs]
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise ApiError(
                    400,
                    f"rows[{i}] must be an object mapping parameter names to values, e.g. {{{', '.join(repr(n) + ': ...' for n in expected)}}}",
                )
            keys = set(row)
            missing = [n for n in expected if n not in keys and n not in optional]
            unknown = sorted(keys - wanted)
            if missing or unknown:
                problems = []
                if missing:
                    problems.append(f"missing parameter(s) {', '.join(missing)}")
                if unknown:
                    problems.append(f"unknown parameter(s) {', '.join(unknown)}")
                raise ApiError(
                    400,
                    f"rows[{i}]: {' and '.join(problems)}; {fv.name}@{fv.version} takes ({', '.join(takes)})",
                )
            try:
                _dumps(row).encode("utf-8")
            except ValueError:
                raise ApiError(
                    400, f"rows[{i}] contains NaN or Infinity, which JSON cannot carry; use null or a finite number"
                ) from None

    # --------------------------------------------------------------------- jobs

    def _get_job(self, job_id: str, scope: str | None = None) -> JobRecord:
        rec = self._active.get(job_id) or self._unsaved.get(job_id)
        if rec is None:
            rec = self.store.get_job(job_id)
        if rec is None or not visible(scope, rec.namespace):  # another team's job: as if it did not exist
            raise ApiError(404, f"job {job_id} not found; list jobs with POST /v1/jobs/list")
        return rec

    def job_record(self, job_id: str) -> JobRecord | None:
        """A job as the core knows it now (memory first), or None."""
        with self._lock:
            return self._active.get(job_id) or self._unsaved.get(job_id) or self.store.get_job(job_id)

    def describe_job(self, job_id: str, scope: str | None = None) -> dict:
        with self._lock:
            return self._job_wire(self._get_job(job_id, scope))

    def list_jobs(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
        page_token: str | None = None,
        limit: int = 100,
        scope: str | None = None,
    ) -> dict:
        before = _decode_token(page_token)
        limit = max(1, min(limit, PAGE_LIMIT_MAX))
        with self._lock:
            recs = self.store.list_jobs(
                states=(state,) if state else None,
                name=name,
                job_type=job_type,
                before_seq=before,
                limit=limit + 1,
                namespace=scope,
            )
            # Memory is authoritative for active jobs (e.g. coalesced progress) and unsaved ones.
            current = [self._active.get(rec.job_id) or self._unsaved.get(rec.job_id) or rec for rec in recs[:limit]]
            jobs = [self._job_wire(rec) for rec in current if state is None or rec.state == state]
        reply: dict[str, Any] = {"jobs": jobs}
        if len(recs) > limit:
            reply["page_token"] = _encode_token(recs[limit - 1].seq or 0)  # stored records have a seq
        return reply

    def cancel_job(self, job_id: str, scope: str | None = None) -> dict:
        with self._lock:
            rec = self._get_job(job_id, scope)
            if rec.state in _TERMINAL:
                return {"job_id": job_id, "cancelled": False}
            was_placed = rec.state == IN_PROGRESS or not self._scheduler.is_pending(job_id)
            self._finish(rec, CANCELLED)
            if was_placed and self.executor is not None:
                try:
                    self.executor.cancel(job_id)
                except Exception:
                    log.exception("executor.cancel(%s) failed", job_id)
            return {"job_id": job_id, "cancelled": True}

    def job_logs(self, job_id: str, offset: int = 0, limit: int = 1000, scope: str | None = None) -> dict:
        with self._lock:
            self._get_job(job_id, scope)
        limit = max(1, min(limit, 10_000))
        entries = self.store.read_logs(job_id, max(0, offset), limit)
        lines = [line for _, _, line in entries]
        next_offset = entries[-1][0] + 1 if entries else max(0, offset)
        return {"lines": lines, "next_offset": next_offset}

    async def wait_job(
        self, job_id: str, timeout_s: float, scope: str | None = None, *, unless_queued: bool = False
    ) -> dict:
        """The job once terminal, or as it stands after ``timeout_s`` (long poll).
        ``unless_queued``: answer at once if it waits for capacity (``functions/run``'s inline
        wait: a submit must not stall behind a full queue)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            rec = self._get_job(job_id, scope)
            queued = unless_queued and rec.state == PENDING and self._scheduler.is_pending(job_id)
            if rec.state in _TERMINAL or timeout_s <= 0 or not self._started or queued:
                return self._job_wire(rec)
            future = loop.create_future()
            self._waiters.setdefault(job_id, []).append(future)
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters and future in waiters:
                    waiters.remove(future)
                    if not waiters:
                        del self._waiters[job_id]
        return self.describe_job(job_id)

    def _wake_waiters(self, job_id: str) -> None:
        futures = self._waiters.pop(job_id, None)
        if not futures or self._loop is None:
            return

        def wake() -> None:
            for future in futures:
                if not future.done():
                    future.set_result(None)

        try:
            self._loop.call_soon_threadsafe(wake)
        except RuntimeError:
            pass

    # ---------------------------------------------------------------- GPU info

    def gpu_classes(self) -> dict:
        # Every field, defaults included (docs/ARCHITECTURE.md, "REST API (v1)").
        return {"classes": [spec.gpu_class.model_dump(mode="json") for spec in self.classes.classes]}

    def gpu_usage(self) -> dict:
        with self._lock:
            return {"classes": self._usage()}

    def _usage(self) -> list[dict]:
        """GpuUsage per class: the scheduler's, or with an executor that queues (Ray) the
        GPUs it reports per class and the jobs it is running / holding."""
        if not self._executor_queues:
            return self._scheduler.usage()
        executor = self.executor
        assert executor is not None  # only an executor that queues gets here
        capacity = executor.capacity() or {}
        rows: dict[str, dict[str, Any]] = {
            spec.name: {
                "name": spec.name,
                "gpus_total": int(capacity.get(spec.name, 0)),
                "gpus_busy": 0,
                "jobs_running": 0,
                "jobs_pending": 0,
            }
            for spec in self.classes.classes
        }
        for rec in self._active.values():
            row = rows.get(rec.gpu_class or "") if rec.num_gpus else None
            if row is None:
                continue
            if rec.state == IN_PROGRESS:
                row["gpus_busy"] += rec.num_gpus
                row["jobs_running"] += 1
            else:
                row["jobs_pending"] += 1
                if "pending_reason" not in row:
                    reason = executor.pending_reason(rec.gpu_class, rec.num_gpus)
                    if reason:
                        row["pending_reason"] = reason
        return list(rows.values())

    # ------------------------------------------------------------------- events

    def events_after(self, seq: int, limit: int = 1000, scope: str | None = None) -> list[tuple[int, str]]:
        return self.store.events_after(seq, limit, namespace=scope)

    def last_event_seq(self) -> int:
        return self.store.last_event_seq()

    # ------------------------------------------------- executor callbacks (any thread)

    @_callback
    def task_started(self, job_id: str, *, devices: tuple[str, ...] = (), node: str | None = None) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            rec.state = IN_PROGRESS
            rec.started_ms = rec.started_ms or _now_ms()
            self._estimator.invalidate()  # its GPUs now free at started_ms + its run time
            rec.devices = tuple(devices) or rec.devices
            rec.node = node
            self._persist_soon(rec)
            if self._executor_queues and rec.num_gpus:
                self._publish_usage()

    @_callback
    def task_progress(self, job_id: str, rows_done: int) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            rec.rows_done = max(rec.rows_done, min(int(rows_done), rec.rows_total))
            now = time.monotonic()
            # Coalesce: a 10k-row map must not write 10k events; the last row always gets one, and a
            # count held back by the interval is sent when it ends (no stale count while a slow row runs).
            since = now - self._progress_emitted.get(job_id, 0.0)
            if rec.rows_done == rec.rows_total or since >= PROGRESS_EVENT_INTERVAL_S:
                self._progress_emitted[job_id] = now
                self._progress_held.discard(job_id)
                self._persist_soon(rec)
            elif job_id not in self._progress_held and self._loop is not None:
                self._progress_held.add(job_id)
                delay = PROGRESS_EVENT_INTERVAL_S - since
                self._loop.call_soon_threadsafe(self._loop.call_later, delay, self._flush_progress, job_id)

    def _flush_progress(self, job_id: str) -> None:
        """Publish a progress count the coalescing interval held back (runs on the event loop)."""
        with self._lock:
            if job_id not in self._progress_held:
                return
            self._progress_held.discard(job_id)
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            self._progress_emitted[job_id] = time.monotonic()
            self._persist(rec, new=False)

    @_callback
    def task_log(self, job_id: str, stream: str, lines: list[str]) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            self._append_log(rec, _clean_text(str(stream)), [_clean_text(str(line)) for line in lines])

    @_callback
    def task_succeeded(self, job_id: str, results: list | Mapping[str, Any]) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            problem = None
            if isinstance(results, Mapping) and "result_file" in results:
                problem = self._take_arrow_result(rec, results)
            elif not isinstance(results, list) or len(results) != rec.rows_total:
                problem = f"the worker returned {len(results) if isinstance(results, list) else 'no list of'} results for {rec.rows_total} rows"
            else:
                try:
                    _dumps(results).encode("utf-8")
                except UnicodeEncodeError:
                    problem = "a result contains a string with a lone surrogate, which is not valid Unicode; return valid text"
                except (TypeError, ValueError) as error:
                    problem = f"a result is not JSON ({error}); return numbers, strings, lists, dicts or None (NaN/Infinity are not JSON)"
            if problem:
                rec.failure = JobFailure(phase="result", message=problem).to_wire()
                self._finish(rec, FAILED)
            else:
                if isinstance(results, list):
                    rec.result = results
                rec.rows_done = rec.rows_total
                self._finish(rec, DONE)
                if not isinstance(results, list):
                    self._result_arrivals += 1
                    if self._result_arrivals % 16 == 1:  # a directory scan: not on every result
                        self._enforce_retention()

    def _take_arrow_result(self, rec: JobRecord, ref: Mapping[str, Any]) -> str | None:
        """An executor wrote the job's result as an Arrow IPC file: reference it from the job
        (``rec.result = {"arrow": {...}}``; JSON results are always lists). A problem or None."""
        path = self.data.result_path(rec.job_id)
        if os.fspath(ref["result_file"]) != os.fspath(path) or not path.exists():
            return f"the worker reported a result file that is not there ({ref['result_file']})"
        rec.result = {"arrow": {"nbytes": int(ref.get("nbytes", 0)), "summary": dict(ref.get("summary") or {})}}
        return None

    def _enforce_retention(self) -> None:
        """Remove results past the retention rule; their jobs say so (``result_expired``)."""
        for job_id in self.data.enforce_retention():
            rec = self._unsaved.get(job_id) or self.store.get_job(job_id)
            if rec is None or not isinstance(rec.result, dict) or "arrow" not in rec.result:
                continue
            rec.result = {"arrow": {**rec.result["arrow"], "expired": True}}
            try:
                self._persist(rec, new=False)
            except Exception:
                log.exception("could not mark job %s's result as expired", job_id)

    def result_file(self, job_id: str, scope: str | None = None) -> tuple[str | None, Any]:
        """(path of the Arrow IPC result, None) or (None, JSON results) of a DONE job
        (``scope``: the caller's namespace; another team's job is a 404, as everywhere)."""
        with self._lock:
            rec = self._get_job(job_id, scope)
        if rec.state != DONE:
            raise ApiError(409, f"job {job_id} is {rec.state}, not DONE; wait for it with POST /v1/jobs/wait")
        if not (isinstance(rec.result, dict) and "arrow" in rec.result):
            return None, rec.result
        path = self.data.result_path(job_id)
        recorded = rec.result["arrow"].get("nbytes")
        if path.exists() and recorded and path.stat().st_size != recorded:
            raise ApiError(
                410,
                f"the result file of job {job_id} is incomplete (the machine lost power before it reached the "
                "disk; start the server with --result-fsync to prevent this); run the function again",
                code="gone",
            )
        if rec.result["arrow"].get("expired") or not path.exists():
            raise ApiError(
                410,
                f"the result of job {job_id} was removed by the retention rule (--result-max-age-days / "
                "--result-max-bytes); run the function again",
                code="gone",
            )
        return str(path), None

    @_callback
    def task_failed(self, job_id: str, failure: JobFailure | Mapping[str, Any]) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None or rec.state in _TERMINAL:
                return
            if isinstance(failure, JobFailure):
                wire = failure.to_wire()
            else:
                try:
                    wire = JobFailure.from_wire(failure).to_wire()
                except ValidationError:
                    wire = JobFailure(phase="executor", message=f"worker failed: {str(failure)[:2000]}").to_wire()
            env = [self._job_env.get(job_id, {})]
            wire = {k: _clean_text(redact_env(v, env)) if isinstance(v, str) else v for k, v in wire.items()}
            rec.failure = wire
            self._finish(rec, TIMED_OUT if wire["phase"] == "timeout" else FAILED)

    def _fail_after_error(self, job_id: str) -> None:
        with self._lock:
            rec = self._active.get(job_id)
            if rec is None:
                return
            rec.failure = JobFailure(
                phase="executor",
                message="the control plane could not record this job's progress; see the server log",
                retryable=True,
            ).to_wire()
            try:
                self._finish(rec, FAILED)
            except Exception:
                log.exception("could not fail job %s either; dropping it from memory", job_id)
                self._active.pop(job_id, None)
                self._job_env.pop(job_id, None)
                self._scheduler.release(job_id)
                self._wake_waiters(job_id)
        if self.executor is not None:
            try:
                self.executor.cancel(job_id)
            except Exception:
                log.exception("executor.cancel(%s) failed", job_id)

    # ---------------------------------------------------------------- internals

    def _finish(self, rec: JobRecord, state: str) -> None:
        """Move an active job to a terminal state, free its devices and start what can run."""
        rec.state = state
        rec.finished_ms = _now_ms()
        self._estimator.invalidate()
        if state == DONE:
            rec.failure = None
            self._note_run_time(rec)
        had_devices = bool(self._scheduler.release(rec.job_id)) or bool(rec.devices)
        if rec.spec.get("rows_format") == "arrow":  # the rows file is done with; JSON rows stay in SQLite
            self.data.remove_rows(self.store.get_rows(rec.job_id))
        self._active.pop(rec.job_id, None)
        self._log_pos.pop(rec.job_id, None)
        self._job_env.pop(rec.job_id, None)
        self._progress_emitted.pop(rec.job_id, None)
        self._progress_held.discard(rec.job_id)
        self._persist(rec, new=False)
        self._wake_waiters(rec.job_id)
        self._dispatch(changed=had_devices or rec.num_gpus > 0)

    def _dispatch(self, changed: bool = False) -> bool:
        """Place and launch every job that fits now; returns whether anything was placed.

        ``changed``: the caller altered GPU queues/holdings, so a ``usage`` event is due even
        when nothing new is placed.
        """
        if not self._started:
            return False
        placements = self._scheduler.schedule()
        if not placements:
            if changed:
                self._publish_usage()
            return False
        self._estimator.invalidate()
        launches = []
        for placement in placements:
            rec = self._active[placement.job_id]
            rec.devices = placement.devices
            launches.append(rec)
            # Committed with the job's next change (a quick job: with its outcome); a placement
            # lost in a crash re-queues the job, like any job that had started.
            self._persist_soon(rec)
        self._publish_usage()
        for rec in launches:
            self._launch(rec)
        return True

    def _launch(self, rec: JobRecord) -> None:
        try:
            if self.executor is None:
                raise RuntimeError("no executor is configured")
            row = self.store.get_version(rec.spec["name"], rec.spec["version"], rec.namespace)
            if row is None:
                raise RuntimeError(f"function version {rec.spec['name']}@{rec.spec['version']} vanished from the store")
            fv = json.loads(row.definition)
            runtime = fv.get("runtime", {})
            spec = self.classes.get(rec.gpu_class) if rec.gpu_class else None
            rows = self.store.get_rows(rec.job_id)
            task = TaskSpec(
                job_id=rec.job_id,
                name=rec.spec["name"],
                version=rec.spec["version"],
                artifact=row.artifact,
                entrypoint=fv["artifact"]["entrypoint"],
                rows=[] if isinstance(rows, dict) else rows,
                devices=rec.devices,
                simulated=bool(spec and spec.simulated),
                gpu_class=rec.gpu_class,
                num_gpus=rec.num_gpus,
                env=dict(runtime.get("env") or {}),
                packages=tuple((runtime.get("environment") or {}).get("packages", ())),
                timeout_s=rec.spec.get("timeout_s"),
                namespace=rec.namespace,
                data=self._task_data(rec, fv, rows),
            )
            self._job_env[rec.job_id] = task.env  # to redact from its failure messages
            self.executor.launch(task)
        except Exception as error:  # the job fails; the server keeps serving
            log.exception("launching job %s failed", rec.job_id)
            if rec.job_id in self._active:
                message = redact_env(f"could not start a worker: {error}", [self._job_env.get(rec.job_id, {})])
                rec.failure = JobFailure(phase="executor", message=message, retryable=True).to_wire()
                self._finish(rec, FAILED)

    def _task_data(self, rec: JobRecord, fv: dict, rows: Any) -> dict:
        """The worker protocol's data-plane fields of a task (docs/ARCHITECTURE.md)."""
        signature = fv.get("signature") or {}
        data: dict[str, Any] = {
            "input_types": {p["name"]: p["arrow_type"] for p in signature.get("inputs", ())},
            "output_type": (signature.get("output") or {}).get("arrow_type"),
            "result_file": str(self.data.result_path(rec.job_id)),
            "result_fsync": self.data.fsync,
            "rows_total": rec.rows_total,
        }
        if isinstance(rows, dict):
            data["rows_file"] = str(self.data.rows_path(rows))
        return data

    def _append_log(self, rec: JobRecord, stream: str, lines: list[str]) -> None:
        pos = self._log_pos.get(rec.job_id)
        if pos is None:
            pos = self.store.next_log_pos(rec.job_id)
        if pos >= MAX_LOG_LINES_PER_JOB:
            return
        room = MAX_LOG_LINES_PER_JOB - pos
        clipped = [
            line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS] + "…" for line in lines[:room]
        ]
        if len(lines) > room:
            clipped[-1] = f"[lancefn] log truncated after {MAX_LOG_LINES_PER_JOB} lines"
        self._log_pos[rec.job_id] = self.store.append_logs(rec.job_id, pos, stream, clipped)

    def _persist(self, rec: JobRecord, *, new: bool, rows: list | None = None, event: bool = True) -> None:
        """Write the job and its event in one transaction, and publish the event once committed.

        A change to a known job that the full disk refuses is kept in memory and retried (see
        ``UnsavedJobs.keep``) instead of raising, unless an enclosing batch (whose caller decides)
        is open.  A new job is never kept that way: its request gets the 507."""
        data = _dumps(self._job_wire(rec)) if event else None
        earlier = self._deferred.pop(rec.job_id, [])  # committed with this change, in order
        try:
            with self.store.batch():
                if new:
                    self.store.insert_job(rec, rows)
                else:
                    self.store.update_job(rec)
                for item in earlier + [data] if data is not None else earlier:
                    self._insert_event(rec.job_id, item, rec.namespace)
        except Exception as error:
            if new or not is_storage_full(error) or self.store.in_batch():
                if earlier:
                    self._deferred[rec.job_id] = earlier
                raise
            self._unsaved.keep(rec, data)
            return
        self._unsaved.saved(rec.job_id)  # its latest state is saved now
        if "batch_id" in rec.spec:
            self.batches.on_job(rec)

    def _insert_event(self, job_id: str, data: str, namespace: str) -> None:
        seq = self.store.insert_event(job_id, data, namespace)
        self.store.after_commit(lambda: self.bus.publish("job", seq, data, namespace))

    def _persist_soon(self, rec: JobRecord) -> None:
        """Record an executor-reported change now and commit it with the job's next change, or
        after ``DEFER_COMMIT_S`` (batched state commits; lock held)."""
        if self._loop is None:
            self._persist(rec, new=False)
            return
        pending = self._deferred.setdefault(rec.job_id, [])
        pending.append(_dumps(self._job_wire(rec)))
        if len(pending) == 1:
            self._loop.call_soon_threadsafe(self._loop.call_later, DEFER_COMMIT_S, self._flush_deferred, rec.job_id)

    def _flush_deferred(self, job_id: str) -> None:
        """Commit a job's deferred changes that no later change has committed (event loop, shutdown)."""
        with self._lock:
            if job_id not in self._deferred:
                return
            rec = self._active.get(job_id)
            if rec is None:  # gone without a commit of its own (cannot happen today); drop quietly
                self._deferred.pop(job_id)
                return
            self._persist(rec, new=False, event=False)

    def queue_snapshot(self, scope: str | None = None) -> dict | None:
        """The `queue` event payload now as ``scope`` sees it (None when the executor owns queuing, as Ray does)."""
        if self._executor_queues:
            return None
        with self._lock:
            payload = self._queue_payload(estimates=True)
            return queue_view(payload, self._queue_owners(payload), scope)

    def _queue_owners(self, payload: dict) -> dict[str, str]:
        """Namespace of each job a `queue` payload lists (to render it per subscriber's scope)."""
        return {
            job_id: rec.namespace
            for ids in payload["classes"].values()
            for job_id in ids
            if (rec := self._active.get(job_id))
        }

    def _publish_queue(self, payload: dict) -> None:
        # Each namespace sees the others' queued jobs as null (positions count them; ids don't leak).
        owners = self._queue_owners(payload)
        self.bus.publish("queue", None, lambda scope: _dumps(queue_view(payload, owners, scope)))

    def _queue_payload(self, *, estimates: bool = False) -> dict:
        """The `queue` event. Expected starts ride along at most every QUEUE_ESTIMATES_INTERVAL_S (a busy
        queue moves hundreds of times a second); a skipped update is sent by a trailing event."""
        heads = self._scheduler.queue_heads(QUEUE_HEAD_EVENT_LEN)
        payload: dict[str, Any] = {"classes": heads}
        now = time.monotonic()
        if estimates or now - self._estimates_sent >= QUEUE_ESTIMATES_INTERVAL_S:
            self._estimates_sent = now
            payload["expected_start_ms"] = {
                job_id: self._expected_start(job_id) for ids in heads.values() for job_id in ids
            }
        elif self._estimates_timer is None:
            self._estimates_timer = threading.Timer(QUEUE_ESTIMATES_INTERVAL_S, self._publish_estimates)
            self._estimates_timer.daemon = True
            self._estimates_timer.start()
        return payload

    def _publish_estimates(self) -> None:
        with self._lock:
            self._estimates_timer = None
            if self._started and not self._executor_queues:
                self._publish_queue(self._queue_payload(estimates=True))

    def _note_run_time(self, rec: JobRecord) -> None:
        if (
            rec.job_type == "run_function"
            and rec.gpu_class
            and rec.started_ms is not None
            and rec.finished_ms is not None
        ):
            self._estimator.run_times.record(
                rec.spec.get("name", ""), rec.spec.get("version", ""), rec.gpu_class, rec.finished_ms - rec.started_ms
            )

    def _expected_start(self, job_id: str) -> int | None:
        """When a queued GPU job should start (epoch ms), or None when unknown (see `estimates`)."""
        with self._lock:
            rec = self._active.get(job_id)
            pool = self._scheduler.pools.get(rec.gpu_class or "") if rec is not None else None
            if pool is None or job_id not in pool.queue:
                return None
            return self._estimator.expected_start(_now_ms(), pool, job_id, self._active)

    def _publish_usage(self) -> None:
        self.bus.publish("usage", None, _dumps({"classes": self._usage()}))
        if not self._executor_queues:
            # When the queue moves, every job behind moves up without an event of its own (one per
            # job would cost O(queue) writes per start): UIs re-number pending jobs (and re-read
            # their expected start) from this.
            self._publish_queue(self._queue_payload())

    def _job_wire(self, rec: JobRecord) -> dict:
        """The Job wire form, built without pydantic for speed. Placement and progress carry every
        field (docs/ARCHITECTURE.md, "REST API (v1)"; the side panel and other tools read them without defaults)."""
        placement: dict[str, Any] = {
            "gpu_class": rec.gpu_class,
            "num_gpus": rec.num_gpus or 0,
            "devices": list(rec.devices or ()),
            "waiting_on_capacity": False,
            "queue_position": None,
            "expected_start_ms": None,
        }
        if rec.state == PENDING:
            # Queued (not yet placed): waiting for its class's GPUs, or a CPU slot.
            position = self._scheduler.queue_position(rec.job_id)
            if position is not None:
                placement["waiting_on_capacity"] = True
                placement["queue_position"] = position
                if rec.num_gpus:
                    placement["expected_start_ms"] = self._expected_start(rec.job_id)
            elif self._executor_queues and not rec.devices:
                placement["waiting_on_capacity"] = True  # queued in the executor (Ray): no positions
                reason = self.executor.pending_reason(rec.gpu_class, rec.num_gpus) if self.executor else None
                if reason:
                    placement["pending_reason"] = reason
        if rec.node is not None:
            placement["node"] = rec.node
        progress = {"rows_done": rec.rows_done or 0, "rows_total": rec.rows_total or 0}
        wire: dict[str, Any] = {
            "job_id": rec.job_id,
            "namespace": rec.namespace,
            "job_type": rec.job_type,
            "job_state": rec.state,
            "creation_ms": rec.creation_ms,
            "placement": placement,
            "progress": progress,
        }
        if rec.started_ms is not None:
            wire["started_ms"] = rec.started_ms
        if rec.finished_ms is not None:
            wire["finished_ms"] = rec.finished_ms
        if rec.spec:
            wire["spec"] = rec.spec
        if isinstance(rec.result, dict) and "arrow" in rec.result:
            # The result is an Arrow IPC file: GET /v1/jobs/result streams it; the job shows a summary.
            arrow = rec.result["arrow"]
            wire["result_format"] = "arrow"
            wire["result_summary"] = {**arrow.get("summary", {}), **({"expired": True} if arrow.get("expired") else {})}
        elif rec.result is not None:
            wire["result"] = rec.result
        if rec.failure is not None:
            wire["failure"] = rec.failure
        return wire
