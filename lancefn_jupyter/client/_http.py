"""The one HTTP transport shared by every resource module: auth header, error envelope, timeouts."""

from __future__ import annotations

import uuid
from typing import Any, Optional

import httpx

from .errors import ControlPlaneUnreachable, error_for_status

__all__ = ["Transport"]


class Transport:
    """A thin wrapper over one pooled `httpx.Client` (keep-alive matters: a warm registration is ~2 requests)."""

    def __init__(self, url: str, api_key: Optional[str], *, timeout: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"x-api-key": api_key} if api_key else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *, timeout: Optional[float] = None) -> Any:
        kwargs: dict[str, Any] = {"headers": {"x-request-id": uuid.uuid4().hex}}
        if body is not None:
            kwargs["json"] = body
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ControlPlaneUnreachable(self.url, type(error).__name__ + (f": {error}" if str(error) else "")) from None
        return self._decode(response)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, body: Any, **kwargs: Any) -> Any:
        return self.request("POST", path, body, **kwargs)

    def stream(self, path: str, headers: dict[str, str], timeout: httpx.Timeout):
        """An open streaming GET (the caller iterates and closes it); used by the event stream."""
        try:
            request = self._http.build_request("GET", path, headers=headers, timeout=timeout)
            response = self._http.send(request, stream=True)
        except httpx.TransportError as error:
            raise ControlPlaneUnreachable(self.url, type(error).__name__) from None
        if response.status_code >= 400:
            response.read()
            self._decode(response)
        return response

    @staticmethod
    def _decode(response: httpx.Response) -> Any:
        if response.status_code < 400:
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
