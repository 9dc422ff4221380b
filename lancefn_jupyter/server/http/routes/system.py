"""``/v1/health`` (the one route without a key) and ``/v1/gpu/*`` (``system_usage``): what the
control plane is and what its GPUs do (docs/ARCHITECTURE.md, "REST API (v1)")."""

from __future__ import annotations

from fastapi import FastAPI

from lancefn_jupyter.server.http.routes.common import RouteContext, off_loop


def add_routes(app: FastAPI, ctx: RouteContext) -> None:
    core = ctx.core
    usage = [ctx.require("system_usage")]

    @app.get("/v1/health")
    async def health() -> dict:
        return {"status": "ok", "version": core.version, "executor": core.executor_name}

    @app.get("/v1/gpu/classes", dependencies=usage)
    async def gpu_classes() -> dict:
        return core.gpu_classes()

    @app.get("/v1/gpu/usage", dependencies=usage)
    async def gpu_usage() -> dict:
        return await off_loop(core.gpu_usage)
