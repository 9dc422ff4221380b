"""Request bodies (docs/ARCHITECTURE.md, "REST details"): strict JSON parsed into request models,
query strings of Arrow-bodied requests, and Arrow IPC bodies streamed to a rows file.  Runs in the
control plane's server process, on the event loop (large bodies on core threads).

Bodies are parsed by hand inside the route, after the router checked the key, so the order is
always auth → validation: a request with a bad body and no key gets 401, not 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request

from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.errors import ApiError, format_validation_error
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.wire.dataplane import MEDIA_TYPE as ARROW_STREAM
from lancefn_jupyter.wire.jsontext import has_long_integer
from lancefn_jupyter.wire.models import MAX_TIMEOUT_S as MAX_TIMEOUT_S  # the routes take it from here

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class Body(BaseModel):
    """A request body: strict types, unknown fields ignored (older servers ignore newer fields)."""

    model_config = ConfigDict(extra="ignore", strict=True)


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
    if not _SURROGATE_ESCAPE.search(raw) and not has_long_integer(raw):  # orjson would read a long one as a float
        try:  # orjson is strict as asked here (UTF-8, no NaN/Infinity) and a third of the time; its
            return orjson.loads(raw)  # refusals are explained by the standard library's parse below
        except orjson.JSONDecodeError:
            pass
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


async def parse(request: Request, model: type[BaseModel]) -> Any:
    """The JSON body as ``model``; any problem is a 400 naming the field."""
    return await parse_raw(await request.body(), model)


async def parse_raw(raw: bytes, model: type[BaseModel]) -> Any:
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


class ArrowBodies:
    """Where Arrow rows bodies go: a client's upload in ``$HOME/data/uploads/``, or a request
    body streamed into a temp rows file within the body timeout and size limit."""

    def __init__(self, data: DataStore, *, body_timeout_s: float, max_arrow_body_bytes: int) -> None:
        self.data, self.body_timeout_s, self.max_arrow_body_bytes = data, body_timeout_s, max_arrow_body_bytes

    def upload(self, rows_file: str) -> Path:
        """A rows file a local client wrote into ``$HOME/data/uploads/``; a bad name is a 400."""
        try:
            return self.data.upload(rows_file)
        except ValueError as error:
            raise ApiError(400, str(error)) from None

    @contextlib.asynccontextmanager
    async def arrow_body(self, request: Request) -> AsyncIterator[Path]:
        """The request's Arrow IPC body streamed into a temp rows file (a 1 GB body never sits in
        the server's memory); the file is removed when the block ends."""
        tmp, _ = self.data.new_rows_file()
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
