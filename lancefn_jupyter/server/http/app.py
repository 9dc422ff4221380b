"""The control plane's ASGI app (docs/ARCHITECTURE.md, "REST API (v1)" and "REST details"): the
route modules in ``routes/`` composed under the guard (``guard.py``) and the error handlers
(``errors.py``), and the lifespan that starts and stops the control plane.  Runs in the control
plane's server process.

Nothing a client sends may stall the server for others: the guard checks the key before the
body and bounds it; the routes run control-plane work on core threads (``offload.off_loop``) so
health checks, SSE streams and other clients stay live.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from lancefn_jupyter.server.control.catalog import DEFAULT_MAX_ARTIFACT_BYTES
from lancefn_jupyter.server.http.auth import KeyRing
from lancefn_jupyter.server.http.bodies import ArrowBodies
from lancefn_jupyter.server.http.errors import add_error_handlers
from lancefn_jupyter.server.http.fastpath import FastPath
from lancefn_jupyter.server.http.guard import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, Guard
from lancefn_jupyter.server.http.routes import backfills, batches, events, functions, jobs, system
from lancefn_jupyter.server.http.routes.context import RouteContext
from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.policy.namespaces import Principal

__all__ = ["create_app"]

DEFAULT_MAX_ARROW_BODY_BYTES = 4 * 1024**3  # Arrow rows stream to a file, never into memory


def create_app(
    plane: ControlPlane,
    *,
    api_keys: dict[str, Principal],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_arrow_body_bytes: int = DEFAULT_MAX_ARROW_BODY_BYTES,
    fast_path: bool = True,
) -> FastAPI:
    """The ASGI app; ``api_keys`` maps each accepted key to its :class:`Principal`.
    ``fast_path`` False: the direct routes too go through FastAPI (the parity test compares both)."""
    plane.catalog.max_artifact_bytes = max_artifact_bytes

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        plane.attach_loop(asyncio.get_running_loop())
        plane.start()
        try:
            yield
        finally:
            plane.begin_shutdown()
            await asyncio.get_running_loop().run_in_executor(None, plane.shutdown)
            plane.attach_loop(None)

    app = _GuardedApp(
        title="lancefn control plane",
        version=plane.version,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # no unauthenticated routes besides /v1/health
        lifespan=lifespan,
    )
    keys = KeyRing(api_keys)
    bodies = ArrowBodies(plane.data, body_timeout_s=body_timeout_s, max_arrow_body_bytes=max_arrow_body_bytes)
    ctx = RouteContext(plane, keys, bodies, FastPath(keys, enabled=fast_path))
    app.guard = Guard(
        app.unguarded, max_body_bytes=max_body_bytes, keys=keys, body_timeout_s=body_timeout_s, fastpath=ctx.fastpath
    )
    add_error_handlers(app)
    for module in (system, functions, jobs, batches, backfills, events):
        module.add_routes(app, ctx)
    return app


class _GuardedApp(FastAPI):
    """FastAPI with the guard in front of all of it rather than as one of its middlewares: a direct
    route's request then never passes FastAPI's own middleware stack (its error, telemetry and
    body-limit layers: a third of such a request's time on the event loop), and the guard's limits
    hold before any of FastAPI's code runs."""

    guard: Guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.guard(scope, receive, send)  # type: ignore[arg-type]  # an ASGI scope is a dict

    async def unguarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
