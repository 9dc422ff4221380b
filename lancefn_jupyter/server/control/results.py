"""Job results: a worker's JSON results or Arrow result file taken onto its job, the retention
rule, and the result a DONE job serves (docs/ARCHITECTURE.md, "Arrow data plane").  Runs in the
control plane: executor callbacks take results (lock held), routes read them on core threads."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, BinaryIO

from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.queries import JobQueries
from lancefn_jupyter.server.control.states import DONE
from lancefn_jupyter.server.encoding import checked_json
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.server.storage.store import JobRecord
from lancefn_jupyter.worker.protocol import JSON_RESULT_MAX_BYTES
from lancefn_jupyter.worker.result import json_too_large, result_too_large

log = logging.getLogger("lancefn.server")

_SUMMARY_TEXT = 1024  # characters of a summary's type or dtype kept (a table's dtype lists its columns)
_SUMMARY_DIMS = 64  # dimensions of a summary's shape kept (numpy allows 64)


def json_results_problem(results: Any, rows_total: int) -> str | None:
    """Why a worker's JSON results cannot be the job's result (one per row, JSON, at most ``JSON_RESULT_MAX_BYTES``),
    or None."""
    if not isinstance(results, list) or len(results) != rows_total:
        return f"the worker returned {len(results) if isinstance(results, list) else 'no list of'} results for {rows_total} rows"
    try:
        size = len(checked_json(results).encode("utf-8"))
    except UnicodeEncodeError:
        return "a result contains a string with a lone surrogate, which is not valid Unicode; return valid text"
    except (TypeError, ValueError, RecursionError) as error:
        return (
            f"a result is not JSON ({error}); return numbers, strings, lists, dicts or None (NaN/Infinity are not JSON)"
        )
    return json_too_large(size) if size > JSON_RESULT_MAX_BYTES else None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def result_summary(summary: object, *, item: bool = True) -> dict:
    """An Arrow result's summary as the control plane keeps it, whatever the worker sent: its known fields only
    (``type``, ``dtype``, ``shape``, ``shape_varies``, ``nbytes``, ``items_nbytes``, ``rows_skipped``, ``nonfinite``, one level of ``item``: see
    ``dataplane.summarize``), each of its type and capped, so ``jobs/describe`` and ``jobs/list`` stay small."""
    if not isinstance(summary, Mapping):
        return {}
    kept: dict[str, Any] = {
        key: summary[key][:_SUMMARY_TEXT] for key in ("type", "dtype") if isinstance(summary.get(key), str)
    }
    shape = summary.get("shape")
    if isinstance(shape, list) and len(shape) <= _SUMMARY_DIMS and all(_count(n) for n in shape):
        kept["shape"] = shape
    kept.update((key, summary[key]) for key in ("nbytes", "items_nbytes", "rows_skipped") if _count(summary.get(key)))
    if summary.get("shape_varies") is True:
        kept["shape_varies"] = True
    counts = summary.get("nonfinite")
    if isinstance(counts, Mapping):
        kept["nonfinite"] = {key: counts[key] for key in ("nan", "inf", "-inf", "floats") if _count(counts.get(key))}
    if item and "item" in summary:
        kept["item"] = result_summary(summary["item"], item=False)
    return kept


class Results:
    def __init__(self, *, data: DataStore, jobs: JobQueries, journal: JobJournal):
        self.data, self.jobs, self.journal = data, jobs, journal

    def take(self, rec: JobRecord, results: list | Mapping[str, Any]) -> str | None:
        """Set ``rec.result`` from what the worker reported, checked against the result limits whatever the worker
        said (the file's own size; a summary of known fields: docs/ARCHITECTURE.md, "Worker protocol"); a problem
        (the job fails in phase ``result``) or None. An Arrow result is referenced as ``{"arrow": {...}}`` (JSON
        results are always lists)."""
        if isinstance(results, Mapping) and "result_file" in results:
            size = self.data.result_size(results["result_file"], rec.job_id)
            if size is None:
                return f"the worker reported a result file that is not there ({str(results['result_file'])[:300]})"
            if size > self.data.max_result_bytes:
                self.data.remove(rec.job_id)  # never kept
                return result_too_large(size, self.data.max_result_bytes)
            self.data.staging.staged(rec.job_id)  # on its way to the home, if the worker staged it
            rec.result = {"arrow": {"nbytes": size, "summary": result_summary(results.get("summary"))}}
            return None
        problem = json_results_problem(results, rec.rows_total)
        if problem is None:
            rec.result = results
        return problem

    def arrived(self, job_id: str) -> None:
        """An Arrow result file was kept for ``job_id``: the retention rule applies at once (an index, no scan)."""
        self._expired(self.data.kept(job_id))

    def enforce_retention(self) -> None:
        """At start: scan the results, remove those past the retention rule; their jobs say so (``result_expired``)."""
        self._expired(self.data.enforce_retention())

    def release(self, job_ids: list[str]) -> None:
        """Backfill chunk jobs whose results were committed into their table (lock held): their results leave the
        retention index and their jobs say so (``expired``, ``committed``); the caller then removes the files
        (``DataStore.remove``, without the lock), so a backfill's results neither fill the home nor push other jobs'
        results out under the retention rule (docs/ARCHITECTURE.md, "Backfills", "Results")."""
        for job_id in job_ids:
            self.data.forget(job_id)
        self._expired(job_ids, committed=True)

    def _expired(self, job_ids: list[str], *, committed: bool = False) -> None:
        for job_id in job_ids:
            rec = self.jobs.record(job_id)  # the object reads see, if one is kept in memory
            if rec is None or not isinstance(rec.result, dict) or "arrow" not in rec.result:
                continue
            rec.result = {
                "arrow": {**rec.result["arrow"], "expired": True, **({"committed": True} if committed else {})}
            }
            try:
                self.journal.persist(rec, new=False)
            except Exception:
                log.exception("could not mark job %s's result as expired", job_id)

    def open_result(self, job_id: str, scope: str | None = None) -> tuple[BinaryIO | None, Any]:
        """(the Arrow IPC result, opened: the caller closes it, None) or (None, JSON results) of a DONE job
        (``scope``: the caller's namespace; another team's job is a 404, as everywhere). Opened here, so a
        staged result moving to the home meanwhile ("Result staging") is still served whole."""
        rec = self.jobs.get(job_id, scope)
        if rec.state != DONE:
            raise ApiError(409, f"job {job_id} is {rec.state}, not DONE; wait for it with POST /v1/jobs/wait")
        if not (isinstance(rec.result, dict) and "arrow" in rec.result):
            return None, rec.result
        opened = None
        if not rec.result["arrow"].get("expired"):
            for _ in range(2):  # staged, or in the home once moved
                try:
                    opened = open(self.data.find_result(job_id), "rb")  # noqa: SIM115 (the response closes it)
                    break
                except FileNotFoundError:
                    continue
        if opened is None and rec.result["arrow"].get("committed"):
            raise ApiError(
                410,
                f"the result of job {job_id} (a backfill's chunk) was committed into its table and removed; "
                "read the rows from the table",
                code="gone",
            )
        if opened is None:
            raise ApiError(
                410,
                f"the result of job {job_id} was removed by the retention rule (--result-max-age-days / "
                "--result-max-bytes); run the function again",
                code="gone",
            )
        recorded = rec.result["arrow"].get("nbytes")
        if recorded and os.fstat(opened.fileno()).st_size != recorded:
            opened.close()
            raise ApiError(
                410,
                f"the result file of job {job_id} is incomplete (the machine lost power before it reached the "
                "disk; start the server with --result-fsync to prevent this); run the function again",
                code="gone",
            )
        return opened, None
