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

log = logging.getLogger("lancefn.server")


def json_results_problem(results: Any, rows_total: int) -> str | None:
    """Why a worker's JSON results cannot be the job's result (one per row, JSON), or None."""
    if not isinstance(results, list) or len(results) != rows_total:
        return f"the worker returned {len(results) if isinstance(results, list) else 'no list of'} results for {rows_total} rows"
    try:
        checked_json(results).encode("utf-8")
    except UnicodeEncodeError:
        return "a result contains a string with a lone surrogate, which is not valid Unicode; return valid text"
    except (TypeError, ValueError) as error:
        return (
            f"a result is not JSON ({error}); return numbers, strings, lists, dicts or None (NaN/Infinity are not JSON)"
        )
    return None


class Results:
    def __init__(self, *, data: DataStore, jobs: JobQueries, journal: JobJournal):
        self.data, self.jobs, self.journal = data, jobs, journal

    def take(self, rec: JobRecord, results: list | Mapping[str, Any]) -> str | None:
        """Set ``rec.result`` from what the worker reported; a problem (the job fails) or None.
        An Arrow result is referenced as ``{"arrow": {...}}`` (JSON results are always lists)."""
        if isinstance(results, Mapping) and "result_file" in results:
            if not self.data.is_result_file(results["result_file"], rec.job_id):
                return f"the worker reported a result file that is not there ({results['result_file']})"
            self.data.staging.staged(rec.job_id)  # on its way to the home, if the worker staged it
            summary = dict(results.get("summary") or {})
            rec.result = {"arrow": {"nbytes": int(results.get("nbytes", 0)), "summary": summary}}
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
