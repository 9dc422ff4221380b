"""The job table: the state every control-plane part shares (docs/ARCHITECTURE.md, "Package
layout"): the one re-entrant lock, the active jobs, the scheduler's queues and holdings, the
event loop, the launched jobs' env, whether the plane has started, and the executor.  Runs in
the control plane.

Why one plain object: the parts (journal, queries, reports, machine, callbacks, batches) read
and change this state together under ``lock``; handing each part the table, rather than the
composition root, says exactly what they share and nothing more.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from lancefn_jupyter.server.executors.base import Executor
from lancefn_jupyter.server.policy.scheduler import SchedulerState
from lancefn_jupyter.server.storage.store import JobRecord


class TableLock:
    """The job table's re-entrant lock, which also counts the threads waiting for it: a batch's slices end
    early while any does, so that another team's request waits for one chunk, not a whole slice
    (docs/ARCHITECTURE.md, "Batches"). Only ever used as a context manager."""

    __slots__ = ("_count", "_lock", "waiting")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()  # ``waiting`` changes on several threads
        self.waiting = 0

    def __enter__(self) -> TableLock:
        if not self._lock.acquire(blocking=False):
            with self._count:
                self.waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._count:
                    self.waiting -= 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@dataclass(eq=False)
class JobTable:
    """Every field is read and changed with ``lock`` held (executor callbacks take it on their own
    threads; requests on core threads)."""

    scheduler: SchedulerState
    executor: Executor | None
    lock: TableLock = field(default_factory=TableLock)
    active: dict[str, JobRecord] = field(default_factory=dict)  # PENDING and IN_PROGRESS jobs; the store has the rest
    job_env: dict[str, dict[str, str]] = field(default_factory=dict)  # launched jobs' function env (never logged)
    # PENDING jobs waiting for their version's environment to build (``environments.py``): the pending reason
    # their wire form shows ("building environment (2 packages, 12 s so far)"); they hold no place in a queue.
    environment_waits: dict[str, Callable[[], str]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None  # the server's event loop, once serving
    started: bool = False  # recovered and placing jobs; False again once stopping

    @property
    def executor_queues(self) -> bool:
        """The executor queues and places jobs itself (Ray): the plane launches them at once,
        bypassing the scheduler, and they stay PENDING until the executor reports them started."""
        return bool(getattr(self.executor, "owns_queue", False))

    @property
    def executor_name(self) -> str:
        return self.executor.name if self.executor is not None else "none"
