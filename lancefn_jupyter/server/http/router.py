"""The control plane's router (docs/ARCHITECTURE.md, "REST details"): which handler serves a method
and path, the route's key check, the reply, and the lifespan.  Pure ASGI under the guard; runs in the
control plane's server process, on the event loop.

Every route is a fixed path taking a JSON body (POST) or a few query parameters (GET), and every
body is parsed by hand (``bodies.py``, so the key is checked before the body), so a dictionary does
the routing; a path with one ``{name}`` segment (LanceDB's ``/v1/function/{id}/create``) is looked up
by its fixed parts when no fixed path matches, its segment handed over as ``request.path_params``.  FastAPI's import, OpenAPI models and route analysis were a third of the server's start
(ready at 593 ms with it, 392 ms without, alternated on one host) and a share of every request.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import KeyRing
from lancefn_jupyter.server.http.errors import envelope, request_id

# A route's work: the request in, the reply's JSON (or a whole response, e.g. a stream) out.
Handler = Callable[[Request], Awaitable[Any]]
Lifespan = Callable[[], contextlib.AbstractAsyncContextManager[None]]

NO_SUCH_ENDPOINT = "no such endpoint; see the API reference for /v1 routes"


@dataclass(frozen=True)
class Route:
    """One method and path: its handler, the privilege its key needs (None: no key, /v1/health only),
    the reply's status, and the query parameters it reads (``(name, required)``, for the API document)."""

    method: str
    path: str
    handler: Handler
    privilege: str | None
    status_code: int = 200
    query: tuple[tuple[str, bool], ...] = ()

    @property
    def name(self) -> str:
        return self.handler.__name__


class Router:
    """The routes by path and method; unknown paths answer 404, other methods 405, both as the envelope."""

    def __init__(self, keys: KeyRing, lifespan: Lifespan) -> None:
        self.keys, self.lifespan = keys, lifespan
        self._paths: dict[str, dict[str, Route]] = {}
        # Templates with one {name} segment: (prefix, suffix) → (name, the template's path in _paths).
        self._templates: dict[tuple[str, str], tuple[str, str]] = {}

    @property
    def routes(self) -> list[Route]:
        return [route for methods in self._paths.values() for route in methods.values()]

    def get(self, path: str, *, privilege: str | None, query: tuple[tuple[str, bool], ...] = ()) -> Any:
        """Decorator: serve ``GET path`` with the handler."""
        return self._add("GET", path, privilege, 200, query)

    def post(self, path: str, *, privilege: str, status_code: int = 200) -> Any:
        """Decorator: serve ``POST path`` (a JSON or Arrow body) with the handler."""
        return self._add("POST", path, privilege, status_code, ())

    def _add(self, method: str, path: str, privilege: str | None, status: int, query: tuple) -> Any:
        if "{" in path:
            prefix, rest = path.split("{", 1)
            name, suffix = rest.split("}", 1)
            self._templates[(prefix, suffix)] = (name, path)

        def register(handler: Handler) -> Handler:
            methods = self._paths.setdefault(path, {})
            if method in methods:
                raise ValueError(f"{method} {path} is served twice")
            methods[method] = Route(method, path, handler, privilege, status, query)
            return handler

        return register

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets: uvicorn closes the connection
        # A template's own spelling ("/v1/function/{id}/create", sent as is) is no fixed path: its segment is "{id}".
        fixed = self._paths.get(scope["path"]) if "{" not in scope["path"] else None
        methods = fixed or self._templated(scope)
        route = methods.get(scope["method"]) if methods else None
        try:
            if route is None:
                raise self._not_served(methods, scope["method"])
            if route.privilege is not None:
                sent = None
                for name, value in scope["headers"]:
                    if name == b"x-api-key":
                        sent = value  # the last one, as the guard reads it
                scope.setdefault("state", {})["principal"] = self.keys.authorize(sent, route.privilege, scope["path"])
            content = await route.handler(Request(scope, receive))
        except ApiError as error:
            content = envelope(error.status, error.code, error.message, request_id(scope))
            if route is None and methods:
                content.headers["allow"] = ", ".join(sorted(methods))
        except ClientDisconnect:
            return  # the client went away mid-body: nobody to answer
        if isinstance(content, Response):
            await content(scope, receive, send)
        else:
            await send_json(send, route.status_code, content)  # type: ignore[union-attr]  # None only on errors

    def _templated(self, scope: dict) -> dict[str, Route] | None:
        """The routes of the template ``scope``'s path fills (its one segment put in ``path_params``), or None."""
        path = scope["path"]
        for (prefix, suffix), (name, template) in self._templates.items():
            if path.startswith(prefix) and path.endswith(suffix) and len(path) > len(prefix) + len(suffix):
                segment = path[len(prefix) : len(path) - len(suffix)]
                if "/" not in segment:
                    scope["path_params"] = {name: segment}
                    return self._paths[template]
        return None

    @staticmethod
    def _not_served(methods: dict[str, Route] | None, method: str) -> ApiError:
        if not methods:
            return ApiError(404, NO_SUCH_ENDPOINT)
        allowed = " or ".join(sorted(methods))
        return ApiError(405, f"{method} is not allowed here; this endpoint takes {allowed}", code="method_not_allowed")

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """The ASGI lifespan protocol around ``self.lifespan()``: the plane starts before the first
        request and stops after the last."""
        await receive()  # lifespan.startup
        running = self.lifespan()
        try:
            await running.__aenter__()
        except Exception as error:
            await send({"type": "lifespan.startup.failed", "message": f"{type(error).__name__}: {error}"})
            return
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        try:
            await running.__aexit__(None, None, None)
        except Exception as error:
            await send({"type": "lifespan.shutdown.failed", "message": f"{type(error).__name__}: {error}"})
            return
        await send({"type": "lifespan.shutdown.complete"})

    def openapi(self, title: str, version: str) -> dict:
        """An OpenAPI 3.1 outline of the routes (paths, methods, path and query parameters, the key scheme); the
        request bodies are the pydantic models in ``routes/``.  Not served: no route but /v1/health
        answers without a key."""
        paths: dict[str, dict] = {}
        for route in self.routes:
            operation: dict[str, Any] = {
                "operationId": route.name,
                "responses": {str(route.status_code): {"description": "the reply's JSON"}},
            }
            parameters = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                for name in re.findall(r"{(\w+)}", route.path)  # a LanceDB 0.40 route's id segment
            ] + [
                {"name": name, "in": "query", "required": required, "schema": {"type": "string"}}
                for name, required in route.query
            ]
            if parameters:
                operation["parameters"] = parameters
            if route.privilege is None:
                operation["description"] = "needs no key"
            paths.setdefault(route.path, {})[route.method.lower()] = operation
        return {
            "openapi": "3.1.0",
            "info": {"title": title, "version": version},
            "paths": paths,
            "components": {"securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
            "security": [{"apiKey": []}],
        }


def query(request: Request, name: str) -> str:
    """A required query parameter; a 400 saying how to send it when it is missing."""
    value = request.query_params.get(name)
    if value is None:
        raise ApiError(400, f"invalid request: query.{name}: Field required (send ?{name}=... in the URL)")
    return value


async def send_json(send: Any, status: int, content: Any) -> None:
    """What a JSON response sends (the compact JSON, content-length and content-type), without building one."""
    body = dumps(content).encode("utf-8")
    head = [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
