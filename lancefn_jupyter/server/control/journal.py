"""The job journal: every job change is written with its event in one transaction and published
once committed; executor-reported changes are deferred briefly so a quick job's states share one
commit; log lines are clipped and appended.  Runs in the control plane, with the job table's lock held.

The journal is where job changes are announced: ``watchers`` hear of every change once it is
saved (batches follow their chunk jobs), ``forgetters`` of every job that finished (executor
callbacks drop its progress coalescing).  ``plane.py`` registers them, so no part calls another
through the composition root."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.server.control.events import EventBus
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.loop_calls import call_on_loop
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.states import TERMINAL
from lancefn_jupyter.server.control.unsaved import UnsavedJobs
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.storage.store import JobRecord, Store, is_storage_full

log = logging.getLogger("lancefn.server")

MAX_LOG_LINES_PER_JOB = 20_000
MAX_LOG_LINE_CHARS = 8_192
# A placement, start or progress change waits this long for the job's next change before it is
# committed, so a quick job's states (placed, started, last row, done) share one commit. A job
# not yet saved as placed or started is re-queued after a crash, like a running one: nothing
# acknowledged as finished is lost.
DEFER_COMMIT_S = 0.01


@dataclass(frozen=True)
class _Change:
    """One job's save (``JobJournal._take``): the record, insert or update, its rows, its new event, and the
    deferred insert and events it takes along."""

    rec: JobRecord
    new: bool
    rows: list | None
    data: str | None
    pending: list | None
    earlier: list[str]
    since: float | None


class JobJournal:
    def __init__(self, table: JobTable, *, store: Store, bus: EventBus, reports: Reports, unsaved: UnsavedJobs):
        self.table, self.store, self.bus, self.reports, self.unsaved = table, store, bus, reports, unsaved
        self.watchers: list[Callable[[JobRecord], None]] = []  # each saved change, in order
        self.forgetters: list[Callable[[str], None]] = []  # each job that finished, by id
        self._deferred: dict[str, list[str]] = {}  # job id → events of changes not committed yet
        self._deferred_at: dict[str, float] = {}  # job id → when its first uncommitted change came
        self._flush_armed = False  # one timer for every deferred job: no loop wake-up per job
        self._log_pos: dict[str, int] = {}
        self._uninserted: dict[str, list] = {}  # job id → its JSON rows: a new job not inserted yet

    def persist(
        self, rec: JobRecord, *, new: bool, rows: list | None = None, event: bool = True, wire: dict | None = None
    ) -> None:
        """Write the job and its event in one transaction, and publish the event once committed.

        A change to a known job that the full disk refuses is kept in memory and retried (see
        ``UnsavedJobs.keep``) instead of raising, unless an enclosing batch (whose caller decides)
        is open.  A new job is never kept that way: its request gets the 507.  A new job whose insert
        waits (``insert_with_first_commit``) is inserted by its first persist; one that already ended is kept that way too
        (its request is answered with its outcome, not its id alone). ``wire``: the job's wire form, when the caller
        built it already."""
        data = dumps(wire if wire is not None else self.reports.job_wire(rec)) if event else None
        change = self._take(rec, new, rows, data)
        try:
            with self.store.batch():
                self._write(change)
        except Exception as error:
            ended_new = change.pending is not None and rec.state in TERMINAL
            if not is_storage_full(error) or self.store.in_batch() or (change.new and not ended_new):
                self._restore(change)
                raise
            self.unsaved.keep(rec, change.data)  # inserted by its save once space frees (``Store.save_job``)
            return
        self._saved(rec)

    def persist_many(self, recs: list[JobRecord]) -> None:
        """Commit several jobs' deferred changes (a deferred new job's insert among them) in one transaction:
        the new jobs of several requests, saved before their ids are answered (``Intake.save_group``). If it
        fails, none is saved and each keeps its deferred changes; the error is the caller's."""
        changes = [self._take(rec, False, None, None) for rec in recs]
        try:
            with self.store.batch():
                for change in changes:
                    self._write(change)
        except BaseException:
            for change in changes:
                self._restore(change)
            raise
        for rec in recs:
            self._saved(rec)

    def _take(self, rec: JobRecord, new: bool, rows: list | None, data: str | None) -> _Change:
        """What saving ``rec`` now writes: its deferred changes are taken along (given back by ``_restore``)."""
        pending = self._uninserted.pop(rec.job_id, None)  # JSON rows: never empty, never None
        if pending is not None:  # its rows only matter while it may still run (after a restart)
            new, rows = True, None if rec.state in TERMINAL else pending
        earlier = self._deferred.pop(rec.job_id, [])  # committed with this change, in order
        since = self._deferred_at.pop(rec.job_id, None)
        return _Change(rec, new, rows, data, pending, earlier, since)

    def _write(self, change: _Change) -> None:
        rec = change.rec
        if change.new:
            self.store.insert_job(rec, change.rows)
        else:
            self.store.update_job(rec)
        items = change.earlier if change.data is None else [*change.earlier, change.data]
        if items:
            self._insert_events(rec.job_id, items, rec.namespace)

    def _restore(self, change: _Change) -> None:
        """A change that was not saved: what it took along is deferred again."""
        job_id = change.rec.job_id
        if change.pending is not None:
            self._uninserted[job_id] = change.pending  # still to insert
        if change.earlier or change.pending is not None:
            self._deferred[job_id] = change.earlier
            self._deferred_at[job_id] = change.since if change.since is not None else time.monotonic()

    def _saved(self, rec: JobRecord) -> None:
        self.unsaved.saved(rec.job_id)  # its latest state is saved now
        for watcher in self.watchers:
            watcher(rec)

    def _insert_events(self, job_id: str, items: list[str], namespace: str) -> None:
        seqs = self.store.insert_events(job_id, items, namespace)

        def publish() -> None:
            for seq, data in zip(seqs, items, strict=True):
                self.bus.publish("job", seq, data, namespace)

        self.store.after_commit(publish)

    def persist_soon(self, rec: JobRecord) -> None:
        """Record an executor-reported change now and commit it with the job's next change, or
        after ``DEFER_COMMIT_S`` (batched state commits)."""
        loop = self.table.loop
        if loop is None:
            self.persist(rec, new=False)
            return
        self._deferred.setdefault(rec.job_id, []).append(dumps(self.reports.job_wire(rec)))
        self._defer(rec.job_id, loop)

    def insert_with_first_commit(self, rec: JobRecord, rows: list) -> None:
        """A new job inserted by its first commit, not now: a quick job a request runs and waits for
        (``Intake``'s waiting lanes) is then saved with its outcome in one transaction. Its request is
        answered only after that commit, or after ``flush`` (docs/ARCHITECTURE.md, "REST details");
        at the latest it is saved after ``DEFER_COMMIT_S``, like any deferred change."""
        self._uninserted[rec.job_id] = rows
        self._deferred.setdefault(rec.job_id, [])
        loop = self.table.loop
        if loop is None:
            self.flush(rec.job_id)
        else:
            self._defer(rec.job_id, loop)

    def rows(self, job_id: str) -> Any:
        """A queued job's rows, for its launch: those of a job whose insert waits for its first commit
        (``insert_with_first_commit``: a job queued for a request whose save is still to come may be launched
        meanwhile), else the stored ones."""
        rows = self._uninserted.get(job_id)
        return self.store.get_rows(job_id) if rows is None else rows

    def awaits_insert(self, job_id: str) -> bool:
        """Whether the job's insert waits for its first commit (``insert_with_first_commit``): it is not saved yet."""
        return job_id in self._uninserted

    def drop_uninserted(self, job_id: str) -> None:
        """A new job whose insert waited that will not be saved after all (its request failed): nothing of it is
        kept."""
        self._uninserted.pop(job_id, None)
        self._deferred.pop(job_id, None)
        self._deferred_at.pop(job_id, None)

    def _defer(self, job_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self._deferred_at.setdefault(job_id, time.monotonic())
        if not self._flush_armed:
            self._flush_armed = True
            call_on_loop(loop, loop.call_later, DEFER_COMMIT_S, self._flush_due)

    def _flush_due(self) -> None:
        """Commit the deferred changes older than ``DEFER_COMMIT_S`` (event loop); re-arm for the rest."""
        with self.table.lock:
            now = time.monotonic()
            for job_id, since in list(self._deferred_at.items()):
                if now - since >= DEFER_COMMIT_S:
                    try:
                        self.flush(job_id)
                    except Exception:  # its changes go with its next commit, as when no timer is due
                        log.exception("committing job %s's deferred changes failed", job_id)
                        self._deferred_at.pop(job_id, None)
            loop = self.table.loop
            if self._deferred_at and loop is not None:
                wait = max(0.0, min(self._deferred_at.values()) + DEFER_COMMIT_S - now)
                loop.call_later(wait, self._flush_due)
            else:
                self._flush_armed = False

    def flush(self, job_id: str) -> None:
        """Commit a job's deferred changes that no later change has committed (event loop, shutdown)."""
        with self.table.lock:
            if job_id not in self._deferred and job_id not in self._uninserted:
                return
            rec = self.table.active.get(job_id)
            if rec is None:  # gone without a commit of its own (cannot happen today); drop quietly
                self._deferred.pop(job_id)
                self._deferred_at.pop(job_id, None)
                return
            self.persist(rec, new=False, event=False)

    def flush_all(self) -> None:
        for job_id in list(self._deferred):
            self.flush(job_id)

    def append_log(
        self, rec: JobRecord, stream: str, lines: list[str], rows: Sequence[int | None] | None = None
    ) -> None:
        pos = self._log_pos.get(rec.job_id)
        if pos is None:
            pos = self.store.next_log_pos(rec.job_id)
        if pos >= MAX_LOG_LINES_PER_JOB:
            return
        room = MAX_LOG_LINES_PER_JOB - pos
        clipped = [
            line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS] + "…" for line in lines[:room]
        ]
        tags = None if rows is None else list(rows[: len(clipped)])
        if len(lines) > room:
            clipped[-1] = f"[lancefn] log truncated after {MAX_LOG_LINES_PER_JOB} lines"
            if tags is not None:
                tags[-1] = None
        self._log_pos[rec.job_id] = self.store.append_logs(rec.job_id, pos, stream, clipped, tags)

    def forget(self, job_id: str) -> None:
        """The job finished: its log position is no longer needed, nor what the forgetters keep of it."""
        self._log_pos.pop(job_id, None)
        for forgetter in self.forgetters:
            forgetter(job_id)
