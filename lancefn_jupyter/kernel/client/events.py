"""`GET /v1/jobs/events`: the Server-Sent Events stream of job changes and GPU usage."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lancefn_jupyter.kernel.client._http import EventStream, Transport

__all__ = ["Event", "iter_events", "parse_sse_lines"]


@dataclass(frozen=True)
class Event:
    """One SSE event: `job` events carry a Job dict and a durable `id`; `usage` events have no id."""

    event: str
    data: Any
    id: int | None = None


def parse_sse_lines(lines: Iterator[str]) -> Iterator[Event]:
    """Pure SSE framing (WHATWG rules we rely on: `id`, `event`, multi-line `data`, comments)."""
    event, event_id = "message", None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                text = "\n".join(data)
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = text
                yield Event(event=event, data=payload, id=event_id)
            event, data, event_id = "message", [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = int(value) if value.isdigit() else None


def open_event_stream(
    transport: Transport,
    *,
    last_event_id: int | None = None,
    read_timeout: float | None = 60.0,
    connect_timeout: float = 10.0,
) -> EventStream:
    """An open `GET /v1/jobs/events` response, resuming after `last_event_id` (the caller iterates
    `parse_sse_lines(response.iter_lines())` and closes it)."""
    headers = {"accept": "text/event-stream"}
    if last_event_id is not None:
        headers["last-event-id"] = str(last_event_id)
    return transport.stream("/v1/jobs/events", headers, connect_timeout=connect_timeout, read_timeout=read_timeout)


def iter_events(
    transport: Transport, *, last_event_id: int | None = None, read_timeout: float | None = 60.0
) -> Iterator[Event]:
    """One connection's events, resuming after `last_event_id`. Ends when the server closes it.

    `read_timeout` bounds silence between events; the server sends a keepalive every 15 s.
    """
    response = open_event_stream(transport, last_event_id=last_event_id, read_timeout=read_timeout)
    try:
        yield from parse_sse_lines(response.iter_lines())
    finally:
        response.close()
