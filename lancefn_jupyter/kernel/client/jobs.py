"""`/v1/jobs/*`: describe, list, cancel, logs and (long-poll) wait."""

from __future__ import annotations

import builtins  # the resources have a list() method that shadows the type in annotations
import time
from typing import Any

from lancefn_jupyter.kernel.client._http import Transport
from lancefn_jupyter.wire.models import TERMINAL_STATES, Job

__all__ = ["JobsResource"]

# The server holds a wait request at most this long; longer waits loop.
_MAX_WAIT_S = 30.0


class JobsResource:
    def __init__(self, transport: Transport):
        self._t = transport

    def describe(self, job_id: str) -> Job:
        return Job.from_wire(self._t.post("/v1/jobs/describe", {"job_id": job_id}))

    def result(self, job_id: str) -> Any:
        """A DONE job's result from ``GET /v1/jobs/result``: Arrow IPC ``bytes`` when the job's
        ``result_format`` is ``arrow``, else the JSON results list."""
        reply = self._t.get("/v1/jobs/result", params={"job_id": job_id})
        return reply if isinstance(reply, bytes) else reply["result"]

    def list(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        job_type: str | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        body: dict[str, Any] = {}
        for key, value in (("state", state), ("name", name), ("job_type", job_type), ("limit", limit)):
            if value is not None:
                body[key] = value
        rows = self._t.post("/v1/jobs/list", body)["jobs"]
        # Batches and backfills are rows too (LanceDB 0.40's list_jobs); the kernel reads them from batches/list.
        return [Job.from_wire(item) for item in rows if item.get("job_type") not in ("batch", "backfill")]

    def usage(self, by: str = "namespace", since: str | None = None) -> dict:
        """``GET /v1/jobs/usage``: ended jobs' GPU- and CPU-seconds and cost summed ``by`` namespace, version, class, day or
        batch, ``since`` a span (``7d``) or a date (docs/ARCHITECTURE.md, "Cost")."""
        return self._t.get("/v1/jobs/usage", params={"by": by, **({"since": since} if since else {})})

    def cancel(self, job_id: str) -> bool:
        return bool(self._t.post("/v1/jobs/cancel", {"job_id": job_id})["cancelled"])

    def logs(self, job_id: str, offset: int = 0, *, row: int | None = None) -> tuple[builtins.list[str], int]:
        """Lines from ``offset`` (only those ``row`` printed, when given) and the next offset."""
        body: dict[str, Any] = {"job_id": job_id, "offset": offset}
        if row is not None:
            body["row"] = row
        reply = self._t.post("/v1/jobs/logs", body)
        return list(reply["lines"]), int(reply["next_offset"])

    def log_entries(self, job_id: str, offset: int = 0) -> tuple[builtins.list[str], builtins.list[str], int]:
        """Lines from ``offset``, each line's stream (``stdout`` for a server that does not say), the next offset."""
        reply = self._t.post("/v1/jobs/logs", {"job_id": job_id, "offset": offset})
        lines = list(reply["lines"])
        streams = list(reply.get("streams") or ())
        return lines, streams + ["stdout"] * (len(lines) - len(streams)), int(reply["next_offset"])

    def wait(self, job_id: str, *, timeout: float | None = None) -> Job:
        """The job once terminal, or as it stands when `timeout` seconds have passed (long poll, no busy loop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _MAX_WAIT_S if deadline is None else max(0.0, min(_MAX_WAIT_S, deadline - time.monotonic()))
            job = Job.from_wire(
                self._t.post("/v1/jobs/wait", {"job_id": job_id, "timeout_s": left}, timeout=left + 10.0)
            )
            if job.job_state in TERMINAL_STATES or (deadline is not None and time.monotonic() >= deadline):
                return job
