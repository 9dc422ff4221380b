"""What every route module shares: authentication, body parsing, the caller's namespace, and
Arrow bodies streamed to a file (docs/ARCHITECTURE.md, "REST details").

Why bodies are parsed by hand rather than as FastAPI body parameters: FastAPI reads and
validates the body *before* running dependencies, so a request with a bad body and no key
would get 400 instead of 401.  Parsing inside the route keeps the order auth → validation.
Core work (JSON parsing, hashing, SQLite) runs on core threads via :func:`off_loop` so
health checks, SSE streams and other clients stay live.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import queue
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, Request
from pydantic import BaseModel, ConfigDict, ValidationError

from lancefn_jupyter.server.common import ApiError, format_validation_error
from lancefn_jupyter.server.control.catalog import Where
from lancefn_jupyter.server.plane import ControlPlane
from lancefn_jupyter.server.policy.namespaces import Principal
from lancefn_jupyter.wire.dataplane import MEDIA_TYPE as ARROW_STREAM

MISSING_KEY_MESSAGE = "missing or unknown API key; send it in the x-api-key header (see server.json for the local key)"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
MAX_TIMEOUT_S = 30 * 24 * 3600  # a job's timeout_s at most (30 days): timers can't take 1e300


class Body(BaseModel):
    """A request body: strict types, unknown fields ignored (older servers ignore newer fields)."""

    model_config = ConfigDict(extra="ignore", strict=True)


# A JSON POST route's work: the caller and the raw body in, the reply's JSON out.
Handler = Callable[[Principal, bytes], Awaitable[Any]]


@dataclass(frozen=True)
class DirectRoute:
    """A hot JSON POST route the app's guard serves itself (see :meth:`RouteContext.post_direct`)."""

    privilege: str
    handler: Handler
    status_code: int


@dataclass(frozen=True)
class RouteContext:
    """What the route modules are built over: the core, the accepted keys and the Arrow body limits."""

    core: ControlPlane
    api_keys: Mapping[str, Principal]
    body_timeout_s: float
    max_arrow_body_bytes: int
    direct: dict[str, DirectRoute] = field(default_factory=dict)  # path → route the guard serves itself

    def authorize(self, sent: bytes | None, privilege: str, path: str) -> Principal:
        """The principal of the ``x-api-key`` sent; a 401 if no key matches, a 403 if it lacks ``privilege``."""
        principal = None
        if sent:
            for key, granted in self.api_keys.items():  # every key compared: no early exit that times which one matched
                if hmac.compare_digest(sent, key.encode("utf-8")):
                    principal = granted
        if principal is None:
            raise ApiError(401, MISSING_KEY_MESSAGE)
        if privilege not in principal.privileges:
            raise ApiError(403, f"this API key lacks the '{privilege}' privilege needed for {path}")
        return principal

    def require(self, privilege: str) -> Any:
        """A dependency: the ``x-api-key`` must be known and grant ``privilege``; sets ``request.state.principal``."""

        async def check(request: Request) -> None:
            sent = request.headers.get("x-api-key")
            sent_bytes = sent.encode("utf-8", "surrogateescape") if sent else None
            request.state.principal = self.authorize(sent_bytes, privilege, request.url.path)

        return Depends(check)

    def post_direct(
        self,
        app: Any,
        path: str,
        privilege: str,
        handler: Handler,
        status_code: int = 200,
        route: Callable[[Request], Awaitable[Any]] | None = None,
    ) -> None:
        """A JSON POST route on the hot path (running a job, waiting for one): the app's guard,
        which already holds the checked key and the body, calls ``handler`` itself, skipping
        FastAPI's routing, dependencies and serialisation (about a third of such a request's
        time on the event loop).  It is a FastAPI route too, for what the guard does not buffer
        (Arrow bodies) and so other methods get 405: ``route``, or ``handler`` on the body."""
        self.direct[path] = DirectRoute(privilege, handler, status_code)

        async def body_route(request: Request) -> Any:
            return await handler(who(request), await request.body())

        app.post(path, status_code=status_code, dependencies=[self.require(privilege)], name=handler.__name__)(
            route or body_route
        )

    def upload(self, rows_file: str) -> Path:
        """A rows file a local client wrote into ``$HOME/data/uploads/``; a bad name is a 400."""
        try:
            return self.core.data.upload(rows_file)
        except ValueError as error:
            raise ApiError(400, str(error)) from None

    @contextlib.asynccontextmanager
    async def arrow_body(self, request: Request) -> AsyncIterator[Path]:
        """The request's Arrow IPC body streamed into a temp rows file (a 1 GB body never sits in
        the server's memory); the file is removed when the block ends."""
        tmp, _ = self.core.data.new_rows_file()
        try:
            await self._receive_arrow(request, tmp)
            yield tmp
        finally:
            tmp.unlink(missing_ok=True)

    async def _receive_arrow(self, request: Request, tmp: Path) -> None:
        size = 0
        chunks = request.stream()
        with open(tmp, "wb") as sink:
            while True:
                try:  # a stalled upload must not hold the connection: each chunk within the body timeout
                    chunk = await asyncio.wait_for(chunks.__anext__(), self.body_timeout_s)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise ApiError(
                        408,
                        f"the Arrow body stalled for {self.body_timeout_s:g}s; send it at once, or start "
                        "lancefn-server with a larger --body-timeout-s",
                        code="request_timeout",
                    ) from None
                size += len(chunk)
                if size > self.max_arrow_body_bytes:
                    raise ApiError(
                        413,
                        f"the Arrow body is larger than the server's limit of {self.max_arrow_body_bytes} "
                        "bytes (--max-arrow-body-bytes); send fewer rows per job",
                    )
                sink.write(chunk)


