"""``/v1/backfills/*``: a function's results written into a Lance table column by the control plane
(docs/ARCHITECTURE.md, "Backfills"). A backfill is a batch: describe, wait, cancel and retry it with
``/v1/batches/*``.

Creating needs the ``functions`` privilege (it runs code); listing skipped rows needs ``jobs``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from starlette.requests import Request

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.http.auth import pick, who
from lancefn_jupyter.server.http.bodies import MAX_TIMEOUT_S, Body, parse
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext


class BackfillCreate(Body):
    name: str
    version: str
    namespace: str | None = None  # which namespace's function (as for functions/run)
    table_uri: str = Field(min_length=1)  # the Lance dataset: a LanceDB table's directory (…/<name>.lance)
    into: str = Field(min_length=1)
    # {param: column}, [column, …] by position, or omitted (the parameters named like table columns)
    columns: dict[str, str] | list[str] | str | None = None
    where: str | None = None
    recompute: str = "missing"
    on_error: str = "fail"
    max_skip_fraction: float = Field(0.01, ge=0, le=1)
    chunk_size: int | None = Field(None, ge=1)
    parallel: int | None = Field(None, ge=1)  # None: as many as the class has GPUs ("auto")
    retries: int = Field(0, ge=0, le=10)
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    fresh: bool = False  # accepted for symmetry with batches: a backfill always plans its rows anew


class BackfillErrors(Body):
    batch_id: str
    offset: int = Field(0, ge=0)
    limit: int = Field(1000, ge=1, le=10_000)


_REQUEST = ("table_uri", "into", "columns", "where", "recompute", "on_error", "max_skip_fraction", "chunk_size")


def add_routes(router: Router, ctx: RouteContext) -> None:
    manager = ctx.plane.batches

    @router.post("/v1/backfills/create", privilege="functions", status_code=202)
    async def create_backfill(request: Request) -> dict:
        body = await parse(request, BackfillCreate)
        fields: dict[str, Any] = {key: getattr(body, key) for key in _REQUEST}
        return await off_loop(
            manager.create_backfill,
            body.name,
            body.version,
            fields,
            parallel=body.parallel,
            retries=body.retries,
            timeout_s=body.timeout_s,
            **pick(request, body.namespace),
        )

    @router.post("/v1/backfills/errors", privilege="jobs")
    async def backfill_errors(request: Request) -> dict:
        body = await parse(request, BackfillErrors)
        return await off_loop(manager.backfill_errors, body.batch_id, body.offset, body.limit, who(request).scope)
