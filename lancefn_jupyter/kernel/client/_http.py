"""The one HTTP transport shared by every resource module: auth header, error envelope, timeouts.

Requests go over a small pool of keep-alive connections that write and read HTTP/1.1 themselves
(`_Connection`; the standard library's `http.client` only for the event stream): a quick job's whole
submit → result is one round trip, and the client's part of it ~0.2 ms. The kernel never imports httpx (whose import pulls in rich and click where they are installed).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

from lancefn_jupyter.kernel.client.errors import ControlPlaneUnreachable, error_for_status
from lancefn_jupyter.wire import jsontext

__all__ = ["ARROW_STREAM", "EventStream", "Transport"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"  # = dataplane.MEDIA_TYPE (not imported: keep the client light)
# Requests that create something new each time they are sent.
_NOT_REPEATABLE = frozenset({"/v1/functions/run"})
_MAX_IDLE = 8  # keep-alive connections kept for reuse (one per thread that talks to the server at once)

_ONE_SEND_BYTES = 64 * 1024  # a body up to this size goes out in one send with its head
_MAX_LINE = 65536  # a reply's status or header line, as http.client bounds it
_MAX_HEADERS = 100


class _BadReply(http.client.HTTPException):
    """The server's reply is not well-formed HTTP/1.1 (handled like a connection that broke)."""


