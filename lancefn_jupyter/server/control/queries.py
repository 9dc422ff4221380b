"""Job requests besides ``run``: describe, list, logs, long polls; and the checks a run's input
rows pass before a job is queued (JSON rows, or an Arrow IPC rows file)."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.server.common import PENDING, TERMINAL, ApiError, clamp_limit, decode_token, dumps, encode_token
from lancefn_jupyter.server.control.waiters import Waiters
from lancefn_jupyter.server.policy.namespaces import visible
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord
from lancefn_jupyter.wire.models import FunctionVersion

if TYPE_CHECKING:  # pragma: no cover
    from lancefn_jupyter.server.plane import ControlPlane


RECENT_JOBS = 64  # finished jobs kept in memory: a quick job's run reply and first reads need no store read


class JobQueries:
    def __init__(self, core: ControlPlane):
        self.core = core
        self.waiters = Waiters(core._lock)
        self._recent: OrderedDict[str, JobRecord] = OrderedDict()  # stored already; the same objects

    def finished(self, rec: JobRecord) -> None:
        """``rec`` just finished (and was saved): reads find it here for a while (core's lock held)."""
        self._recent[rec.job_id] = rec
        if len(self._recent) > RECENT_JOBS:
            self._recent.popitem(last=False)

    def get(self, job_id: str, scope: str | None = None) -> JobRecord:
        """The job as the caller (``scope``) may see it; another team's job is a 404, as if it did not exist."""
        with self.core._lock:
            rec = self.record(job_id)
        if rec is None or not visible(scope, rec.namespace):
            raise ApiError(404, f"job {job_id} not found; list jobs with POST /v1/jobs/list")
        return rec

    def record(self, job_id: str) -> JobRecord | None:
        """A job as the core knows it now (memory first), or None."""
        core = self.core
        with core._lock:
            return (
                core._active.get(job_id)
                or core._unsaved.get(job_id)
                or self._recent.get(job_id)
                or core.store.get_job(job_id)
            )

    def describe(self, job_id: str, scope: str | None = None) -> dict:
        with self.core._lock:
            return self.core.reports.job_wire(self.get(job_id, scope))

    def list(
        self,
        *,
        state: str | None,
        name: str | None,
        job_type: str | None,
        page_token: str | None,
        limit: int,
        scope: str | None,
    ) -> dict:
        core = self.core
        before = decode_token(page_token)
        limit = clamp_limit(limit)
        with core._lock:
            recs = core.store.list_jobs(
                states=(state,) if state else None,
                name=name,
                job_type=job_type,
                before_seq=before,
                limit=limit + 1,
                namespace=scope,
            )
            # Memory is authoritative for active jobs (e.g. coalesced progress) and unsaved ones.
            current = [core._active.get(rec.job_id) or core._unsaved.get(rec.job_id) or rec for rec in recs[:limit]]
            jobs = [core.reports.job_wire(rec) for rec in current if state is None or rec.state == state]
        reply: dict[str, Any] = {"jobs": jobs}
        if len(recs) > limit:
            reply["page_token"] = encode_token(recs[limit - 1].seq or 0)  # stored records have a seq
        return reply

    def logs(self, job_id: str, offset: int, limit: int, scope: str | None) -> dict:
        self.get(job_id, scope)
        limit = max(1, min(limit, 10_000))
        entries = self.core.store.read_logs(job_id, max(0, offset), limit)
        lines = [line for _, _, line in entries]
        next_offset = entries[-1][0] + 1 if entries else max(0, offset)
        return {"lines": lines, "next_offset": next_offset}

    async def wait(self, job_id: str, timeout_s: float, scope: str | None, *, unless_queued: bool) -> dict:
        """The job once terminal, or as it stands after ``timeout_s`` (long poll).
        ``unless_queued``: answer at once if it waits for capacity (``functions/run``'s inline
        wait: a submit must not stall behind a full queue)."""
        core = self.core
        loop = asyncio.get_running_loop()
        with core._lock:
            rec = self.get(job_id, scope)
            queued = unless_queued and rec.state == PENDING and core._scheduler.is_pending(job_id)
            if rec.state in TERMINAL or timeout_s <= 0 or not core._started or queued:
                return core.reports.job_wire(rec)
            future = self.waiters.add(job_id, loop)
        finished = await self.waiters.wait(job_id, future, timeout_s)
        return finished if finished is not None else self.describe(job_id)

    def wake(self, job_id: str, finished: JobRecord | None = None) -> None:
        """Wake the job's long polls; with its ``finished`` record they answer from it (no store read)."""
        wire = self.core.reports.job_wire(finished) if finished is not None and self.waiters.waiting(job_id) else None
        self.waiters.wake(job_id, self.core._loop, wire)

    def wake_all(self) -> None:
        """Waiters get their job as it stands now rather than hanging until their timeout (shutdown)."""
        with self.core._lock:
            for job_id in self.waiters.keys():  # noqa: SIM118 (Waiters is no mapping)
                self.wake(job_id)


# --------------------------------------------------------------------- input rows


def check_rows(fv: FunctionVersion, rows: Any) -> None:
    """JSON ``rows`` fit ``fv``'s signature: a 400 naming the row and the parameters otherwise."""
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
            dumps(row).encode("utf-8")
        except ValueError:
            raise ApiError(
                400, f"rows[{i}] contains NaN or Infinity, which JSON cannot carry; use null or a finite number"
            ) from None


def take_arrow_rows(data: DataStore, fv: FunctionVersion, tmp: Any) -> dict:
    """Check an Arrow rows body (a temp file) and keep it under its final name; the rows ref
    stored in place of JSON rows: ``{"arrow_file": "rows/<uuid>.arrow", "rows_total": n}``."""
    tmp = os.fspath(tmp)
    _, final = data.new_rows_file()
    try:
        count = data.check_rows(tmp, fv.signature.inputs, f"{fv.name}@{fv.version}")
        os.replace(tmp, final)
    except ValueError as error:
        raise ApiError(400, str(error)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"arrow_file": os.path.relpath(final, data.root), "rows_total": count}
