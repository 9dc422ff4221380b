"""``/v1/jobs/*``: describe, list, cancel, follow and fetch the results of jobs
(docs/ARCHITECTURE.md, "REST API (v1)"); the event stream is in ``events.py``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from typing import Any, BinaryIO, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from lancefn_jupyter.server.control import event_filter
from lancefn_jupyter.server.control.dialect import job_row
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.control.pages import clamp_limit, decode_tokens, merge_newest
from lancefn_jupyter.server.control.states import now_ms
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import who
from lancefn_jupyter.server.http.bodies import Body, parse, parse_raw
from lancefn_jupyter.server.http.router import Router, query
from lancefn_jupyter.server.http.routes.context import RouteContext, by_id, listing
from lancefn_jupyter.server.policy.costs import since_ms
from lancefn_jupyter.server.policy.namespaces import Principal
from lancefn_jupyter.wire.dataplane import MEDIA_TYPE as ARROW_STREAM


class JobId(Body):
    job_id: str


class ListJobs(Body):
    state: Literal["PENDING", "IN_PROGRESS", "PAUSED", "DONE", "FAILED", "CANCELLED", "TIMED_OUT"] | None = None
    name: str | None = None
    job_type: Literal["create_function", "run_function", "batch", "backfill"] | None = None
    page_token: str | None = None
    limit: int = Field(100, ge=1, le=1000)


RUNS = ("batch", "backfill")  # the job types of batches' rows in jobs/list; the others are jobs'


class QueryEvents(Body):
    job_id: str
    limit: int = Field(1000, ge=1, le=10000)
    filter: str | None = None  # LanceDB 0.40's SQL-like filter (event_filter.py)


class Logs(Body):
    job_id: str
    offset: int = Field(0, ge=0, le=2**62)  # SQLite integers are 64-bit
    limit: int = Field(1000, ge=1, le=10000)
    row: int | None = Field(None, ge=0, le=2**62)  # only the lines this row printed ("Live output")


class Wait(Body):
    job_id: str
    timeout_s: float = Field(30.0, ge=0, le=60)


def add_routes(router: Router, ctx: RouteContext) -> None:
    plane, queries = ctx.plane, ctx.plane.jobs

    @router.get("/v1/jobs/usage", privilege="jobs", query=(("by", False), ("since", False)))
    async def job_usage(request: Request) -> dict:
        """Ended jobs' GPU- and CPU-seconds and cost, summed ``?by=namespace|version|class|day|batch`` (default
        namespace) ``&since=7d|24h|2026-12-01`` (default: all), within the caller's namespace (the admin: every one;
        docs/ARCHITECTURE.md, "Cost")."""
        params = request.query_params
        since = None
        if params.get("since"):
            try:
                since = since_ms(params["since"], now_ms())
            except ValueError as error:
                raise ApiError(400, str(error)) from None
        return await off_loop(queries.usage, params.get("by") or "namespace", since, who(request).scope)

    @router.get("/v1/jobs/result", privilege="jobs", query=(("job_id", True),))
    async def job_result(request: Request) -> Any:
        """A DONE job's result: its Arrow IPC stream (streamed from the file), or JSON results."""
        job_id = query(request, "job_id")
        opened, results = await off_loop(plane.results.open_result, job_id, who(request).scope)
        if opened is None:
            return {"job_id": job_id, "result": results}
        return StreamingResponse(
            _chunks(opened),
            media_type=ARROW_STREAM,
            headers={"content-length": str(os.fstat(opened.fileno()).st_size)},
        )

    batches = plane.batches

    def describe_any(job_id: str, scope: str | None) -> dict:
        """A job, or a batch or backfill by its id as a job envelope (LanceDB 0.40's ``open_job``)."""
        try:
            return queries.describe(job_id, scope)
        except ApiError as error:
            if error.status != 404:
                raise
            try:
                return batches.describe_as_job(job_id, scope)
            except ApiError:
                raise error from None

    def pause_or_resume(method: Callable[[str, str | None], dict], verb: str) -> Callable[[str, str | None], dict]:
        def act(job_id: str, scope: str | None) -> dict:
            try:
                return method(job_id, scope)
            except ApiError as error:
                if error.status != 404:
                    raise
            queries.describe(job_id, scope)  # a job's id: say what can be paused; else the job's own 404
            raise ApiError(409, f"job {job_id} is a single job; only batches and backfills {verb}; cancel it instead")

        return act

    def cancel_any(job_id: str, scope: str | None) -> dict:
        """Cancel a job, or a batch or backfill by its id (LanceDB 0.40's ``cancel_job``)."""
        try:
            return plane.machine.cancel(job_id, scope)
        except ApiError as error:
            if error.status != 404:
                raise
            try:
                return {"job_id": job_id, "cancelled": batches.cancel(job_id, scope)["cancelled"]}
            except ApiError:
                raise error from None

    router.post("/v1/jobs/describe", privilege="jobs")(by_id(JobId, "job_id", describe_any, "describe_job"))
    router.post("/v1/jobs/cancel", privilege="jobs")(by_id(JobId, "job_id", cancel_any, "cancel_job"))
    router.post("/v1/jobs/pause", privilege="jobs")(
        by_id(JobId, "job_id", pause_or_resume(batches.pause, "pause"), "pause_job")
    )
    router.post("/v1/jobs/resume", privilege="jobs")(
        by_id(JobId, "job_id", pause_or_resume(batches.resume, "resume"), "resume_job")
    )

    def list_any(
        *,
        state: str | None,
        name: str | None,
        job_type: str | None,
        page_token: str | None,
        limit: int,
        scope: str | None,
    ) -> dict:
        """Jobs, batches and backfills newest first (LanceDB 0.40's ``list_jobs``), one page of each table merged;
        the token holds where each table's listing stands."""
        before_jobs, before_runs = decode_tokens(page_token, 2)
        limit = clamp_limit(limit)
        jobs = (
            queries.page(state=state, name=name, job_type=job_type, before=before_jobs, limit=limit + 1, scope=scope)
            if job_type not in RUNS and state != "PAUSED"
            else []
        )
        runs = (
            batches.page_as_jobs(state=state, name=name, before=before_runs, limit=limit + 1, scope=scope)
            if job_type is None or job_type in RUNS
            else []
        )
        rows, token = merge_newest([jobs, runs], (before_jobs, before_runs), limit, lambda row: row["creation_ms"])
        wanted = [
            row
            for row in rows
            if (state is None or row["job_state"] == state) and (job_type is None or row["job_type"] == job_type)
        ]
        return {"jobs": [job_row(row) for row in wanted], **({"page_token": token} if token else {})}

    router.post("/v1/jobs/list", privilege="jobs")(listing(ListJobs, list_any, "list_jobs"))

    def events_any(job_id: str, limit: int, scope: str | None, keep: Callable[[dict], bool] | None) -> list[dict]:
        """A job's events, or a batch's or backfill's by its id; neither: the job's 404."""
        try:
            return queries.events(job_id, limit, scope, keep)
        except ApiError as error:
            if error.status != 404:
                raise
            try:
                return batches.events(job_id, limit, scope, keep)
            except ApiError:
                raise error from None

    @router.post("/v1/jobs/query_events", privilege="jobs")
    async def query_events(request: Request) -> Response:
        """A job's events as an Arrow IPC stream (LanceDB 0.40's ``Job.events()``)."""
        body = await parse(request, QueryEvents)
        keep = event_filter.parse(body.filter) if body.filter else None
        rows = await off_loop(events_any, body.job_id, body.limit, who(request).scope, keep)
        return Response(await off_loop(_events_stream, rows), media_type=ARROW_STREAM)

    @router.post("/v1/jobs/logs", privilege="jobs")
    async def job_logs(request: Request) -> dict:
        body = await parse(request, Logs)
        return await off_loop(queries.logs, body.job_id, body.offset, body.limit, who(request).scope, body.row)

    async def wait_job(caller: Principal, raw: bytes) -> dict:
        body = await parse_raw(raw, Wait)
        return await queries.wait(body.job_id, body.timeout_s, caller.scope, unless_queued=False)

    ctx.fastpath.post(router, "/v1/jobs/wait", "jobs", wait_job)


def _events_stream(rows: list[dict]) -> bytes:
    """``rows`` (``dialect.event_row``) as an Arrow IPC stream; the schema holds when there are none."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("seq", pa.int64()),
            ("job_id", pa.string()),
            ("state", pa.string()),
            ("updated_at_millis", pa.int64()),
            ("updated_by", pa.string()),
            ("emitted_from", pa.string()),
            ("emitted_by", pa.string()),
            ("claim_entity", pa.string()),
            ("rows_processed", pa.int64()),
        ]
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
    return sink.getvalue().to_pybytes()


async def _chunks(opened: BinaryIO) -> AsyncIterator[bytes]:
    """An open result file in 1 MiB chunks, read off the loop; closed at the end or when the client goes."""
    try:
        while chunk := await off_loop(opened.read, 1 << 20):
            yield chunk
    finally:
        opened.close()
