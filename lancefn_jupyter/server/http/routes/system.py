"""``/v1/health`` (the one route without a key) and ``/v1/gpu/*`` (``system_usage``): what the
control plane is and what its GPUs do (docs/ARCHITECTURE.md, "REST API (v1)")."""

from __future__ import annotations

from starlette.requests import Request

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext


def add_routes(router: Router, ctx: RouteContext) -> None:
    plane = ctx.plane

    @router.get("/v1/health", privilege=None)
    async def health(request: Request) -> dict:
        return {"status": "ok", "version": plane.version, "executor": plane.table.executor_name}

    @router.get("/v1/gpu/classes", privilege="system_usage")
    async def gpu_classes(request: Request) -> dict:
        return plane.reports.gpu_classes()

    @router.get("/v1/gpu/usage", privilege="system_usage")
    async def gpu_usage(request: Request) -> dict:
        return await off_loop(plane.reports.gpu_usage)
