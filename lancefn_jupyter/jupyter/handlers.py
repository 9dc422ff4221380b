"""Authenticated `jupyter_server` handlers under `<base_url>/lancefn/` proxying to the control plane.

- `GET  <base>/lancefn/status` → `{connected, url, embedded, source, version?, executor?, error?}`
  (URL without key).
- `GET|POST <base>/lancefn/api/v1/<path>` → the control plane's `/v1/<path>`, only for the
  allow-listed routes below, with `x-api-key` added here. The reply's status and JSON body are
  passed through; of its headers only `content-type` and `x-request-id`.
- `GET  <base>/lancefn/api/v1/jobs/events` → the Server-Sent Events stream, passed through chunk
  by chunk and flushed at once, resumable with `Last-Event-ID` (header, or `?last_event_id=`
  which `EventSource` reconnects made by the panel use).

An unreachable control plane is a 502 with `{"error": {"code": "control_plane_unreachable",
"message", "request_id"}}`. Every verb is `@tornado.web.authenticated`: no Jupyter token or login
cookie → 403. The control plane's API key never appears in a reply (it is also scrubbed from any
body that would echo it).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlencode

import httpx
import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado.iostream import StreamClosedError

from lancefn_jupyter.jupyter.discovery import ControlPlaneTarget, DiscoveryError, discover

__all__ = ["ALLOWED_ROUTES", "ControlPlaneResolver", "setup_handlers"]

#: route (below /v1/) → allowed HTTP methods. Everything else is 404 here.
ALLOWED_ROUTES: dict[str, frozenset[str]] = {
    "health": frozenset({"GET"}),
    "gpu/classes": frozenset({"GET"}),
    "gpu/usage": frozenset({"GET"}),
    "functions/list": frozenset({"POST"}),
    "functions/describe": frozenset({"POST"}),
    "functions/history": frozenset({"POST"}),  # the panel's version rows (one-line changes)
    "functions/diff": frozenset({"POST"}),  # the panel's Diff button
    "jobs/list": frozenset({"POST"}),
    "jobs/describe": frozenset({"POST"}),
    "jobs/cancel": frozenset({"POST"}),
    "jobs/logs": frozenset({"POST"}),
    "jobs/events": frozenset({"GET"}),
    "batches/list": frozenset({"POST"}),
    "batches/describe": frozenset({"POST"}),
    "batches/cancel": frozenset({"POST"}),
    "batches/pause": frozenset({"POST"}),  # the panel's Pause / Resume button
    "batches/resume": frozenset({"POST"}),
}

#: Largest request body forwarded (the allow-listed routes take small JSON objects).
MAX_BODY_BYTES = 1 << 20

_SETTINGS_KEY = "lancefn_jupyter"
_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=10.0, pool=5.0)
_STREAM_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=10.0, pool=5.0)
# As the control plane: printable ASCII, no spaces (httpx cannot even send anything else).
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")
# Query parameters that belong to Jupyter, never forwarded.
_JUPYTER_PARAMS = frozenset({"token", "_xsrf"})


class ControlPlaneResolver:
    """Caches the discovered target; rediscovers after a connection failure (the embedded server
    may have been restarted on another port). Discovery runs in a thread: it may start a server."""

    def __init__(self, discover_fn: Callable[[], ControlPlaneTarget] = discover) -> None:
        self._discover = discover_fn
        self._target: ControlPlaneTarget | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> ControlPlaneTarget:
        if self._target is not None:
            return self._target
        async with self._lock:
            target = self._target
            if target is None:
                loop = asyncio.get_running_loop()
                target = await loop.run_in_executor(None, self._discover)
                self._target = target
            return target

    def invalidate(self) -> None:
        self._target = None


class _State:
    def __init__(self) -> None:
        self.resolver = ControlPlaneResolver()
        self.client = httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False)


def _scrub(data: bytes, secret: str | None) -> bytes:
    if secret and secret.encode() in data:
        return data.replace(secret.encode(), b"***")
    return data


class _LancefnHandler(APIHandler):
    @property
    def _state(self) -> _State:
        return self.settings[_SETTINGS_KEY]

    def _request_id(self) -> str:
        rid = self.request.headers.get("x-request-id", "")
        return rid if _REQUEST_ID.fullmatch(rid) else uuid.uuid4().hex

    async def prepare(self, **kwargs: Any) -> None:
        await super().prepare(**kwargs)
        if self._finished or not self.current_user:
            return  # @tornado.web.authenticated answers an anonymous request, whatever its headers
        # Headers forwarded upstream must be ASCII, or httpx fails with a UnicodeEncodeError (a 500).
        rid = self.request.headers.get("x-request-id")
        if rid is not None and not _REQUEST_ID.fullmatch(rid):
            self._error(
                400,
                "invalid_request",
                "X-Request-Id must be 1-200 printable ASCII characters without spaces; fix or omit it",
            )
            return
        last = self.request.headers.get("Last-Event-ID")
        if last and not (last.isascii() and last.isdigit()):
            self._error(400, "invalid_request", "Last-Event-ID must be a non-negative integer event id; fix or omit it")

    def _error(self, status: int, code: str, message: str, request_id: str | None = None) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(
            json.dumps({"error": {"code": code, "message": message, "request_id": request_id or self._request_id()}})
        )

    def _unreachable(self, target: ControlPlaneTarget | None, exc: BaseException) -> None:
        self._state.resolver.invalidate()
        message = f"control plane unreachable: {_describe(exc, target)}"
        message = _scrub(message.encode(), target.api_key if target else None).decode()
        self.log.warning("lancefn: %s", message)
        self._error(502, "control_plane_unreachable", message)


def _describe(exc: BaseException, target: ControlPlaneTarget | None = None) -> str:
    """A one-line reason for the browser (no traceback, no key)."""
    if isinstance(exc, DiscoveryError):
        return str(exc)
    text = str(exc) or type(exc).__name__
    text = text if len(text) < 500 else text[:500] + "…"
    where = target.public_dict()["url"] if target is not None else "the control plane"
    if isinstance(exc, httpx.TimeoutException):
        return f"{where} did not answer in time ({type(exc).__name__})"
    if isinstance(exc, (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError)):
        return f"cannot connect to {where} ({text})"
    return f"{where}: {text}"


def _upstream_headers(target: ControlPlaneTarget, request_id: str, extra: dict | None = None) -> dict:
    headers = {"x-request-id": request_id, "accept": "application/json"}
    if target.api_key:
        headers["x-api-key"] = target.api_key
    if extra:
        headers.update(extra)
    return headers


def _upstream_url(target: ControlPlaneTarget, path: str, query: str = "") -> str:
    params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in _JUPYTER_PARAMS]
    url = f"{target.url}/v1/{path}"
    return f"{url}?{urlencode(params)}" if params else url


class StatusHandler(_LancefnHandler):
    """`GET <base>/lancefn/status`: which control plane, and does it answer its health check."""

    @tornado.web.authenticated
    async def get(self) -> None:
        state = self._state
        try:
            target = await state.resolver.get()
        except Exception as exc:
            state.resolver.invalidate()
            self.finish({"connected": False, "url": None, "embedded": None, "error": _describe(exc)})
            return
        reply: dict[str, Any] = {"connected": False, **target.public_dict()}
        try:
            response = await state.client.get(
                f"{target.url}/v1/health",
                headers=_upstream_headers(target, self._request_id()),
                timeout=httpx.Timeout(3.0),
            )
        except httpx.HTTPError as exc:
            state.resolver.invalidate()
            reply["error"] = _scrub(_describe(exc, target).encode(), target.api_key).decode()
        else:
            if response.status_code == 200:
                reply["connected"] = True
                try:
                    health = response.json()
                except ValueError:
                    health = {}
                if isinstance(health, dict):
                    for key in ("version", "executor"):
                        if isinstance(health.get(key), str):
                            reply[key] = health[key]
            else:
                reply["error"] = f"health check answered HTTP {response.status_code}"
        self.finish(reply)


class ProxyHandler(_LancefnHandler):
    """`<base>/lancefn/api/v1/<path>` → control plane `/v1/<path>` (allow-listed)."""

    _stream_task: asyncio.Future | None = None

    def _route(self, path: str) -> str | None:
        path = path.strip("/")
        allowed = ALLOWED_ROUTES.get(path)
        if allowed is None:
            self._error(404, "not_found", f"/lancefn/api/v1/{path} is not proxied by the lancefn server extension")
            return None
        if self.request.method not in allowed:
            self.set_header("Allow", ", ".join(sorted(allowed)))
            self._error(405, "method_not_allowed", f"{self.request.method} is not allowed on /v1/{path}")
            return None
        return path

    @tornado.web.authenticated
    async def get(self, path: str) -> None:
        route = self._route(path)
        if route is None:
            return
        if route == "jobs/events":
            await self._stream_events()
        else:
            await self._forward(route)

    @tornado.web.authenticated
    async def post(self, path: str) -> None:
        route = self._route(path)
        if route is None:
            return
        await self._forward(route)

    async def _target(self) -> ControlPlaneTarget | None:
        try:
            return await self._state.resolver.get()
        except Exception as exc:
            self._unreachable(None, exc)
            return None

    async def _forward(self, route: str) -> None:
        body = self.request.body or b""
        if len(body) > MAX_BODY_BYTES:
            self._error(413, "payload_too_large", f"request body over {MAX_BODY_BYTES} bytes")
            return
        target = await self._target()
        if target is None:
            return
        request_id = self._request_id()
        extra = {"content-type": "application/json"} if self.request.method == "POST" else None
        try:
            response = await self._state.client.request(
                self.request.method,
                _upstream_url(target, route, self.request.query),
                headers=_upstream_headers(target, request_id, extra),
                content=body if self.request.method == "POST" else None,
            )
        except httpx.HTTPError as exc:
            self._unreachable(target, exc)
            return
        self.set_status(response.status_code)
        self.set_header("Content-Type", response.headers.get("content-type", "application/json"))
        self.set_header("x-request-id", response.headers.get("x-request-id", request_id))
        self.finish(_scrub(response.content, target.api_key))

    async def _stream_events(self) -> None:
        target = await self._target()
        if target is None:
            return
        request_id = self._request_id()
        extra = {"accept": "text/event-stream", "accept-encoding": "identity", "cache-control": "no-cache"}
        last_event_id = self.request.headers.get("Last-Event-ID")
        if last_event_id:
            extra["last-event-id"] = last_event_id
        url = _upstream_url(target, "jobs/events", self.request.query)
        self._stream_task = asyncio.ensure_future(self._pump(target, url, _upstream_headers(target, request_id, extra)))
        try:
            await self._stream_task
        except asyncio.CancelledError:
            # The browser went away (on_connection_close); the upstream stream is closed with it.
            pass
        except StreamClosedError:
            pass

    async def _pump(self, target: ControlPlaneTarget, url: str, headers: dict) -> None:
        try:
            async with self._state.client.stream("GET", url, headers=headers, timeout=_STREAM_TIMEOUT) as response:
                if response.status_code != 200:
                    body = await response.aread()
                    self.set_status(response.status_code)
                    self.set_header("Content-Type", response.headers.get("content-type", "application/json"))
                    self.finish(_scrub(body, target.api_key))
                    return
                self.set_status(200)
                self.set_header("Content-Type", "text/event-stream; charset=utf-8")
                self.set_header("Cache-Control", "no-cache, no-transform")
                self.set_header("X-Accel-Buffering", "no")
                await self.flush()  # headers now: the browser's EventSource opens at once
                async for chunk in response.aiter_bytes():
                    if chunk:
                        self.write(_scrub(chunk, target.api_key))
                        await self.flush()
        except httpx.HTTPError as exc:
            if not self._headers_written:
                self._unreachable(target, exc)
                return
            # Mid-stream failure: end the stream; the panel reconnects with Last-Event-ID.
            self.log.info("lancefn: event stream from the control plane ended: %s", _describe(exc, target))
        if not self._finished:
            self.finish()

    def on_connection_close(self) -> None:
        task = self._stream_task
        if task is not None and not task.done():
            task.cancel()
        super().on_connection_close()


def setup_handlers(web_app: Any) -> list[str]:
    """Registers the handlers; returns their URL patterns (tests enumerate them)."""
    web_app.settings.setdefault(_SETTINGS_KEY, _State())
    base_url = web_app.settings.get("base_url", "/")
    ns = url_path_join(base_url, "lancefn")
    handlers = [
        (url_path_join(ns, "status"), StatusHandler),
        (url_path_join(ns, "api", "v1", "(?P<path>.*)"), ProxyHandler),
    ]
    web_app.add_handlers(".*$", handlers)
    return [pattern for pattern, _ in handlers]
