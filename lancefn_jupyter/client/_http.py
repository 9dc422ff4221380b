"""The one HTTP transport shared by every resource module: auth header, error envelope, timeouts.

Requests go over the standard library's `http.client` on a small pool of keep-alive connections: a call
costs ~0.4 ms of client time against ~0.7 ms through httpx, and a quick job's whole submit → result is
one round trip. The kernel never imports httpx (whose import pulls in rich and click where they are installed).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

from lancefn_jupyter.client.errors import ControlPlaneUnreachable, error_for_status

__all__ = ["ARROW_STREAM", "EventStream", "Transport"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"  # = dataplane.MEDIA_TYPE (not imported: keep the client light)
# Requests that create something new each time they are sent.
_NOT_REPEATABLE = frozenset({"/v1/functions/run"})
_MAX_IDLE = 8  # keep-alive connections kept for reuse (one per thread that talks to the server at once)

_ONE_SEND_BYTES = 64 * 1024  # a body up to this size goes out in one send with its headers


class _OneSend:
    """``http.client`` sends a request's headers and its body in two ``send`` calls; with TCP_NODELAY
    that is two packets, and the server parses the head, waits, and wakes again for the body.  A small
    body goes out in the same send as its headers (what ``http.client`` itself did before Python 3.7)."""

    _buffer: list[bytes]

    def _send_output(self, message_body: Any = None, encode_chunked: bool = False) -> None:
        if isinstance(message_body, bytes) and len(message_body) <= _ONE_SEND_BYTES and not encode_chunked:
            self._buffer.extend((b"", message_body))
            message = b"\r\n".join(self._buffer)
            del self._buffer[:]
            self.send(message)  # type: ignore[attr-defined]
        else:
            super()._send_output(message_body, encode_chunked)  # type: ignore[misc]


class _HTTPConnection(_OneSend, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_OneSend, http.client.HTTPSConnection):
    pass


_Connection = _HTTPConnection | _HTTPSConnection


class _NotSent(Exception):
    """No connection could be opened: the request never reached a server, so sending it again is safe."""

    def __init__(self, error: OSError):
        self.error = error


class _Reply:
    """A fully read response (the connection it came on is free again)."""

    __slots__ = ("content", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: http.client.HTTPMessage, content: bytes):
        self.status, self.reason, self.headers, self.content = status, reason, headers, content


class EventStream:
    """An open streaming reply: ``iter_lines()`` (text, line ends removed), ``close()``, and its ``socket``
    (shut it down to end a blocked read at once, from another thread)."""

    def __init__(self, conn: _Connection, response: http.client.HTTPResponse):
        self._conn, self._response = conn, response
        self.status_code = response.status
        self.headers = response.headers
        self.socket: socket.socket | None = conn.sock

    def iter_lines(self) -> Iterator[str]:
        while True:
            try:
                line = self._response.readline()
            except http.client.HTTPException as error:  # e.g. the server died mid-chunk
                raise ConnectionResetError(f"the event stream broke off ({type(error).__name__})") from None
            if not line:
                return
            yield line.decode("utf-8", errors="replace").rstrip("\r\n")

    def read_all(self) -> bytes:
        try:
            return self._response.read()
        finally:
            self.close()

    def close(self) -> None:
        self._response.close()
        self._conn.close()


class _Pool:
    """Keep-alive connections to one server; a connection serves one request at a time."""

    def __init__(self, url: str, timeout: float):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"control plane URL {url!r} must look like http://host:port (or https://…)")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")  # a server mounted under a path (behind a proxy)
        self._timeout = timeout
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self.closed = False

    def _checkout(self) -> _Connection:
        """An idle connection still open, else a new one connected now."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            # An idle keep-alive socket that is readable was closed by the server (idle timeout, restart).
            sock = conn.sock
            if sock is not None and not select.select([sock], [], [], 0)[0]:
                return conn
            conn.close()
        return self._new(self._timeout)

    def _new(self, timeout: float) -> _Connection:
        cls = _HTTPSConnection if self._https else _HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        try:
            conn.connect()  # sets TCP_NODELAY: small requests are not held back waiting for ACKs
        except OSError as error:
            conn.close()
            raise _NotSent(error) from None
        return conn

    def _checkin(self, conn: _Connection) -> None:
        with self._lock:
            if not self.closed and len(self._idle) < _MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def exchange(self, method: str, target: str, body: bytes | None, headers: dict[str, str], timeout: float) -> _Reply:
        """Send one request and read the whole reply (the connection is then free for the next)."""
        conn = self._checkout()
        try:
            assert conn.sock is not None
            conn.sock.settimeout(timeout)
            response = _send_and_receive(conn, method, self.prefix + target, body, headers)
            reply = _Reply(response.status, response.reason, response.headers, response.read())
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return reply

    def open_stream(
        self, path: str, headers: dict[str, str], connect_timeout: float, read_timeout: float | None
    ) -> EventStream:
        """A GET on a connection of its own, its reply headers read and its body left to stream."""
        conn = self._new(connect_timeout)
        try:
            assert conn.sock is not None
            conn.sock.settimeout(read_timeout)
            conn.request("GET", self.prefix + path, headers=headers)
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        stream = EventStream(conn, response)
        if response.status >= 400:
            content = stream.read_all()
            _decode(_Reply(response.status, response.reason, response.headers, content))
        return stream

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class Transport:
    """Pooled keep-alive HTTP to one server (keep-alive matters: a warm registration is ~2 requests). Thread-safe."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        recover: Callable[[], tuple[str, str]] | None = None,
    ):
        self._timeout = timeout
        self._connect(url, api_key)
        # For the embedded server: when nothing listens any more, start (or find) it again and retry.
        self.recover = recover
        self._reconnect_lock = threading.Lock()

    def _connect(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"x-api-key": api_key} if api_key else {}
        self._pool = _Pool(self.url, self._timeout)

    def _reconnect(self, failed: _Pool) -> bool:
        """Point at the server `recover` returns; False when there is no way to recover.

        `failed` is the pool the request failed on: if another thread (the widgets' event listener)
        already reconnected, its new pool is used as is.
        """
        if self.recover is None:
            return False
        with self._reconnect_lock:
            if self._pool is failed:
                url, api_key = self.recover()
                self._connect(url, api_key)
                failed.close()
        return True

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """JSON in and out; ``content`` + ``content_type`` send a binary body (Arrow IPC rows),
        and an Arrow IPC reply comes back as ``bytes``."""
        headers = {"x-request-id": uuid.uuid4().hex}
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
            headers["content-type"] = "application/json"
        if content is not None:
            data = content
            headers["content-type"] = content_type or "application/octet-stream"
        if method != "GET" and data is None:
            headers["content-length"] = "0"
        target = path + ("?" + urlencode(params) if params else "")
        wait = self._timeout if timeout is None else timeout
        try:
            reply = self._send(method, path, target, data, headers, wait)
        except _NotSent as error:
            raise ControlPlaneUnreachable(self.url, _reason(error.error)) from None
        except (OSError, http.client.HTTPException) as error:
            raise ControlPlaneUnreachable(self.url, _reason(error)) from None
        return _decode(reply)

    def _send(
        self, method: str, path: str, target: str, data: bytes | None, headers: dict[str, str], wait: float
    ) -> _Reply:
        pool = self._pool
        try:
            return pool.exchange(method, target, data, {**self._headers, **headers}, wait)
        except _NotSent:
            # Refused: nothing listens there (any more). It never reached a server, so it is sent again
            # to the server `recover` finds or starts.
            if not self._reconnect(pool):
                raise
        except (OSError, http.client.HTTPException):
            # The server went away mid-request (or a pooled socket died with it). An idempotent request
            # is sent again; a `run` that may have reached a dying server is not (it could start the job
            # twice).
            if path in _NOT_REPEATABLE or not self._reconnect(pool):
                raise
        return self._pool.exchange(method, target, data, {**self._headers, **headers}, wait)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> Any:
        return self.request("POST", path, body, **kwargs)

    def stream(
        self, path: str, headers: dict[str, str], *, connect_timeout: float, read_timeout: float | None
    ) -> EventStream:
        """An open streaming GET on its own connection (the caller iterates and closes it); used by the event stream."""
        pool = self._pool
        try:
            try:
                return pool.open_stream(path, {**self._headers, **headers}, connect_timeout, read_timeout)
            except (_NotSent, OSError, http.client.HTTPException):
                # Nothing listens any more, or the server died as we asked: a GET is safe to send again.
                if not self._reconnect(pool):
                    raise
            return self._pool.open_stream(path, {**self._headers, **headers}, connect_timeout, read_timeout)
        except _NotSent as error:
            raise ControlPlaneUnreachable(self.url, _reason(error.error)) from None
        except (OSError, http.client.HTTPException) as error:
            raise ControlPlaneUnreachable(self.url, _reason(error)) from None

    def close(self) -> None:
        self._pool.close()


def _decode(reply: _Reply) -> Any:
    """A reply's body (JSON, or Arrow bytes as they are), or the error its envelope describes."""
    if reply.status < 400:
        if (reply.headers.get("content-type") or "").startswith(ARROW_STREAM):
            return reply.content
        return json.loads(reply.content) if reply.content else None
    request_id = reply.headers.get("x-request-id")
    text = reply.content.decode("utf-8", errors="replace")
    try:
        error = json.loads(text)["error"]
        code, message = error.get("code", "error"), error.get("message", text)
        request_id = error.get("request_id") or request_id
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message = "error", text[:500] or reply.reason
    raise error_for_status(reply.status, code, message, request_id)


def _send_and_receive(
    conn: _Connection, method: str, url: str, body: bytes | None, headers: dict[str, str]
) -> http.client.HTTPResponse:
    try:
        conn.request(method, url, body=body, headers=headers)  # headers and a bytes body in one send
    except OSError as send_error:
        # The server may have answered and closed without reading the body (a 413): return that answer.
        try:
            return conn.getresponse()
        except (OSError, http.client.HTTPException):
            raise send_error from None
    return conn.getresponse()


def _reason(error: BaseException) -> str:
    """What went wrong, for `ControlPlaneUnreachable` (e.g. "ConnectionRefusedError: [Errno 111] …")."""
    if isinstance(error, TimeoutError):
        return "timed out waiting for the server"
    return type(error).__name__ + (f": {error}" if str(error) else "")
