"""The job table: the state every control-plane part shares (docs/ARCHITECTURE.md, "Package
layout"): the one re-entrant lock, the active jobs, the scheduler's queues and holdings, the
event loop, the launched jobs' env, whether the plane has started, and the executor.  Runs in
the control plane.

Why one object: the parts (journal, queries, reports, intake, machine, callbacks, batches) read
and change this state together under ``lock``; handing each part the table, rather than the
composition root, says exactly what they share and nothing more. What several parts do to it
alike is a method of the table (a job leaving it, its worker stopped).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lancefn_jupyter.server.executors.base import Executor
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.storage.store import JobRecord

log = logging.getLogger("lancefn.server")


class TableLock:
    """The job table's re-entrant lock, which also knows how long its waiters have waited: a batch's slices end
    early once one has waited ``grace_s`` while the holder held it, so that another team's request waits for about
    that plus one chunk per holder ahead of it, not a whole slice (docs/ARCHITECTURE.md, "Batches"). Used as a
    context manager, or by the event loop through :meth:`acquire_now`.

    Why a grace and not "any waiter": on a busy server the lock always has one (a batch's own chunk jobs take it
    for a moment as each finishes, the event loop, other requests); ending every slice for them made a batch of
    trivial chunks submit one chunk per transaction, about twice the time per chunk. And why counted from the
    holder's start: a waiter that waited behind earlier holders would otherwise cut every later holder's slice to
    one chunk, the same convoy."""

    __slots__ = ("_count", "_depth", "_held_since", "_lock", "_since", "grace_s")

    GRACE_S = 0.0005

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()  # ``_since`` changes on several threads
        self._since: list[float] = []  # when each thread waiting now began, oldest first
        self._depth = 0  # the holder's re-entries (only the holder changes it)
        self._held_since = 0.0  # when the holder took the lock (its outermost hold)
        self.grace_s = grace_s

    @property
    def waiting(self) -> int:
        """How many threads wait for the lock now."""
        return len(self._since)

    def overdue(self) -> bool:
        """Whether a thread has waited ``grace_s`` or longer while the holder (the caller) held the lock."""
        with self._count:
            oldest = self._since[0] if self._since else None
        return oldest is not None and time.monotonic() - max(oldest, self._held_since) >= self.grace_s

    def acquire_now(self) -> bool:
        """Take the lock only if no other thread holds it (the event loop never waits for it); True when taken, to
        :meth:`release` then."""
        if not self._lock.acquire(blocking=False):
            return False
        if not self._depth:
            self._held_since = time.monotonic()
        self._depth += 1
        return True

    def __enter__(self) -> TableLock:
        if not self._lock.acquire(blocking=False):
            with self._count:  # read under it, so ``_since`` stays oldest first
                began = time.monotonic()
                self._since.append(began)
            try:
                self._lock.acquire()
            finally:
                with self._count:
                    self._since.remove(began)
        if not self._depth:
            self._held_since = time.monotonic()
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        self._depth -= 1
        self._lock.release()


class ActiveJobs(dict[str, JobRecord]):
    """The PENDING and IN_PROGRESS jobs by id, counting each namespace's own jobs (a batch's chunk jobs are its
    batch's: "Batches") as they come and go, so the queued-jobs quota is read in O(1) (docs/ARCHITECTURE.md,
    "Scheduling"). Jobs are added by ``[job_id] = rec`` and removed by ``pop`` only."""

    __slots__ = ("own",)

    def __init__(self) -> None:
        super().__init__()
        self.own: dict[str, int] = {}  # namespace → its unfinished jobs (a plain dict: cheaper than a Counter)

    def __setitem__(self, job_id: str, rec: JobRecord) -> None:
        if job_id not in self and "batch_id" not in rec.spec:
            self.own[rec.namespace] = self.own.get(rec.namespace, 0) + 1
        super().__setitem__(job_id, rec)

    def pop(self, job_id: str, default: JobRecord | None = None) -> JobRecord | None:  # type: ignore[override]
        rec = super().pop(job_id, None)
        if rec is None:
            return default
        if "batch_id" not in rec.spec:
            left = self.own[rec.namespace] - 1
            if left:
                self.own[rec.namespace] = left
            else:
                del self.own[rec.namespace]
        return rec


@dataclass(eq=False)
class JobTable:
    """Every field is read and changed with ``lock`` held (executor callbacks take it on their own
    threads; requests on core threads)."""

    scheduler: SchedulerState
    executor: Executor | None
    lock: TableLock = field(default_factory=TableLock)
    active: ActiveJobs = field(default_factory=ActiveJobs)  # PENDING and IN_PROGRESS jobs; the store has the rest
    job_env: dict[str, dict[str, str]] = field(default_factory=dict)  # launched jobs' function env (never logged)
    # PENDING jobs waiting for their version's environment to build (``environments.py``): the pending reason
    # their wire form shows ("building environment (2 packages, 12 s so far)"); they hold no place in a queue.
    environment_waits: dict[str, Callable[[], str]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None  # the server's event loop, once serving
    started: bool = False  # recovered and placing jobs; False again once stopping

    @property
    def executor_name(self) -> str:
        return self.executor.name if self.executor is not None else "none"

    def drop(self, job_id: str) -> bool:
        """The job leaves the table (it finished, or was never saved): no longer active, its env forgotten, its
        devices or its queue place released. Whether it held devices."""
        self.active.pop(job_id, None)
        self.job_env.pop(job_id, None)
        return bool(self.scheduler.release(job_id))

    def stop_worker(self, job_id: str) -> None:
        """Have the executor stop the job's worker, if any (the job is no longer active); a failure goes to the log."""
        if self.executor is not None:
            try:
                self.executor.cancel(job_id)
            except Exception:
                log.exception("executor.cancel(%s) failed", job_id)
