"""Executor callbacks: what executors report about a launched job (started, progress, log lines,
success, failure), applied to the job state machine (``machine.py``).  Runs in the control plane:
executors call these on their own threads (``executors.base.ExecutorCallbacks``); each takes the
job table's lock."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec

from pydantic import ValidationError

from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.machine import JobMachine
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.reports import Reports
from lancefn_jupyter.server.control.results import Results
from lancefn_jupyter.server.control.states import DONE, FAILED, IN_PROGRESS, TERMINAL, TIMED_OUT, now_ms
from lancefn_jupyter.server.encoding import cap_text, clean_text, dumps
from lancefn_jupyter.server.executors.base import redact_env
from lancefn_jupyter.server.storage.store import JobRecord, is_storage_full
from lancefn_jupyter.wire.frames import FAILING_ROWS_MAX_BYTES, bounded_frames
from lancefn_jupyter.wire.models import JobFailure

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("lancefn.server")

PROGRESS_EVENT_INTERVAL_S = 0.1  # progress events are coalesced per job; final states carry the final count

_P = ParamSpec("_P")


def _callback(
    method: Callable[Concatenate[JobCallbacks, JobRecord, _P], None],
) -> Callable[Concatenate[JobCallbacks, str, _P], None]:
    """The one guard of every callback: under the job table's lock, the method gets the job if it is
    still active (a late report about a finished job, e.g. after a cancel, is ignored).  It never
    raises into executor threads, and a bookkeeping error does not leave the job hanging: the job
    is failed instead.  A full disk is not such an error: state changes are kept in memory and
    saved once space frees (``UnsavedJobs.keep``), log lines that do not fit are dropped, and the
    job goes on."""

    @functools.wraps(method)
    def guarded(self: JobCallbacks, job_id: str, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            with self.table.lock:
                rec = self._live(job_id)
                if rec is not None:
                    method(self, rec, *args, **kwargs)
        except Exception as error:
            if is_storage_full(error):
                log.error("%s(%s): the disk is full (%s); the job goes on", method.__name__, job_id, error)
                return
            log.exception("%s(%s) failed; failing the job", method.__name__, job_id)
            self._fail_after_error(job_id)

    return guarded


def _millis(value: Any) -> float:
    """A reported duration as the wire's milliseconds: missing, negative or not a finite number → 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def job_timings(rec: JobRecord, reported: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``JobTimings`` wire form of a job that ended on a worker (docs/ARCHITECTURE.md, "Warm
    state"): the executor's start/setup/run times (a time it did not report counts 0), the time it waited
    for its environment ("Environments"), and the queue time the plane saw less the worker's start and that wait.  None when no worker took the job."""
    if rec.started_ms is None:
        return None
    reported = reported or {}
    start_ms, setup_ms = _millis(reported.get("start_ms")), _millis(reported.get("setup_ms"))
    environment_ms = _millis(rec.environment_ms)  # the plane's environment stage ("Environments")
    return {
        "queued_ms": max(0.0, rec.started_ms - rec.creation_ms - start_ms - environment_ms),
        "start_ms": start_ms,
        "environment_ms": environment_ms,
        "setup_ms": setup_ms,
        "run_ms": _millis(reported.get("run_ms")),
        "cold": bool(start_ms > 0 or setup_ms > 0 or environment_ms > 0 or reported.get("cold") is True),
        **_reused_setup(reported),
    }


def _reused_setup(reported: Mapping[str, Any]) -> dict[str, Any]:
    """A job run on the live worker of an earlier version with the same setup part (docs/ARCHITECTURE.md, "Setup
    reuse"): that version's id, and the time the worker took to rebind the new code."""
    source = reported.get("setup_reused_from")
    if not isinstance(source, str) or not source:
        return {}
    return {"setup_reused_from": source[:128], "rebind_ms": _millis(reported.get("rebind_ms"))}


def _storable(frames: list[dict] | None) -> list[dict] | None:
    """Bounded frames with every text storable (``clean_text``: a forged event may carry lone surrogates)."""
    if frames is None:
        return None
    return [
        {
            "function": clean_text(frame["function"]),
            "line": frame["line"],
            "locals": {clean_text(name): clean_text(text) for name, text in frame["locals"].items()},
        }
        for frame in frames
    ]


