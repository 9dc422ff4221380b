"""``/v1/batches/*``: a map fanned out as chunk jobs (docs/ARCHITECTURE.md, "Batches").

Creating and retrying need the ``functions`` privilege (they run code); looking, cancelling and
waiting need ``jobs``, as for single jobs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from starlette.requests import Request

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.http.auth import pick, who
from lancefn_jupyter.server.http.bodies import MAX_TIMEOUT_S, Body, is_arrow, parse, parse_query
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext, by_id, listing


class BatchCreate(Body):
    name: str
    version: str
    namespace: str | None = None  # which namespace's function (as for functions/run)
    chunks: Any = None  # a list of chunks, each a list of rows; checked against the signature by the control plane
    # Arrow chunks a local client wrote into $HOME/data/uploads/ (one record batch per chunk)
    rows_file: str | None = None
    parallel: int | None = Field(None, ge=1)  # None: as many as the class has GPUs ("auto")
    retries: int = Field(0, ge=0, le=10)
    fresh: bool = False
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    init: Any = None  # a class entry's initialization values for every chunk (checked by the control plane)


class BatchId(Body):
    batch_id: str


class BatchDescribe(Body):
    batch_id: str
    include_chunks: bool = True


class BatchWait(Body):
    batch_id: str
    timeout_s: float = Field(30.0, ge=0, le=60)
    revision: int | None = None  # return as soon as the batch is newer than this


class ListBatches(Body):
    state: Literal["PENDING", "IN_PROGRESS", "DONE", "FAILED", "CANCELLED"] | None = None
    name: str | None = None
    limit: int = Field(100, ge=1, le=1000)


_QUERY_JSON = ("parallel", "retries", "fresh", "timeout_s", "init")  # JSON values in an Arrow batch's query string


def add_routes(router: Router, ctx: RouteContext) -> None:
    manager = ctx.plane.batches

    async def create(request: Request, params: BatchCreate, chunks: Any, arrow_rows: Path | None) -> dict:
        return await off_loop(
            manager.create,
            params.name,
            params.version,
            chunks,
            parallel=params.parallel,
            retries=params.retries,
            timeout_s=params.timeout_s,
            fresh=params.fresh,
            arrow_rows=arrow_rows,
            init=params.init,
            **pick(request, params.namespace),
        )

    @router.post("/v1/batches/create", privilege="functions", status_code=202)
    async def create_batch(request: Request) -> dict:
        if is_arrow(request.headers.get("content-type")):
            return await _create_batch_arrow(request)
        body = await parse(request, BatchCreate)
        arrow_rows = ctx.bodies.upload(body.rows_file) if body.rows_file is not None else None
        try:
            return await create(request, body, body.chunks, arrow_rows)
        finally:
            if arrow_rows is not None:  # its chunks are stored with the batch
                arrow_rows.unlink(missing_ok=True)

    async def _create_batch_arrow(request: Request) -> dict:
        """Chunks as one Arrow IPC stream body, one record batch per chunk; the other fields in the query string."""
        query = request.query_params
        fields: dict[str, Any] = {k: query[k] for k in ("name", "version", "namespace") if k in query}
        params = parse_query(BatchCreate, fields, "an Arrow batch", query, _QUERY_JSON)
        async with ctx.bodies.arrow_body(request) as rows_file:
            return await create(request, params, None, rows_file)

    @router.post("/v1/batches/describe", privilege="jobs")
    async def describe_batch(request: Request) -> dict:
        body = await parse(request, BatchDescribe)
        return await off_loop(
            manager.describe, body.batch_id, include_chunks=body.include_chunks, scope=who(request).scope
        )

    router.post("/v1/batches/list", privilege="jobs")(listing(ListBatches, manager.list, "list_batches"))
    router.post("/v1/batches/cancel", privilege="jobs")(by_id(BatchId, "batch_id", manager.cancel, "cancel_batch"))
    router.post("/v1/batches/retry", privilege="functions")(by_id(BatchId, "batch_id", manager.retry, "retry_batch"))
    router.post("/v1/batches/pause", privilege="jobs")(by_id(BatchId, "batch_id", manager.pause, "pause_batch"))
    router.post("/v1/batches/resume", privilege="jobs")(by_id(BatchId, "batch_id", manager.resume, "resume_batch"))

    @router.post("/v1/batches/wait", privilege="jobs")
    async def wait_batch(request: Request) -> dict:
        body = await parse(request, BatchWait)
        return await manager.wait(body.batch_id, body.timeout_s, body.revision, who(request).scope)
