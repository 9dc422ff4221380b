"""The direct-route fast path (docs/ARCHITECTURE.md, "REST details"): hot JSON POST routes
(running a job, waiting for one) that the guard serves itself from the body it already holds,
skipping FastAPI's routing, dependencies and serialisation (about a third of such a request's
time on the event loop).  Runs in the control plane's server process, on the event loop.

Each direct route is a FastAPI route too, for what the guard does not buffer (Arrow bodies) and
so other methods get 405; both paths check the same key and privilege and answer errors with the
same envelope (``tests/test_fastpath_parity.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import KeyRing, who
from lancefn_jupyter.server.http.errors import last_resort
from lancefn_jupyter.server.policy.namespaces import Principal

# A JSON POST route's work: the caller and the raw body in, the reply's JSON out.
Handler = Callable[[Principal, bytes], Awaitable[Any]]
# The guard's error reply: (status, code, message).
Reply = Callable[[int, str, str], Awaitable[None]]


@dataclass(frozen=True)
class DirectRoute:
    """A hot JSON POST route the guard serves itself (see :meth:`FastPath.post`)."""

    privilege: str
    handler: Handler
    status_code: int


class FastPath:
    """The direct routes by path; ``enabled`` False leaves every request to FastAPI."""

    def __init__(self, keys: KeyRing, *, enabled: bool = True) -> None:
        self.keys, self.enabled = keys, enabled
        self._routes: dict[str, DirectRoute] = {}

    def post(
        self,
        app: Any,
        path: str,
        privilege: str,
        handler: Handler,
        status_code: int = 200,
        route: Callable[[Request], Awaitable[Any]] | None = None,
    ) -> None:
        """Serve ``handler`` on the fast path and as a FastAPI route: ``route``, or ``handler`` on the body."""
        if self.enabled:
            self._routes[path] = DirectRoute(privilege, handler, status_code)

        async def body_route(request: Request) -> Any:
            return await handler(who(request), await request.body())

        app.post(path, status_code=status_code, dependencies=[self.keys.require(privilege)], name=handler.__name__)(
            route or body_route
        )

    def route(self, method: str, path: str) -> DirectRoute | None:
        """The direct route serving this request, if any."""
        return self._routes.get(path) if method == "POST" else None

    async def serve(self, route: DirectRoute, scope: dict, headers: dict, body: bytes, reply: Reply, send: Any) -> None:
        """A direct route's reply, errors as the app's handlers would answer them."""
        try:
            caller = self.keys.authorize(headers.get(b"x-api-key"), route.privilege, scope["path"])
            content = await route.handler(caller, body)
        except ApiError as error:
            await reply(error.status, error.code, error.message)
            return
        except Exception as error:
            await reply(*last_resort(scope, scope["state"]["request_id"], error))
            return
        # What ``JSONResponse`` sends (the same JSON, content-length and content-type), without building one.
        body = dumps(content).encode("utf-8")
        head = [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": route.status_code, "headers": head})
        await send({"type": "http.response.body", "body": body})
