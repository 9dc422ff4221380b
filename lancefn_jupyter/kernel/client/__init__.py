"""HTTP client for the lancefn control plane: one module per REST resource (docs/ARCHITECTURE.md, "REST API (v1)"),
plus the kernel's event listener (`listener.py`) and logger (`logs.py`). Runs in the kernel (or any
Python process that talks to a control plane); it imports only `wire` of the package."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lancefn_jupyter.kernel.client._http import EventStream, Transport
from lancefn_jupyter.kernel.client.backfills import BackfillsResource
from lancefn_jupyter.kernel.client.batches import BatchesResource
from lancefn_jupyter.kernel.client.errors import (
    ApiError,
    Conflict,
    ControlPlaneUnreachable,
    Forbidden,
    InvalidRequest,
    LancefnEnvironmentWarning,
    LancefnError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
)
from lancefn_jupyter.kernel.client.events import Event, iter_events, open_event_stream
from lancefn_jupyter.kernel.client.functions import FunctionsResource
from lancefn_jupyter.kernel.client.gpu import GpuResource
from lancefn_jupyter.kernel.client.jobs import JobsResource
from lancefn_jupyter.kernel.client.secrets import SecretsResource

__all__ = [
    "ApiError",
    "Client",
    "Conflict",
    "ControlPlaneUnreachable",
    "Event",
    "EventStream",
    "Forbidden",
    "InvalidRequest",
    "LancefnEnvironmentWarning",
    "LancefnError",
    "NotFound",
    "PayloadTooLarge",
    "Unauthorized",
]


class Client:
    """A connection to one control plane (embedded or remote). Thread-safe (a pool of keep-alive connections)."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        recover: Callable[[], tuple[str, str]] | None = None,
        unix_socket: str | None = None,
    ):
        """`recover`, if given, returns a (url, api_key) to switch to when the server refuses connections.
        `unix_socket`: the same server's Unix socket on this machine (`server.json`'s `unix_socket`), used for requests
        while it can be reached (docs/ARCHITECTURE.md, "Local clients")."""
        self._transport = Transport(url, api_key, timeout=timeout, recover=recover, unix_socket=unix_socket)
        self.jobs = JobsResource(self._transport)
        self.functions = FunctionsResource(self._transport, self.jobs)
        self.gpu = GpuResource(self._transport)
        self.batches = BatchesResource(self._transport)
        self.backfills = BackfillsResource(self._transport)
        self.secrets = SecretsResource(self._transport)

    @property
    def url(self) -> str:
        """The server in use now (an embedded one may have been restarted on another port)."""
        return self._transport.url

    def health(self) -> dict[str, Any]:
        return self._transport.get("/v1/health")

    def events(self, *, last_event_id: int | None = None, read_timeout: float | None = 60.0) -> Iterator[Event]:
        return iter_events(self._transport, last_event_id=last_event_id, read_timeout=read_timeout)

    def open_event_stream(
        self,
        *,
        last_event_id: int | None = None,
        read_timeout: float | None = 60.0,
        connect_timeout: float = 10.0,
    ) -> EventStream:
        """The open SSE response behind `events()`, for a caller that must reach its socket (the kernel's
        listener shuts it down to stop at once); iterate `client.events.parse_sse_lines(r.iter_lines())`, then close it."""
        return open_event_stream(
            self._transport, last_event_id=last_event_id, read_timeout=read_timeout, connect_timeout=connect_timeout
        )

    def close(self) -> None:
        self._transport.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"
