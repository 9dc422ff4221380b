"""``/v1/backfills/*``: a function's results written into a Lance table column by the control plane
(docs/ARCHITECTURE.md, "Backfills"). A backfill is a batch: describe, wait, cancel and retry it with
``/v1/batches/*``.

Creating needs the ``functions`` privilege (it runs code); listing skipped rows needs ``jobs``.
"""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.http.auth import pick, who
from lancefn_jupyter.server.http.bodies import Body, parse
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext
from lancefn_jupyter.wire.backfill_models import BackfillRequest

BackfillCreate = BackfillRequest  # the create body: a wire model, checked there ("Backfills")


class BackfillErrors(Body):
    batch_id: str
    offset: int = Field(0, ge=0)
    limit: int = Field(1000, ge=1, le=10_000)


def add_routes(router: Router, ctx: RouteContext) -> None:
    manager = ctx.plane.batches

    @router.post("/v1/backfills/create", privilege="functions", status_code=202)
    async def create_backfill(request: Request) -> dict:
        body: BackfillRequest = await parse(request, BackfillRequest)
        return await off_loop(manager.create_backfill, body, **pick(request, body.namespace))

    @router.post("/v1/backfills/errors", privilege="jobs")
    async def backfill_errors(request: Request) -> dict:
        body = await parse(request, BackfillErrors)
        return await off_loop(manager.backfill_errors, body.batch_id, body.offset, body.limit, who(request).scope)
