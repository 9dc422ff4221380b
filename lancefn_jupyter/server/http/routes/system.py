"""``/v1/health`` (the one route without a key) and ``/v1/gpu/*`` (``system_usage``): what the
control plane is and what its GPUs do (docs/ARCHITECTURE.md, "REST API (v1)")."""

from __future__ import annotations

from fastapi import FastAPI

from lancefn_jupyter.server.http.offload import off_loop
from lancefn_jupyter.server.http.routes.context import RouteContext


def add_routes(app: FastAPI, ctx: RouteContext) -> None:
    plane = ctx.plane
    usage = [ctx.require("system_usage")]

    @app.get("/v1/health")
    async def health() -> dict:
        return {"status": "ok", "version": plane.version, "executor": plane.table.executor_name}

    @app.get("/v1/gpu/classes", dependencies=usage)
    async def gpu_classes() -> dict:
        return plane.reports.gpu_classes()

    @app.get("/v1/gpu/usage", dependencies=usage)
    async def gpu_usage() -> dict:
        return await off_loop(plane.reports.gpu_usage)
