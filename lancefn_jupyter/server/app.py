"""FastAPI routes of the control plane (docs/ARCHITECTURE.md, "REST API (v1)" and "REST details").

Thin on purpose: authenticate, parse the body into a small request model, call the
``ControlPlane``, wrap errors in the envelope ``{"error": {code, message, request_id}}``.

Why bodies are parsed by hand rather than as FastAPI body parameters: FastAPI reads and
validates the body *before* running dependencies, so a request with a bad body and no key
would get 400 instead of 401.  Parsing inside the route keeps the order auth → validation.

Nothing a client sends may stall the server for others: ``_Guard`` refuses a request
without a known ``x-api-key`` *before* reading its body, bounds the body's size and the time
to send it, and core work (JSON parsing, hashing, SQLite) runs in the threadpool via
``_off_loop`` so health checks, SSE streams and other clients stay live.

No input may produce a 5xx and no error carries a stack trace: ``_Guard`` (outermost of
our middleware) turns anything unexpected into a 400 ``request_failed`` envelope and logs
the traceback server-side only.  The one 5xx is not caused by input: a full disk answers
507 ``insufficient_storage`` (nothing from that request is saved; retry once space frees).

Size: over 600 lines because every route is here, each a few lines over the same guards; the
SSE stream lives in ``events.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import uuid
from typing import Any, Literal, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..dataplane import MEDIA_TYPE as ARROW_STREAM
from .core import DEFAULT_MAX_ARTIFACT_BYTES, ApiError, ControlPlane, format_validation_error
from .events import event_stream
from .namespaces import PRIVILEGES, ApiKeyError, Principal, load_api_keys
from .store import is_storage_full

__all__ = [
    "create_app",
    "load_api_keys",
    "PRIVILEGES",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_ARTIFACT_BYTES",
    "DEFAULT_BODY_TIMEOUT_S",
    "ApiKeyError",
]

log = logging.getLogger("lancefn.server")

# A maximum-size artifact (base64: 4/3 of its bytes) plus rows; --max-body-bytes raises it.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0  # --body-timeout-s: the whole body must arrive within this
UNAUTHENTICATED_PATHS = frozenset({"/v1/health"})
DEFAULT_MAX_ARROW_BODY_BYTES = 4 * 1024**3  # Arrow rows stream to a file, never into memory


def _is_arrow(content_type: str | bytes | None) -> bool:
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return (content_type or "").split(";")[0].strip().lower() == ARROW_STREAM


KEEPALIVE_S = 15.0
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces


# ---------------------------------------------------------------------- API keys
# Parsed in namespaces.py (keys → Principal: name, namespace, privileges, admin); re-exported here.


# -------------------------------------------------------------------- request models


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _NameVersion(_Body):
    name: str
    version: str
    namespace: Optional[str] = None  # the admin's pick among namespaces; others may only name their own


class _ListFunctions(_Body):
    include_definition: bool = False
    name: Optional[str] = None
    page_token: Optional[str] = None
    limit: int = Field(100, ge=1, le=1000)


class _History(_Body):
    name: Optional[str] = None
    limit: int = Field(20, ge=1, le=1000)
    namespace: Optional[str] = None  # one namespace's history: the caller's own unless the admin names another


class _Diff(_Body):
    name: str
    old: Optional[str] = None
    new: Optional[str] = None
    namespace: Optional[str] = None


class _Run(_Body):
    name: str
    version: str
    namespace: Optional[str] = None
    rows: Any = None  # checked against the signature by the core
    rows_file: Optional[str] = None  # an Arrow IPC file a local client wrote into $HOME/data/uploads/
    timeout_s: Optional[float] = Field(None, gt=0, le=30 * 24 * 3600)  # ≤ 30 days: timers can't take 1e300
    wait_s: Optional[float] = Field(None, ge=0, le=60)  # hold the reply until the job ends (≤ wait_s)


class _JobId(_Body):
    job_id: str


class _ListJobs(_Body):
    state: Optional[Literal["PENDING", "IN_PROGRESS", "DONE", "FAILED", "CANCELLED", "TIMED_OUT"]] = None
    name: Optional[str] = None
    job_type: Optional[Literal["create_function", "run_function"]] = None
    page_token: Optional[str] = None
    limit: int = Field(100, ge=1, le=1000)


class _Logs(_Body):
    job_id: str
    offset: int = Field(0, ge=0, le=2**62)  # SQLite integers are 64-bit
    limit: int = Field(1000, ge=1, le=10000)


class _Wait(_Body):
    job_id: str
    timeout_s: float = Field(30.0, ge=0, le=60)


async def _off_loop(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run core work (parsing, hashing, SQLite) in the threadpool so the event loop stays live."""
    return await run_in_threadpool(fn, *args, **kwargs)