class JobCallbacks:
    """Implements ``executors.base.ExecutorCallbacks`` for the control plane."""

    def __init__(
        self,
        table: JobTable,
        *,
        journal: JobJournal,
        reports: Reports,
        results: Results,
        jobs: JobQueries,
        machine: JobMachine,
    ) -> None:
        self.table, self.journal, self.reports, self.results = table, journal, reports, results
        self.jobs, self.machine = jobs, machine
        self._progress_emitted: dict[str, float] = {}
        self._progress_held: set[str] = set()  # jobs whose latest count waits for the interval to end

    def _live(self, job_id: str) -> JobRecord | None:
        """The job if it is still active (a late report about a finished job is ignored)."""
        rec = self.table.active.get(job_id)
        return None if rec is None or rec.state in TERMINAL else rec

    def forget(self, job_id: str) -> None:
        """The job finished (a journal forgetter): its progress coalescing is done with."""
        self._progress_emitted.pop(job_id, None)
        self._progress_held.discard(job_id)

    def hold_now(self) -> Callable[[], None] | None:
        """The job table's and the store's locks, taken only if both are free now (``ExecutorCallbacks.hold_now``:
        reports made on the event loop); their release, or None."""
        table, store = self.table, self.journal.store
        if not table.lock.acquire_now():
            return None
        if not store.acquire_now():
            table.lock.release()
            return None

        def release() -> None:
            store.release()
            table.lock.release()

        return release

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        return self.table.loop

    def usage_changed(self) -> None:
        try:
            with self.table.lock:  # re-entrant: the event loop calls this with it held (``hold_now``)
                self.reports.publish_usage()
        except Exception:  # a report, never worth an executor's thread
            log.exception("could not publish the usage the executor changed")

    @_callback
    def task_started(self, rec: JobRecord, *, devices: tuple[str, ...] = (), node: str | None = None) -> None:
        rec.state = IN_PROGRESS
        rec.started_ms = rec.started_ms or now_ms()
        self.reports.estimator.invalidate(rec.gpu_class)  # its GPUs now free at started_ms + its run time
        rec.devices = tuple(devices) or rec.devices
        rec.node = node
        self.journal.persist_soon(rec)
        if self.machine.placement.start_changes_usage(rec):
            self.reports.publish_usage()

    @_callback
    def task_progress(self, rec: JobRecord, rows_done: int) -> None:
        job_id, loop = rec.job_id, self.table.loop
        rec.rows_done = max(rec.rows_done, min(int(rows_done), rec.rows_total))
        now = time.monotonic()
        # Coalesce: a 10k-row map must not write 10k events; the last row always gets one, and a
        # count held back by the interval is sent when it ends (no stale count while a slow row runs).
        since = now - self._progress_emitted.get(job_id, 0.0)
        if rec.rows_done == rec.rows_total or since >= PROGRESS_EVENT_INTERVAL_S:
            self._progress_emitted[job_id] = now
            self._progress_held.discard(job_id)
            self.journal.persist_soon(rec)
        elif job_id not in self._progress_held and loop is not None:
            self._progress_held.add(job_id)
            delay = PROGRESS_EVENT_INTERVAL_S - since
            loop.call_soon_threadsafe(loop.call_later, delay, self._flush_progress, job_id)

    def _flush_progress(self, job_id: str) -> None:
        """Publish a progress count the coalescing interval held back (runs on the event loop)."""
        with self.table.lock:
            if job_id not in self._progress_held:
                return
            self._progress_held.discard(job_id)
            rec = self._live(job_id)
            if rec is None:
                return
            self._progress_emitted[job_id] = time.monotonic()
            self.journal.persist(rec, new=False)

    @_callback
    def task_log(self, rec: JobRecord, stream: str, lines: list[str], rows: Sequence[int | None] | None = None) -> None:
        self.journal.append_log(rec, clean_text(str(stream)), [clean_text(str(line)) for line in lines], rows)

    @_callback
    def task_succeeded(
        self, rec: JobRecord, results: list | Mapping[str, Any], *, timings: Mapping[str, Any] | None = None
    ) -> None:
        rec.timings = job_timings(rec, timings)
        problem = self.results.take(rec, results)
        if problem:
            rec.failure = JobFailure(phase="result", message=problem).to_wire()
            self.machine.finish(rec, FAILED)
            return
        rec.rows_done = rec.rows_total
        self.machine.finish(rec, DONE)
        if not isinstance(results, list):
            self.results.arrived(rec.job_id)

    @_callback
    def task_failed(
        self, rec: JobRecord, failure: JobFailure | Mapping[str, Any], *, timings: Mapping[str, Any] | None = None
    ) -> None:
        rec.timings = job_timings(rec, timings)
        if isinstance(failure, JobFailure):
            wire = failure.to_wire()
        else:
            try:
                wire = JobFailure.from_wire(failure).to_wire()
            except ValidationError:
                wire = JobFailure(phase="executor", message=f"worker failed: {cap_text(str(failure), 2000)}").to_wire()
        env = [self.table.job_env.get(rec.job_id, {})]
        wire = {k: clean_text(cap_text(redact_env(v, env))) if isinstance(v, str) else v for k, v in wire.items()}
        if "frames" in wire:
            wire["frames"] = _storable(bounded_frames(wire["frames"], env[0].values()))
        if "failing_rows" in wire:
            wire.update(self._failing_rows(rec, *wire["failing_rows"]))
            wire = {k: v for k, v in wire.items() if v is not None}
        rec.failure = wire
        self.machine.finish(rec, TIMED_OUT if wire["phase"] == "timeout" else FAILED)

    def _failing_rows(self, rec: JobRecord, start: int, end: int) -> dict[str, Any]:
        """The failing rows ``start…end`` of a job with JSON rows, kept with its failure when their JSON is at most
        ``FAILING_ROWS_MAX_BYTES`` (docs/ARCHITECTURE.md, "Debugging a failure"); the span alone otherwise. A span
        outside the job's rows (a worker's claim) is dropped."""
        rows = self.journal.rows(rec.job_id) if rec.spec.get("rows_format") != "arrow" else None
        if not isinstance(rows, list) or not 0 <= start < end <= len(rows):
            return {"failing_rows": None}
        failing = rows[start:end]
        return {"rows": failing} if len(dumps(failing).encode("utf-8")) <= FAILING_ROWS_MAX_BYTES else {}

    def _fail_after_error(self, job_id: str) -> None:
        table = self.table
        with table.lock:
            rec = table.active.get(job_id)
            if rec is None:
                return
            rec.failure = JobFailure(
                phase="executor",
                message="the control plane could not record this job's progress; see the server log",
                retryable=True,
            ).to_wire()
            try:
                self.machine.finish(rec, FAILED)
            except Exception:
                log.exception("could not fail job %s either; dropping it from memory", job_id)
                table.drop(job_id)
                self.jobs.wake(job_id)
        table.stop_worker(job_id)