class _CoreThreads:
    """Daemon threads running core work for the event loop, at most ``limit`` at once (as many as
    Starlette's threadpool).  Plainer than its anyio hop (no capacity limiter, cancel scope or
    context copy): about half the event loop's time per call, and every request makes one."""

    def __init__(self, limit: int = 40) -> None:
        self._work: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future, Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._threads = self._unfinished = 0  # a call needs a new thread when every thread has one
        self._limit = limit

    def run(self, call: Callable[[], Any]) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            spawn = self._unfinished >= self._threads and self._threads < self._limit
            self._threads += spawn
            self._unfinished += 1
        if spawn:
            threading.Thread(target=self._serve, name="lancefn-core", daemon=True).start()
        self._work.put((loop, future, call))
        return future

    def _serve(self) -> None:
        while True:
            loop, future, call = self._work.get()
            try:
                outcome, failed = call(), False
            except BaseException as error:  # handed to the awaiting request, like any result
                outcome, failed = error, True
            with self._lock:
                self._unfinished -= 1
            try:
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            except RuntimeError:  # the loop closed meanwhile: nobody awaits it
                pass


def _settle(future: asyncio.Future, outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


_CORE_THREADS = _CoreThreads()


async def off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run core work (parsing, hashing, SQLite) on a core thread so the event loop stays live."""
    return await _CORE_THREADS.run(functools.partial(fn, *args, **kwargs))


def is_arrow(content_type: str | bytes | None) -> bool:
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return (content_type or "").split(";")[0].strip().lower() == ARROW_STREAM


# Parsing a body this small takes microseconds on the loop, less than the hop to a core thread and back.
INLINE_JSON_BYTES = 16 * 1024


async def json_body(request: Request) -> Any:
    return await decode_json(await request.body())


async def decode_json(raw: bytes) -> Any:
    if len(raw) <= INLINE_JSON_BYTES:
        return load_json(raw)
    return await off_loop(load_json, raw)


def load_json(raw: bytes) -> Any:
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        # Strict: json.loads(bytes) would let UTF-8-encoded surrogates (ED A0 80) through.
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(
            400,
            f"the request body is not valid JSON text: it is not UTF-8 (byte {error.start}: {error.reason}; "
            "a lone surrogate such as ED A0 80 is not UTF-8); send JSON encoded as UTF-8",
        ) from None
    try:
        # NaN/Infinity are not JSON; refuse them here rather than store them.
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        raise ApiError(400, f"the request body is not valid JSON ({_short(error)})") from None
    if _SURROGATE_ESCAPE.search(raw):
        # "\ud800" escapes decode to lone surrogates that no UTF-8 store or reply can hold.
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(
                400, "the request body contains a lone UTF-16 surrogate escape (e.g. \\ud800); send valid Unicode text"
            ) from None
    return data


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON; use null or a finite number")


def _short(error: Exception) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


async def parse(request: Request, model: type[Body]) -> Any:
    """The JSON body as ``model``; any problem is a 400 naming the field."""
    return await parse_raw(await request.body(), model)


async def parse_raw(raw: bytes, model: type[Body]) -> Any:
    """:func:`parse` of a body already read."""
    data = await decode_json(raw)
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ApiError(400, "invalid request: " + format_validation_error(error)) from None


def parse_query(
    model: type[Body], fields: dict[str, Any], what: str, query: Any = None, json_keys: tuple[str, ...] = ()
) -> Any:
    """The query-string fields of an Arrow-bodied request as ``model``; a 400 names ``what`` and the field.
    ``json_keys``: fields of ``query`` that hold JSON values (numbers, booleans), decoded into ``fields``."""
    fields = dict(fields)
    for key in json_keys:
        if key in query:
            try:
                fields[key] = json.loads(query[key])
            except json.JSONDecodeError as error:
                raise ApiError(
                    400,
                    f"invalid request (query string of {what}): {key}={query[key]!r} is not a JSON value "
                    f"({error}); {', '.join(json_keys)} are JSON values (e.g. 4, 2.5, true)",
                ) from None
    try:
        return model.model_validate(fields)
    except ValidationError as error:
        raise ApiError(400, f"invalid request (query string of {what}): " + format_validation_error(error)) from None


def by_id(model: type[Body], field: str, method: Callable[[str, str | None], dict]) -> Callable[..., Awaitable[dict]]:
    """A route doing ``method(<the body's id field>, <the caller's scope>)`` to one job or batch."""

    async def route(request: Request) -> dict:
        body = await parse(request, model)
        return await off_loop(method, getattr(body, field), who(request).scope)

    return route


def listing(model: type[Body], method: Callable[..., dict]) -> Callable[..., Awaitable[dict]]:
    """A route listing within the caller's scope: ``method(**<the body's filters>, scope=...)``."""

    async def route(request: Request) -> dict:
        body = await parse(request, model)
        return await off_loop(method, **body.model_dump(), scope=who(request).scope)

    return route


def who(request: Request) -> Principal:
    return request.state.principal


def pick(request: Request, namespace: str | None) -> Where:
    """Which namespace's function a name@version means: a key's own namespace; the admin's own
    unless it names another (``None`` then means: wherever the only such version is)."""
    return where(who(request), namespace)


def where(caller: Principal, namespace: str | None) -> Where:
    """:func:`pick` for a known caller."""
    if caller.admin:
        return {"namespace": namespace, "scope": None, "home": caller.namespace}
    return {"namespace": namespace or caller.namespace, "scope": caller.namespace, "home": caller.namespace}