class _BatchCreate(_Body):
    name: str
    version: str
    namespace: Optional[str] = None  # which namespace's function (as for functions/run)
    chunks: Any = None  # a list of chunks, each a list of rows; checked against the signature by the core
    rows_file: Optional[str] = (
        None  # Arrow chunks a local client wrote into $HOME/data/uploads/ (one record batch per chunk)
    )
    parallel: Optional[int] = Field(None, ge=1)  # None: as many as the class has GPUs ("auto")
    retries: int = Field(0, ge=0, le=10)
    fresh: bool = False
    timeout_s: Optional[float] = Field(None, gt=0, le=30 * 24 * 3600)


class _BatchId(_Body):
    batch_id: str


class _BatchDescribe(_Body):
    batch_id: str
    include_chunks: bool = True


class _BatchWait(_Body):
    batch_id: str
    timeout_s: float = Field(30.0, ge=0, le=60)
    revision: Optional[int] = None  # return as soon as the batch is newer than this


class _ListBatches(_Body):
    state: Optional[Literal["PENDING", "IN_PROGRESS", "DONE", "FAILED", "CANCELLED"]] = None
    name: Optional[str] = None
    limit: int = Field(100, ge=1, le=1000)


async def _json_body(request: Request) -> Any:
    return await _off_loop(_load_json, await request.body())


def _load_json(raw: bytes) -> Any:
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


async def _parse(request: Request, model: type[_Body]) -> Any:
    data = await _json_body(request)
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ApiError(400, "invalid request: " + format_validation_error(error)) from None


# -------------------------------------------------------------------- middleware


_MISSING_KEY_MESSAGE = "missing or unknown API key; send it in the x-api-key header (see server.json for the local key)"
_STORAGE_FULL_MESSAGE = (
    "the control plane's disk is full, so this request was not saved (nothing changed); "
    "free space on the filesystem of its home directory and retry"
)


def _envelope(status: int, code: str, message: str, request_id: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, "request_id": request_id}}, status_code=status)


def _request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or uuid.uuid4().hex


def _known_key(sent: bytes, keys: list[bytes]) -> bool:
    found = False
    for key in keys:  # every key compared: no early exit that times which one matched
        found |= hmac.compare_digest(sent, key)
    return found


