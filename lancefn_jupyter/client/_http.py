"""The one HTTP transport shared by every resource module: auth header, error envelope, timeouts."""

from __future__ import annotations

import threading
import uuid
from typing import Any, Callable, Optional

import httpx

from .errors import ControlPlaneUnreachable, error_for_status

__all__ = ["Transport"]

_ARROW_STREAM = "application/vnd.apache.arrow.stream"  # = dataplane.MEDIA_TYPE (not imported: keep the client light)
# Requests that create something new each time they are sent.
_NOT_REPEATABLE = frozenset({"/v1/functions/run"})
# What a request to a server that died (or was replaced) fails with.
_SERVER_GONE = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class Transport:
    """A thin wrapper over one pooled `httpx.Client` (keep-alive matters: a warm registration is ~2 requests)."""

    def __init__(
        self,
        url: str,
        api_key: Optional[str],
        *,
        timeout: float = 30.0,
        recover: Optional[Callable[[], tuple[str, str]]] = None,
    ):
        self.url = url.rstrip("/")
        self._timeout = timeout
        headers = {"x-api-key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        # For the embedded server: when nothing listens any more, start (or find) it again and retry.
        self.recover = recover
        self._reconnect_lock = threading.Lock()

    def _reconnect(self, failed: httpx.Client) -> bool:
        """Point at the server `recover` returns; False when there is no way to recover.

        `failed` is the client the request failed on: if another thread (the widgets' event listener)
        already reconnected, its new client is used as is.
        """
        if self.recover is None:
            return False
        with self._reconnect_lock:
            if self._http is failed:
                url, api_key = self.recover()
                self.url = url.rstrip("/")
                self._http = httpx.Client(base_url=self.url, headers={"x-api-key": api_key}, timeout=self._timeout)
                failed.close()
        return True

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: Optional[float] = None,
        content: Optional[bytes] = None,
        content_type: Optional[str] = None,
        params: Optional[dict[str, Any]] = None,
    ) -> Any:
        """JSON in and out; ``content`` + ``content_type`` send a binary body (Arrow IPC rows),
        and an Arrow IPC reply comes back as ``bytes``."""
        kwargs: dict[str, Any] = {"headers": {"x-request-id": uuid.uuid4().hex}}
        if body is not None:
            kwargs["json"] = body
        if content is not None:
            kwargs["content"] = content
            kwargs["headers"]["content-type"] = content_type or "application/octet-stream"
        if params:
            kwargs["params"] = params
        if timeout is not None:
            kwargs["timeout"] = timeout
        http = self._http
        try:
            try:
                response = http.request(method, path, **kwargs)
            except _SERVER_GONE as error:
                # Refused, or a pooled keep-alive socket to a server that is gone. Sending again is safe
                # when it never reached a server (refused) or when the request is idempotent; a `run`
                # that may have reached a dying server is not resent (it could start the job twice).
                if not (isinstance(error, httpx.ConnectError) or path not in _NOT_REPEATABLE):
                    raise
                if not self._reconnect(http):
                    raise
                response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ControlPlaneUnreachable(
                self.url, type(error).__name__ + (f": {error}" if str(error) else "")
            ) from None
        return self._decode(response)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> Any:
        return self.request("POST", path, body, **kwargs)

    def stream(self, path: str, headers: dict[str, str], timeout: httpx.Timeout):
        """An open streaming GET (the caller iterates and closes it); used by the event stream."""
        http = self._http
        try:
            try:
                response = http.send(http.build_request("GET", path, headers=headers, timeout=timeout), stream=True)
            except _SERVER_GONE:
                if not self._reconnect(http):
                    raise
                http = self._http
                response = http.send(http.build_request("GET", path, headers=headers, timeout=timeout), stream=True)
        except httpx.TransportError as error:
            raise ControlPlaneUnreachable(self.url, type(error).__name__) from None
        if response.status_code >= 400:
            response.read()
            self._decode(response)
        return response

    @staticmethod
    def _decode(response: httpx.Response) -> Any:
        if response.status_code < 400:
            if response.headers.get("content-type", "").startswith(_ARROW_STREAM):
                return response.content
            return response.json() if response.content else None
        request_id = response.headers.get("x-request-id")
        try:
            error = response.json()["error"]
            code, message = error.get("code", "error"), error.get("message", response.text)
            request_id = error.get("request_id") or request_id
        except (ValueError, KeyError, TypeError):
            code, message = "error", response.text[:500] or response.reason_phrase
        raise error_for_status(response.status_code, code, message, request_id)

    def close(self) -> None:
        self._http.close()
