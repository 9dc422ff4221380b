"""Job changes a full disk refused: kept in memory, served to reads and the event stream, and saved
once space frees (docs/ARCHITECTURE.md, "REST details": a full disk).

One small class so the journal says only "keep this" and "it is saved now"; the retry
timer, the oldest-first save and the last try at shutdown live here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from lancefn_jupyter.server.storage.store import JobRecord, Store, is_storage_full

if TYPE_CHECKING:
    from lancefn_jupyter.server.control.events import EventBus
    from lancefn_jupyter.server.control.jobtable import TableLock

log = logging.getLogger("lancefn.server")  # operators filter on it

UNSAVED_RETRY_S = 1.0  # how often changes a full disk refused are tried again


class UnsavedJobs:
    """Jobs whose latest state is only in memory. Every method runs with the job table's lock held
    (``lock`` is that re-entrant lock; the retry timer takes it)."""

    def __init__(
        self,
        store: Store,
        bus: EventBus,
        lock: TableLock,
        wire: Callable[[JobRecord], str],
        running: Callable[[], bool],
        retry_s: float = UNSAVED_RETRY_S,
    ) -> None:
        self._store, self._bus, self._lock, self._wire, self._running = store, bus, lock, wire, running
        self._retry_s = retry_s
        self._jobs: dict[str, JobRecord] = {}
        self._timer: threading.Timer | None = None

    def get(self, job_id: str) -> JobRecord | None:
        return self._jobs.get(job_id)

    def saved(self, job_id: str) -> None:
        """The job's latest state reached the disk by another path."""
        self._jobs.pop(job_id, None)

    def keep(self, rec: JobRecord, data: str | None = None) -> None:
        """The disk is full: keep the job's latest state in memory (reads, waits and the event
        stream see it; a finished job does not look IN_PROGRESS nor run again after a restart
        once saved) and save it when space frees."""
        if rec.job_id not in self._jobs:
            log.error(
                "job %s is %s but the disk is full; kept in memory and saved once space frees", rec.job_id, rec.state
            )
        self._jobs[rec.job_id] = rec
        self._bus.publish("job", None, data or self._wire(rec), rec.namespace)  # live only: no sequence number
        self._arm()

    def cancel_retry(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self._retry_s, self.save)
            self._timer.daemon = True
            self._timer.start()

    def save(self, *, retry: bool = True) -> None:
        """Save what the full disk refused, oldest first; try again later while it is full.
        ``retry=False``: the last try, at shutdown (what is still unsaved then is re-queued by the
        next start, like any job that was running)."""
        with self._lock:
            self._timer = None
            if retry and not self._running():
                return  # stopped meanwhile: shutdown made the last try
            for job_id, rec in list(self._jobs.items()):
                data = self._wire(rec)
                try:
                    with self._store.batch():
                        self._store.save_job(rec)  # inserted if its first save was refused (a deferred new job)
                        seq = self._store.insert_event(job_id, data, rec.namespace)
                except Exception as error:
                    if not is_storage_full(error):
                        log.exception("could not save job %s", job_id)
                    if retry:
                        self._arm()
                    return
                del self._jobs[job_id]
                self._bus.publish("job", seq, data, rec.namespace)
                log.info("job %s (%s) saved now that the disk has room", job_id, rec.state)