class _Connection:
    """One keep-alive HTTP/1.1 connection for request → whole reply exchanges.

    Not ``http.client``: it parses every reply's headers with the ``email`` package, which was a third of the
    kernel's time for a quick job's one round trip. This writes the head itself, sends a small body in the same
    ``send`` (one packet with TCP_NODELAY, so the server wakes once), and reads a reply framed by
    ``content-length``, ``chunked`` or the connection's end."""

    def __init__(self, host: str, port: int | None, https: bool, timeout: float, unix_socket: str | None = None):
        """``unix_socket``: the server's Unix socket instead of its TCP port (docs/ARCHITECTURE.md, "Local clients");
        an ``OSError`` if it cannot be reached (the caller then uses the port)."""
        self.host_header = (host if ":" not in host else f"[{host}]") + (f":{port}" if port else "")
        if unix_socket is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(unix_socket)
            except OSError:
                sock.close()
                raise
        else:
            try:
                sock = socket.create_connection((host, port or (443 if https else 80)), timeout=timeout)
            except OSError as error:
                raise _NotSent(error) from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if https:
            import ssl

            try:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            except OSError as error:
                sock.close()
                raise _NotSent(error) from None
        self.sock: socket.socket | None = sock
        self._reader = sock.makefile("rb")

    def settimeout(self, timeout: float) -> None:
        assert self.sock is not None
        self.sock.settimeout(timeout)

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            self._reader.close()
            sock.close()

    def exchange(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> tuple[_Reply, bool]:
        """Send the request, read the whole reply: (the reply, whether the connection must be closed after it)."""
        assert self.sock is not None
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            if body is not None and len(body) <= _ONE_SEND_BYTES:
                self.sock.sendall(head + body)
            else:
                self.sock.sendall(head)
                if body:
                    self.sock.sendall(body)
        except OSError:
            # The server may have answered and closed without reading the body (a 413): read that answer.
            try:
                return self._read_reply(method), True
            except (OSError, http.client.HTTPException):
                pass
            raise
        reply = self._read_reply(method)
        return reply, reply.will_close

    def _line(self) -> bytes:
        line = self._reader.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise _BadReply("a reply line is too long")
        if not line:
            raise _BadReply("the server closed the connection without a reply")  # a keep-alive race, or a crash
        return line

    def _read_reply(self, method: str) -> _Reply:
        status_line = self._line()
        while status_line.startswith(b"HTTP/") and status_line.split(b" ", 2)[1:2] == [b"100"]:  # 100 Continue
            while self._line() not in (b"\r\n", b"\n"):
                pass
            status_line = self._line()
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise _BadReply(f"not an HTTP reply: {status_line[:80]!r}")
        version, status, reason = parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""
        headers: dict[str, str] = {}
        buffered = self._buffered_head()
        lines = iter(buffered) if buffered is not None else iter(self._line, None)
        for _ in range(_MAX_HEADERS + 1):
            line = next(lines, b"\r\n")
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise _BadReply(f"a malformed reply header: {line[:80]!r}")
            key, value = name.strip().lower(), value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise _BadReply(f"more than {_MAX_HEADERS} reply headers")
        connection = headers.get("connection", "").lower()
        will_close = "close" in connection or (version == "HTTP/1.0" and "keep-alive" not in connection)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            content = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            content = self._read_chunked()
        elif (length := headers.get("content-length", "")).isdigit():
            content = self._read_exactly(int(length))
        else:  # framed by the connection's end
            content, will_close = self._reader.read(), True
        return _Reply(status, reason, headers, content, will_close)

    def _buffered_head(self) -> list[bytes] | None:
        """The reply's header lines, taken from the buffer at once when the read that brought its status line brought
        all of its head (a small reply's does); None: they are read line by line."""
        peeked = self._reader.peek()
        if peeked.startswith(b"\r\n"):  # no header at all
            self._reader.read(2)
            return []
        end = peeked.find(b"\r\n\r\n")
        if end < 0 or peeked.count(b"\n", 0, end) != peeked.count(b"\r\n", 0, end):  # not all in, or bare LFs
            return None
        head = self._reader.read(end + 4)
        return head[:end].split(b"\r\n")

    def _read_exactly(self, size: int) -> bytes:
        data = self._reader.read(size)
        if len(data) < size:
            raise _BadReply(f"the reply ended after {len(data)} of {size} bytes")
        return data

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        while True:
            size_text = self._line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise _BadReply(f"a malformed chunk size: {size_text[:20]!r}") from None
            if size == 0:
                while self._line() not in (b"\r\n", b"\n"):  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(self._read_exactly(size))
            self._read_exactly(2)  # the chunk's CRLF


class _NotSent(Exception):
    """No connection could be opened: the request never reached a server, so sending it again is safe."""

    def __init__(self, error: OSError):
        self.error = error


class _Reply:
    """A fully read response (the connection it came on is free again); ``headers`` by lower-case name."""

    __slots__ = ("content", "headers", "reason", "status", "will_close")

    def __init__(self, status: int, reason: str, headers: Mapping[str, str], content: bytes, will_close: bool = False):
        self.status, self.reason, self.headers, self.content = status, reason, headers, content
        self.will_close = will_close


class EventStream:
    """An open streaming reply: ``iter_lines()`` (text, line ends removed), ``close()``, and its ``socket``
    (shut it down to end a blocked read at once, from another thread)."""

    def __init__(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse):
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

    def __init__(self, url: str, timeout: float, unix_socket: str | None = None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"control plane URL {url!r} must look like http://host:port (or https://…)")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        # The same server's Unix socket (plain HTTP on this machine), while it can be reached; else the port.
        self._unix_socket = unix_socket if not self._https else None
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
        unix_socket = self._unix_socket
        if unix_socket is not None:
            try:
                return _Connection(self._host, self._port, self._https, timeout, unix_socket)
            except OSError:  # gone, or not ours to open: the port from now on (a dead server refuses there too)
                self._unix_socket = None
        return _Connection(self._host, self._port, self._https, timeout)

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
            conn.settimeout(timeout)
            reply, close = conn.exchange(method, self.prefix + target, body, headers)
        except BaseException:
            conn.close()
            raise
        if close:
            conn.close()
        else:
            self._checkin(conn)
        return reply

    def open_stream(
        self, path: str, headers: dict[str, str], connect_timeout: float, read_timeout: float | None
    ) -> EventStream:
        """A GET on a connection of its own (``http.client``, which reads a chunked body line by line), its reply
        headers read and its body left to stream."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=connect_timeout)
        try:
            conn.connect()
        except OSError as error:
            conn.close()
            raise _NotSent(error) from None
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
            reply_headers = {name.lower(): value for name, value in response.headers.items()}
            _decode(_Reply(response.status, response.reason, reply_headers, content))
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
        unix_socket: str | None = None,
    ):
        """``unix_socket``: the server's Unix socket (``server.json``'s ``unix_socket``), for requests and replies; the
        URL's port when it cannot be reached, and always for event streams."""
        self._timeout = timeout
        self._unix_socket = unix_socket
        self._connect(url, api_key)
        # For the embedded server: when nothing listens any more, start (or find) it again and retry.
        self.recover = recover
        self._reconnect_lock = threading.Lock()

    def _connect(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/")
        self._headers = {"x-api-key": api_key} if api_key else {}
        self._pool = _Pool(self.url, self._timeout, self._unix_socket)

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
        headers = {"x-request-id": os.urandom(16).hex()}  # as random as uuid4's, a fifth of its time
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
        if not reply.content:
            return None
        return jsontext.loads(reply.content)  # orjson, unless it would misread an integer past 64 bits
    request_id = reply.headers.get("x-request-id")
    text = reply.content.decode("utf-8", errors="replace")
    try:
        error = json.loads(text)["error"]
        code, message = error.get("code", "error"), error.get("message", text)
        request_id = error.get("request_id") or request_id
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message = "error", text[:500] or reply.reason
    raise error_for_status(reply.status, code, message, request_id)


def _reason(error: BaseException) -> str:
    """What went wrong, for `ControlPlaneUnreachable` (e.g. "ConnectionRefusedError: [Errno 111] …")."""
    if isinstance(error, TimeoutError):
        return "timed out waiting for the server"
    return type(error).__name__ + (f": {error}" if str(error) else "")
