"""Job requests besides ``run`` and ``cancel`` (``machine.py``): describe, list, logs and long
polls, memory first (active, unsaved and recently finished jobs) then the store.  Runs in the
control plane, on core threads (``wait`` on the event loop)."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable

from lancefn_jupyter.server.control.dialect import event_row
from lancefn_jupyter.server.control.event_filter import kept_rows
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.states import PENDING, TERMINAL
from lancefn_jupyter.server.control.unsaved import UnsavedJobs
from lancefn_jupyter.server.control.waiters import Waiters
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.policy.costs import BY, sum_usage, usage_key
from lancefn_jupyter.server.policy.namespaces import visible
from lancefn_jupyter.server.storage.store import JobRecord, Store

RECENT_JOBS = 64  # finished jobs kept in memory: a quick job's run reply and first reads need no store read


class JobQueries:
    def __init__(self, table: JobTable, *, store: Store, unsaved: UnsavedJobs, reports: Reports):
        self.table, self.store, self.unsaved, self.reports = table, store, unsaved, reports
        self.waiters = Waiters(table.lock)
        self._recent: OrderedDict[str, JobRecord] = OrderedDict()  # stored already; the same objects

    def usage(self, by: str, since: int | None, scope: str | None) -> dict:
        """The ended jobs' usage and cost summed ``by`` namespace, version, class, day or batch, since epoch ms
        ``since`` (docs/ARCHITECTURE.md, "Cost"); ``scope``: the caller's namespace (None: the admin, every one)."""
        if by not in BY:
            raise ApiError(400, f"by={by!r} is not one of {', '.join(BY)}; write by=namespace")
        items = []
        for rec in self.store.list_jobs(states=tuple(TERMINAL), job_type="run_function", limit=10**9, namespace=scope):
            if rec.finished_ms is None or (since is not None and rec.finished_ms < since):
                continue
            usage = self.reports.job_usage(rec)
            if usage is not None:
                key = usage_key(
                    by, namespace=rec.namespace, spec=rec.spec, gpu_class=rec.gpu_class, finished_ms=rec.finished_ms
                )
                start_s = float((rec.timings or {}).get("start_ms") or 0.0) / 1000
                items.append((key, {**usage, "rows": rec.rows_total or 0, "start_s": start_s}))
        return {"by": by, "since_ms": since, "rows": sum_usage(items)}

    def finished(self, rec: JobRecord) -> None:
        """``rec`` just finished (and was saved): reads find it here for a while (lock held)."""
        self._recent[rec.job_id] = rec
        if len(self._recent) > RECENT_JOBS:
            self._recent.popitem(last=False)

    def get(self, job_id: str, scope: str | None = None) -> JobRecord:
        """The job as the caller (``scope``) may see it; another team's job is a 404, as if it did not exist."""
        with self.table.lock:
            rec = self.record(job_id)
        if rec is None or not visible(scope, rec.namespace):
            raise ApiError(404, f"job {job_id} not found; list jobs with POST /v1/jobs/list")
        return rec

    def record(self, job_id: str) -> JobRecord | None:
        """A job as the control plane knows it now (memory first), or None."""
        with self.table.lock:
            return (
                self.table.active.get(job_id)
                or self.unsaved.get(job_id)
                or self._recent.get(job_id)
                or self.store.get_job(job_id)
            )

    def events(
        self, job_id: str, limit: int, scope: str | None = None, keep: Callable[[dict], bool] | None = None
    ) -> list[dict]:
        """A job's recorded events (the ones the event log still keeps) as LanceDB 0.40's event rows, oldest first:
        the first ``limit`` of those ``keep`` keeps (``event_filter.parse``), read a page at a time."""
        self.get(job_id, scope)
        return kept_rows(
            lambda after, size: self.store.job_events(job_id, size, after=after),
            lambda seq, data: event_row(seq, json.loads(data)),
            limit,
            keep,
        )

    def describe(self, job_id: str, scope: str | None = None) -> dict:
        with self.table.lock:
            return self.reports.job_wire(self.get(job_id, scope))

    def page(
        self,
        *,
        state: str | None,
        name: str | None,
        job_type: str | None,
        before: int | None,
        limit: int,
        scope: str | None,
    ) -> list[tuple[int, dict]]:
        """``(seq, job wire form)`` of the stored jobs newest first, below sequence number ``before`` when given (a row's
        state may have moved off ``state`` since it was stored: the caller filters the page it keeps)."""
        table = self.table
        with table.lock:
            recs = self.store.list_jobs(
                states=(state,) if state else None,
                name=name,
                job_type=job_type,
                before_seq=before,
                limit=limit,
                namespace=scope,
            )
            # Memory is authoritative for active jobs (e.g. coalesced progress) and unsaved ones.
            current = [table.active.get(rec.job_id) or self.unsaved.get(rec.job_id) or rec for rec in recs]
            # stored records have a seq
            return [(rec.seq or 0, self.reports.job_wire(now)) for rec, now in zip(recs, current, strict=True)]

    def logs(self, job_id: str, offset: int, limit: int, scope: str | None, row: int | None = None) -> dict:
        """A page of the job's log from ``offset``: each line's stream and row ("Live output"); only ``row``'s lines
        when it is given (the note on lines the log limit removed is then left out)."""
        self.get(job_id, scope)
        limit = max(1, min(limit, 10_000))
        offset = max(0, offset)
        pruned = self.store.pruned_log_lines(job_id)
        if offset < pruned and row is None:  # its lines went to the log limit: say so once, where they were
            entries = self.store.read_logs(job_id, pruned, limit)
            note = (
                f"[lancefn] lines {offset}-{pruned - 1} of this log were removed: the server keeps at most "
                "--log-max-bytes of job logs, the oldest jobs' first"
            )
            lines = [note, *(line for _, _, line, _ in entries)]
            streams = ["stderr", *(stream for _, stream, _, _ in entries)]
            rows = [None, *(tag for _, _, _, tag in entries)]
            next_offset = entries[-1][0] + 1 if entries else pruned
            return {"lines": lines, "streams": streams, "rows": rows, "next_offset": next_offset}
        entries = self.store.read_logs(job_id, max(offset, pruned), limit, row)
        next_offset = entries[-1][0] + 1 if entries else offset
        # streams: each line's stream (stdout, stderr), so a reader can keep them apart; rows: the row that printed
        # it, null for a line outside a row ("Live output")
        return {
            "lines": [line for _, _, line, _ in entries],
            "streams": [stream for _, stream, _, _ in entries],
            "rows": [tag for _, _, _, tag in entries],
            "next_offset": next_offset,
        }

    async def wait(self, job_id: str, timeout_s: float, scope: str | None, *, unless_queued: bool) -> dict:
        """The job once terminal, or as it stands after ``timeout_s`` (long poll).
        ``unless_queued``: answer at once if it waits for capacity or for its environment's build
        (``functions/run``'s inline wait: a submit must not stall behind a full queue or a build)."""
        table = self.table
        loop = asyncio.get_running_loop()
        with table.lock:
            rec = self.get(job_id, scope)
            queued = (
                unless_queued
                and rec.state == PENDING
                and (table.scheduler.is_pending(job_id) or job_id in table.environment_waits)
            )
            if rec.state in TERMINAL or timeout_s <= 0 or not table.started or queued:
                return self.reports.job_wire(rec)
            future = self.waiters.add(job_id, loop)
        finished = await self.waiters.wait(job_id, future, timeout_s)
        return finished if finished is not None else self.describe(job_id)

    def wake(self, job_id: str, finished: JobRecord | None = None, wire: dict | None = None) -> None:
        """Wake the job's long polls; with its ``finished`` record (or its ``wire`` form, built already) they answer
        from it (no store read)."""
        if wire is None and finished is not None and self.waiters.waiting(job_id):
            wire = self.reports.job_wire(finished)
        self.waiters.wake(job_id, self.table.loop, wire)

    def wake_all(self) -> None:
        """Waiters get their job as it stands now rather than hanging until their timeout (shutdown)."""
        with self.table.lock:
            for job_id in self.waiters.keys():  # noqa: SIM118 (Waiters is no mapping)
                self.wake(job_id)
