"""What the route modules are built over (``RouteContext``) and the two route shapes several of
them share (``by_id``, ``listing``).  Runs in the control plane's server process.

Routes call the control plane's parts, read as plain attributes of the plane (``plane.machine``,
``plane.jobs``, ``plane.catalog`` ...): the plane is the one composition root, so the context
carries it rather than a second list of the same parts, and the plane itself has no request
methods a route could call instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request

from lancefn_jupyter.server.control.artifact_check import CheckTurns
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.http.auth import KeyRing, who
from lancefn_jupyter.server.http.bodies import ArrowBodies, Body, parse
from lancefn_jupyter.server.http.fastpath import FastPath
from lancefn_jupyter.server.plane import ControlPlane


@dataclass(frozen=True)
class RouteContext:
    """The plane, the accepted keys, where Arrow bodies go, the direct routes, and the turns at the artifact
    checker's children."""

    plane: ControlPlane
    keys: KeyRing
    bodies: ArrowBodies
    fastpath: FastPath
    checks: CheckTurns


def by_id(
    model: type[Body], field: str, method: Callable[[str, str | None], dict], name: str
) -> Callable[..., Awaitable[dict]]:
    """A route (``name``) doing ``method(<the body's id field>, <the caller's scope>)`` to one job or batch."""

    async def route(request: Request) -> dict:
        body = await parse(request, model)
        return await off_loop(method, getattr(body, field), who(request).scope)

    route.__name__ = name
    return route


def listing(model: type[Body], method: Callable[..., dict], name: str) -> Callable[..., Awaitable[dict]]:
    """A route (``name``) listing within the caller's scope: ``method(**<the body's filters>, scope=...)``."""

    async def route(request: Request) -> dict:
        body = await parse(request, model)
        return await off_loop(method, **body.model_dump(), scope=who(request).scope)

    route.__name__ = name
    return route
