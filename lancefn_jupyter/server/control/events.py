"""Job events: the in-process bus (publish from any thread, fan out on the event loop) and the SSE
stream `GET /v1/jobs/events` serves from it and the durable event log (docs/ARCHITECTURE.md, "Events").

Runs in the control plane, on the event loop (publish from any thread).  The journal and the reports
publish; `routes/events.py` only routes a request here. Framing is `id:` (job events that have a
durable sequence number, so clients resume with `Last-Event-ID`), `event:` and one `data:` line.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from lancefn_jupyter.server.control.loop_calls import call_on_loop
from lancefn_jupyter.server.policy.namespaces import visible

KEEPALIVE_FRAME = ": keepalive\n\n"


def frame(kind: str, data: str, event_id: int | None = None) -> str:
    """One SSE message; ``event_id`` only for events a client may resume after."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {data}\n\n"


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class Subscriber:
    """One SSE client's buffer.  If it falls too far behind it is marked ``overflowed`` and
    re-reads from the durable event log instead of growing without bound."""

    LIMIT = 10_000

    def __init__(self, scope: str | None = None) -> None:
        self.scope = scope  # the one namespace whose job events it gets; None: all (admin)
        self.items: collections.deque[tuple[str, int | None, str]] = collections.deque()
        self.ready = asyncio.Event()
        self.overflowed = False
        self.closed = False  # the server is shutting down: end the stream

    def push(self, item: tuple[str, int | None, str]) -> None:
        if self.overflowed:
            return
        if len(self.items) >= self.LIMIT:
            self.items.clear()
            self.overflowed = True
        else:
            self.items.append(item)
        self.ready.set()


class EventBus:
    """Fan-out of ``(kind, seq, data)`` to asyncio subscribers; publish from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subscribers: set[Subscriber] = set()

    def attach(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop

    def listened(self) -> bool:
        """Whether anyone would get a published event now (so building one is worth it)."""
        return self._loop is not None and bool(self._subscribers)

    def publish(
        self, kind: str, seq: int | None, data: str | Callable[[str | None], str], namespace: str | None = None
    ) -> None:
        """``namespace``: only subscribers that may see it get the item.  ``data`` may instead be
        a view: called once per subscriber scope on the loop thread (e.g. the ``queue`` event)."""
        loop = self._loop
        if loop is None or not self._subscribers:
            return
        try:
            call_on_loop(loop, self._fanout, kind, seq, data, namespace)
        except RuntimeError:  # loop closed during shutdown
            pass

    def _fanout(
        self, kind: str, seq: int | None, data: str | Callable[[str | None], str], namespace: str | None
    ) -> None:
        views: dict[str | None, str] = {}
        for subscriber in list(self._subscribers):
            if namespace is not None and not visible(subscriber.scope, namespace):
                continue
            if callable(data):
                if subscriber.scope not in views:
                    views[subscriber.scope] = data(subscriber.scope)
                subscriber.push((kind, seq, views[subscriber.scope]))
            else:
                subscriber.push((kind, seq, data))

    def close(self) -> None:
        """End every stream (server shutdown); call on the loop thread."""
        for subscriber in list(self._subscribers):
            subscriber.closed = True
            subscriber.ready.set()

    def subscribe(self, scope: str | None = None) -> Subscriber:
        subscriber = Subscriber(scope)
        self._subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)


class Snapshots(Protocol):
    """The opening ``usage`` and ``queue`` events of a stream (``reports.Reports``)."""

    def gpu_usage(self) -> dict: ...

    def queue_snapshot(self, scope: str | None = None) -> dict | None: ...


async def event_stream(
    bus: EventBus,
    snapshots: Snapshots,
    events_after: Callable[..., list[tuple[int, str]]],
    last: int,
    scope: str | None,
    off_loop: Callable[..., Awaitable[Any]],
    keepalive_s: float,
) -> AsyncIterator[str]:
    """SSE: durable job events after ``last`` (``events_after(seq, limit, scope)``: the store's
    event log), then live ones from ``bus``; usage events interleaved.
    ``scope``: only this namespace's job events (None: all, for the admin)."""
    subscriber = bus.subscribe(scope)  # subscribe before reading the backlog so nothing falls between
    try:
        backlog = True
        while not subscriber.closed:
            if backlog or subscriber.overflowed:
                # Catch up (at the start, and after an overflow dropped items): clear first, then read
                # everything anew, so an item pushed meanwhile is only older than what follows it.
                subscriber.overflowed = False
                subscriber.items.clear()
                # The id is the resume point, so a client that sees no job event before a restart can still resume.
                yield frame("usage", _compact(await off_loop(snapshots.gpu_usage)), last)
                queue = await off_loop(snapshots.queue_snapshot, scope)
                if queue is not None:
                    yield frame("queue", _compact(queue))
                while True:
                    rows = await off_loop(events_after, last, 500, scope)
                    for seq, data in rows:
                        yield frame("job", data, seq)
                        last = seq
                    if len(rows) < 500:
                        break
                backlog = False
            while subscriber.items:
                kind, seq, data = subscriber.items.popleft()
                if kind != "job":
                    yield frame(kind, data)
                elif seq is None:
                    # A change the full disk kept from being saved (yet): live only, no resume id.
                    yield frame("job", data)
                elif seq > last:  # else already sent from the backlog
                    last = seq
                    yield frame("job", data, seq)
            if subscriber.closed:
                break
            subscriber.ready.clear()
            try:
                await asyncio.wait_for(subscriber.ready.wait(), keepalive_s)
            except TimeoutError:
                yield KEEPALIVE_FRAME
    finally:
        bus.unsubscribe(subscriber)
