"""The control plane's ASGI app (docs/ARCHITECTURE.md, "REST API (v1)" and "REST details"): the
route modules in ``routes/`` on the router (``router.py``) under the guard (``guard.py``), and the
lifespan that starts and stops the control plane.  Runs in the control plane's server process.

Nothing a client sends may stall the server for others: the guard checks the key before the
body and bounds it; the routes run control-plane work on core threads (``control/offload.py``, ``off_loop``) so
health checks, SSE streams and other clients stay live.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.server.control.artifact_check import CheckTurns
from lancefn_jupyter.server.control.catalog import DEFAULT_MAX_ARTIFACT_BYTES
from lancefn_jupyter.server.http.auth import KeyRing
from lancefn_jupyter.server.http.bodies import ArrowBodies
from lancefn_jupyter.server.http.caps import ClientCaps
from lancefn_jupyter.server.http.fastpath import FastPath
from lancefn_jupyter.server.http.guard import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, Guard
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes import backfills, batches, events, functions, jobs, secrets, system
from lancefn_jupyter.server.http.routes.context import RouteContext
from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.policy.namespaces import Principal

__all__ = ["App", "create_app"]

DEFAULT_MAX_ARROW_BODY_BYTES = 4 * 1024**3  # Arrow rows stream to a file, never into memory


@dataclass(frozen=True)
class App:
    """The ASGI app: every request passes the guard, which serves the direct routes and hands the
    rest to the router."""

    guard: Guard
    router: Router
    title: str
    version: str

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.guard(scope, receive, send)

    def openapi(self) -> dict:
        """The routes' OpenAPI outline (``Router.openapi``)."""
        return self.router.openapi(self.title, self.version)


def create_app(
    plane: ControlPlane,
    *,
    api_keys: dict[str, Principal],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_arrow_body_bytes: int = DEFAULT_MAX_ARROW_BODY_BYTES,
    fast_path: bool = True,
    caps: ClientCaps | None = None,
) -> App:
    """The ASGI app; ``api_keys`` maps each accepted key to its :class:`Principal`.
    ``fast_path`` False: the direct routes too go through the router (the parity test compares both).
    ``caps``: the per-key and per-peer caps (``--max-bodies-per-key`` ...)."""
    caps = caps or ClientCaps()
    plane.catalog.max_artifact_bytes = max_artifact_bytes

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        plane.attach_loop(asyncio.get_running_loop())
        plane.start()
        try:
            yield
        finally:
            plane.begin_shutdown()
            await asyncio.get_running_loop().run_in_executor(None, plane.shutdown)
            plane.attach_loop(None)

    keys = KeyRing(api_keys)
    router = Router(keys, lifespan)
    bodies = ArrowBodies(plane.data, body_timeout_s=body_timeout_s, max_arrow_body_bytes=max_arrow_body_bytes)
    # A large artifact waiting for its check holds its body in memory: --max-bodies-per-key bounds those too.
    checks = CheckTurns(caps.bodies_per_key, "--max-bodies-per-key")
    ctx = RouteContext(plane, keys, bodies, FastPath(keys, enabled=fast_path), checks)
    for module in (system, functions, jobs, batches, backfills, events, secrets):
        module.add_routes(router, ctx)
    guard = Guard(
        router,
        max_body_bytes=max_body_bytes,
        keys=keys,
        body_timeout_s=body_timeout_s,
        fastpath=ctx.fastpath,
        caps=caps,
        stream_paths=frozenset({events.EVENTS_PATH}),
    )
    return App(guard, router, "lancefn control plane", plane.version)