class _Guard:
    """Request id, key-before-body, body-size and body-time limits, and last-resort error
    handling (pure ASGI for speed).  The routes still check the key's privileges."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        api_keys: Any = (),
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = [key.encode("utf-8") for key in api_keys]
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        sent_id = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = sent_id if _REQUEST_ID.fullmatch(sent_id) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                MutableHeaders(scope=message)["x-request-id"] = request_id
            await send(message)

        async def reply(status: int, code: str, message: str) -> None:
            await _envelope(status, code, message, request_id)(scope, receive, send_with_id)  # type: ignore[arg-type]

        async def refuse(status: int, code: str, message: str) -> None:
            # The unread body is not drained: uvicorn closes the connection after this reply.
            response = _envelope(status, code, message, request_id)
            response.headers["connection"] = "close"
            await response(scope, receive, send_with_id)  # type: ignore[arg-type]

        limit_message = (
            f"the request body is larger than the server's limit of {self.max_body_bytes} bytes; "
            "send fewer rows per job, or start lancefn-server with a larger --max-body-bytes"
        )
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            if scope.get("path") not in UNAUTHENTICATED_PATHS and not _known_key(
                headers.get(b"x-api-key", b""), self.keys
            ):
                await refuse(401, "unauthorized", _MISSING_KEY_MESSAGE)
                return
        # Arrow rows bodies are streamed to disk by their route (own size limit), never buffered here.
        if scope.get("method") in ("POST", "PUT", "PATCH") and not _is_arrow(headers.get(b"content-type")):
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > self.max_body_bytes:
                await refuse(413, "payload_too_large", limit_message)
                return
            # Buffer the body (bounded in size and time) so the limit also holds for chunked uploads.
            chunks, size, more = [], 0, True
            deadline = asyncio.get_running_loop().time() + self.body_timeout_s
            while more:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
                except asyncio.TimeoutError:
                    await refuse(
                        408,
                        "request_timeout",
                        f"the request body did not arrive within {self.body_timeout_s:g}s; send it at once, "
                        "or start lancefn-server with a larger --body-timeout-s",
                    )
                    return
                if message["type"] == "http.disconnect":
                    return
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    await refuse(413, "payload_too_large", limit_message)
                    return
                chunks.append(chunk)
                more = message.get("more_body", False)
            body, replayed = b"".join(chunks), False

            async def replay() -> dict:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            inner_receive = replay
        else:
            inner_receive = receive
        try:
            await self.app(scope, inner_receive, send_with_id)
        except Exception as error:
            if is_storage_full(error):
                # Not a bug and not the client's fault: 507 Insufficient Storage, and no traceback spam.
                log.error(
                    "%s %s (request %s): disk full: %s", scope.get("method"), scope.get("path"), request_id, error
                )
                if not started:
                    await reply(507, "insufficient_storage", _STORAGE_FULL_MESSAGE)
                return
            log.exception(
                "unexpected error handling %s %s (request %s)", scope.get("method"), scope.get("path"), request_id
            )
            if not started:
                await reply(
                    400,
                    "request_failed",
                    f"the server could not process this request (request id {request_id}); "
                    "check the request against the API reference or see the server log",
                )


# --------------------------------------------------------------------------- app


def create_app(
    core: ControlPlane,
    *,
    api_keys: dict[str, Principal],
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_artifact_bytes: int = DEFAULT_MAX_ARTIFACT_BYTES,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    on_shutdown: Any = None,
    max_arrow_body_bytes: int = DEFAULT_MAX_ARROW_BODY_BYTES,
) -> FastAPI:
    """The ASGI app; ``api_keys`` maps each accepted key to its :class:`Principal`."""
    core.max_artifact_bytes = max_artifact_bytes

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        core.attach_loop(asyncio.get_running_loop())
        core.start()
        try:
            yield
        finally:
            core.begin_shutdown()
            await asyncio.get_running_loop().run_in_executor(None, core.shutdown)
            core.attach_loop(None)

    app = FastAPI(
        title="lancefn control plane",
        version=core.version,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # no unauthenticated routes besides /v1/health
        lifespan=lifespan,
    )
    app.state.core = core
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, api_keys=list(api_keys), body_timeout_s=body_timeout_s)

    key_items = list(api_keys.items())

    def require(privilege: str):
        async def check(request: Request) -> None:
            sent = request.headers.get("x-api-key")
            principal = None
            if sent:
                sent_bytes = sent.encode("utf-8", "surrogateescape")
                for key, granted in key_items:
                    if hmac.compare_digest(sent_bytes, key.encode("utf-8")):
                        principal = granted
            if principal is None:
                raise ApiError(401, _MISSING_KEY_MESSAGE)
            if privilege not in principal.privileges:
                raise ApiError(403, f"this API key lacks the '{privilege}' privilege needed for {request.url.path}")
            request.state.principal = principal

        return Depends(check)

    # ------------------------------------------------------------- error handlers

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return _envelope(error.status, error.code, error.message, _request_id(request))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        parts = []
        for item in error.errors():
            loc = ".".join(str(p) for p in item.get("loc", ()))
            parts.append(f"{loc}: {item.get('msg', 'invalid')}")
        return _envelope(400, "invalid_request", "invalid request: " + "; ".join(parts), _request_id(request))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        status = error.status_code if 400 <= error.status_code < 500 else 400
        code = ApiError.CODES.get(status, "invalid_request" if status != 405 else "method_not_allowed")
        message = "no such endpoint; see the API reference for /v1 routes" if status == 404 else str(error.detail)
        return _envelope(status, code, message, _request_id(request))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        rid = _request_id(request)
        if is_storage_full(error):
            return _envelope(507, "insufficient_storage", _STORAGE_FULL_MESSAGE, rid)
        log.error("unexpected error (request %s): %s", rid, type(error).__name__)
        return _envelope(
            400,
            "request_failed",
            f"the server could not process this request (request id {rid}); see the server log",
            rid,
        )

    # ------------------------------------------------------------------- routes

    @app.get("/v1/health")
    async def health() -> dict:
        return {"status": "ok", "version": core.version, "executor": core.executor_name}

    @app.get("/v1/gpu/classes", dependencies=[require("system_usage")])
    async def gpu_classes() -> dict:
        return core.gpu_classes()

    @app.get("/v1/gpu/usage", dependencies=[require("system_usage")])
    async def gpu_usage() -> dict:
        return await _off_loop(core.gpu_usage)

    @app.post("/v1/functions/create", status_code=202, dependencies=[require("functions")])
    async def create_function(request: Request) -> dict:
        return {"job_id": await _off_loop(core.register, await _json_body(request), _who(request).namespace)}

    @app.post("/v1/functions/describe", dependencies=[require("functions")])
    async def describe_function(request: Request) -> dict:
        body = await _parse(request, _NameVersion)
        return await _off_loop(core.describe_function, body.name, body.version, **_pick(request, body.namespace))

    @app.post("/v1/functions/list", dependencies=[require("functions")])
    async def list_functions(request: Request) -> dict:
        body = await _parse(request, _ListFunctions)
        return await _off_loop(
            core.list_functions,
            name=body.name,
            include_definition=body.include_definition,
            page_token=body.page_token,
            limit=body.limit,
            scope=_who(request).scope,
        )

    @app.post("/v1/functions/artifact", dependencies=[require("functions")])
    async def function_artifact(request: Request) -> dict:
        body = await _parse(request, _NameVersion)
        return await _off_loop(core.function_artifact, body.name, body.version, **_pick(request, body.namespace))

    @app.post("/v1/functions/history", dependencies=[require("functions")])
    async def function_history(request: Request) -> dict:
        body = await _parse(request, _History)
        return await _off_loop(core.function_history, body.name, body.limit, **_pick(request, body.namespace))

    @app.post("/v1/functions/diff", dependencies=[require("functions")])
    async def function_diff(request: Request) -> dict:
        body = await _parse(request, _Diff)
        return await _off_loop(core.function_diff, body.name, body.old, body.new, **_pick(request, body.namespace))

    @app.post("/v1/functions/drop", dependencies=[require("functions")])
    async def drop_function(request: Request) -> dict:
        body = await _parse(request, _NameVersion)
        return await _off_loop(core.drop_function, body.name, body.version, **_pick(request, body.namespace))

    @app.post("/v1/functions/run", status_code=202, dependencies=[require("functions")])
    async def run_function(request: Request) -> dict:
        if _is_arrow(request.headers.get("content-type")):
            return await _run_arrow(request)
        body = await _parse(request, _Run)
        if body.rows_file is not None:
            try:
                upload = core.data.upload(body.rows_file)
            except ValueError as error:
                raise ApiError(400, str(error)) from None
            job_id = await _off_loop(
                core.run,
                body.name,
                body.version,
                None,
                body.timeout_s,
                arrow_rows=upload,
                **_pick(request, body.namespace),
            )
        else:
            job_id = await _off_loop(
                core.run, body.name, body.version, body.rows, body.timeout_s, **_pick(request, body.namespace)
            )
        if body.wait_s is None:
            return {"job_id": job_id}
        # Inline wait: a quick job's result comes back in this reply (one round trip, no jobs/wait).
        return {"job_id": job_id, "job": await core.wait_job(job_id, body.wait_s, unless_queued=True)}

    async def _run_arrow(request: Request) -> dict:
        """Rows as an Arrow IPC stream body; name, version, timeout_s in the query string."""
        query = request.query_params
        try:
            params = _Run.model_validate(
                {
                    "name": query.get("name"),
                    "version": query.get("version"),
                    "rows": None,
                    "timeout_s": query.get("timeout_s"),
                    "namespace": query.get("namespace"),
                }
            )
        except ValidationError as error:
            raise ApiError(
                400, "invalid request (query string of an Arrow run): " + format_validation_error(error)
            ) from None
        tmp, _ = core.data.new_rows_file()
        try:
            await _receive_arrow(request, tmp)
            job_id = await _off_loop(
                core.run,
                params.name,
                params.version,
                None,
                params.timeout_s,
                arrow_rows=tmp,
                **_pick(request, params.namespace),
            )
        finally:
            if tmp.exists():
                tmp.unlink()
        return {"job_id": job_id}

    async def _receive_arrow(request: Request, tmp: Any) -> None:
        """Stream an Arrow IPC body into ``tmp``: a 1 GB body never sits in the server's memory."""
        size = 0
        chunks = request.stream()
        with open(tmp, "wb") as sink:
            while True:
                try:  # a stalled upload must not hold the connection: each chunk within the body timeout
                    chunk = await asyncio.wait_for(chunks.__anext__(), body_timeout_s)
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    raise ApiError(
                        408,
                        f"the Arrow body stalled for {body_timeout_s:g}s; send it at once, or start "
                        "lancefn-server with a larger --body-timeout-s",
                        code="request_timeout",
                    ) from None
                size += len(chunk)
                if size > max_arrow_body_bytes:
                    raise ApiError(
                        413,
                        f"the Arrow body is larger than the server's limit of {max_arrow_body_bytes} "
                        "bytes (--max-arrow-body-bytes); send fewer rows per job",
                    )
                sink.write(chunk)

    @app.get("/v1/jobs/result", dependencies=[require("jobs")])
    async def job_result(request: Request, job_id: str) -> Any:
        """A DONE job's result: its Arrow IPC stream (streamed from the file), or JSON results."""
        path, results = await _off_loop(core.result_file, job_id, _who(request).scope)
        if path is None:
            return {"job_id": job_id, "result": results}
        return FileResponse(path, media_type=ARROW_STREAM)

    @app.post("/v1/jobs/describe", dependencies=[require("jobs")])
    async def describe_job(request: Request) -> dict:
        body = await _parse(request, _JobId)
        return await _off_loop(core.describe_job, body.job_id, _who(request).scope)

    @app.post("/v1/jobs/list", dependencies=[require("jobs")])
    async def list_jobs(request: Request) -> dict:
        body = await _parse(request, _ListJobs)
        return await _off_loop(
            core.list_jobs,
            state=body.state,
            name=body.name,
            job_type=body.job_type,
            page_token=body.page_token,
            limit=body.limit,
            scope=_who(request).scope,
        )

    @app.post("/v1/jobs/cancel", dependencies=[require("jobs")])
    async def cancel_job(request: Request) -> dict:
        body = await _parse(request, _JobId)
        return await _off_loop(core.cancel_job, body.job_id, _who(request).scope)

    @app.post("/v1/jobs/logs", dependencies=[require("jobs")])
    async def job_logs(request: Request) -> dict:
        body = await _parse(request, _Logs)
        return await _off_loop(core.job_logs, body.job_id, body.offset, body.limit, _who(request).scope)

    @app.post("/v1/jobs/wait", dependencies=[require("jobs")])
    async def wait_job(request: Request) -> dict:
        body = await _parse(request, _Wait)
        return await core.wait_job(body.job_id, body.timeout_s, _who(request).scope)

    # Batches (docs/ARCHITECTURE.md, "Batches"): a map fanned out as chunk jobs.
    @app.post("/v1/batches/create", status_code=202, dependencies=[require("functions")])
    async def create_batch(request: Request) -> dict:
        if _is_arrow(request.headers.get("content-type")):
            return await _create_batch_arrow(request)
        body = await _parse(request, _BatchCreate)
        arrow_rows = None
        if body.rows_file is not None:
            try:
                arrow_rows = core.data.upload(body.rows_file)
            except ValueError as error:
                raise ApiError(400, str(error)) from None
        try:
            return await _off_loop(
                core.batches.create,
                body.name,
                body.version,
                body.chunks,
                parallel=body.parallel,
                retries=body.retries,
                timeout_s=body.timeout_s,
                fresh=body.fresh,
                arrow_rows=arrow_rows,
                **_pick(request, body.namespace),
            )
        finally:
            if arrow_rows is not None:  # its chunks are stored with the batch
                arrow_rows.unlink(missing_ok=True)

    async def _create_batch_arrow(request: Request) -> dict:
        """Chunks as one Arrow IPC stream body, one record batch per chunk; the other fields in the query string."""
        query = request.query_params
        try:
            fields = {k: query[k] for k in ("name", "version", "namespace") if k in query}
            fields.update(
                {k: json.loads(query[k]) for k in ("parallel", "retries", "fresh", "timeout_s") if k in query}
            )
            params = _BatchCreate.model_validate(fields)
        except json.JSONDecodeError as error:
            raise ApiError(
                400,
                f"invalid request (query string of an Arrow batch): {error}; parallel, retries, fresh "
                "and timeout_s are JSON values (e.g. 4, true)",
            ) from None
        except ValidationError as error:
            raise ApiError(
                400, "invalid request (query string of an Arrow batch): " + format_validation_error(error)
            ) from None
        tmp, _ = core.data.new_rows_file()
        try:
            await _receive_arrow(request, tmp)
            return await _off_loop(
                core.batches.create,
                params.name,
                params.version,
                None,
                parallel=params.parallel,
                retries=params.retries,
                timeout_s=params.timeout_s,
                fresh=params.fresh,
                arrow_rows=tmp,
                **_pick(request, params.namespace),
            )
        finally:
            if tmp.exists():
                tmp.unlink()

    @app.post("/v1/batches/describe", dependencies=[require("jobs")])
    async def describe_batch(request: Request) -> dict:
        body = await _parse(request, _BatchDescribe)
        return await _off_loop(
            core.batches.describe, body.batch_id, include_chunks=body.include_chunks, scope=_who(request).scope
        )

    @app.post("/v1/batches/list", dependencies=[require("jobs")])
    async def list_batches(request: Request) -> dict:
        body = await _parse(request, _ListBatches)
        return await _off_loop(
            core.batches.list, state=body.state, name=body.name, limit=body.limit, scope=_who(request).scope
        )

    @app.post("/v1/batches/cancel", dependencies=[require("jobs")])
    async def cancel_batch(request: Request) -> dict:
        body = await _parse(request, _BatchId)
        return await _off_loop(core.batches.cancel, body.batch_id, _who(request).scope)

    @app.post("/v1/batches/retry", dependencies=[require("functions")])
    async def retry_batch(request: Request) -> dict:
        body = await _parse(request, _BatchId)
        return await _off_loop(core.batches.retry, body.batch_id, _who(request).scope)

    @app.post("/v1/batches/wait", dependencies=[require("jobs")])
    async def wait_batch(request: Request) -> dict:
        body = await _parse(request, _BatchWait)
        return await core.batches.wait(body.batch_id, body.timeout_s, body.revision, _who(request).scope)

    @app.get("/v1/jobs/events", dependencies=[require("jobs")])
    async def job_events(request: Request, last_event_id: Optional[str] = None) -> StreamingResponse:
        raw = request.headers.get("last-event-id") or last_event_id
        if raw is None or raw == "":
            start = await _off_loop(core.last_event_seq)  # no resume point: only changes from now on
        elif raw.isdigit() and len(raw) < 19:
            start = int(raw)
        else:
            raise ApiError(400, "Last-Event-ID / last_event_id must be a non-negative integer event id")
        return StreamingResponse(
            event_stream(core, start, _who(request).scope, _off_loop, KEEPALIVE_S),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app


def _who(request: Request) -> Principal:
    return request.state.principal


def _pick(request: Request, namespace: str | None) -> dict:
    """Which namespace's function a name@version means: a key's own namespace; the admin's own
    unless it names another (``None`` then means: wherever the only such version is)."""
    who = _who(request)
    if who.admin:
        return {"namespace": namespace, "scope": None, "home": who.namespace}
    return {"namespace": namespace or who.namespace, "scope": who.namespace, "home": who.namespace}
