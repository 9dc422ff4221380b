"""The direct-route fast path (docs/ARCHITECTURE.md, "REST details"): hot JSON POST routes
(running a job, waiting for one) that the guard serves itself from the body it already holds,
skipping the router, the request object and the replay of the body.  Runs in the control plane's
server process, on the event loop.

Each direct route is a router route too, for what the guard does not buffer (Arrow bodies) and
so other methods get 405; both paths check the same key and privilege and answer errors with the
same envelope (``tests/server/http/test_fastpath_parity.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import KeyRing, who
from lancefn_jupyter.server.http.errors import last_resort
from lancefn_jupyter.server.http.router import Router, send_json
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
    """The direct routes by path; ``enabled`` False leaves every request to the router."""

    def __init__(self, keys: KeyRing, *, enabled: bool = True) -> None:
        self.keys, self.enabled = keys, enabled
        self._routes: dict[str, DirectRoute] = {}

    def post(
        self,
        router: Router,
        path: str,
        privilege: str,
        handler: Handler,
        status_code: int = 200,
        route: Callable[[Request], Awaitable[Any]] | None = None,
    ) -> None:
        """Serve ``handler`` on the fast path and as a router route: ``route``, or ``handler`` on the body."""
        if self.enabled:
            self._routes[path] = DirectRoute(privilege, handler, status_code)

        async def body_route(request: Request) -> Any:
            return await handler(who(request), await request.body())

        body_route.__name__ = handler.__name__
        router.post(path, privilege=privilege, status_code=status_code)(route or body_route)

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
        await send_json(send, route.status_code, content)
