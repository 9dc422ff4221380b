"""``GET /v1/jobs/events``: the SSE stream of job, queue and usage events (docs/ARCHITECTURE.md,
"Events"); the bus and the framing live in ``server/control/events.py``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import StreamingResponse

from lancefn_jupyter.server.control.events import event_stream
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import who
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext

KEEPALIVE_S = 15.0
EVENTS_PATH = "/v1/jobs/events"  # a stream held open: the guard caps them per key and per peer


def add_routes(router: Router, ctx: RouteContext) -> None:
    plane = ctx.plane

    @router.get(EVENTS_PATH, privilege="jobs", query=(("last_event_id", False),))
    async def job_events(request: Request) -> StreamingResponse:
        raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        if raw is None or raw == "":
            start = await off_loop(plane.store.last_event_seq)  # no resume point: only changes from now on
        elif raw.isdigit() and len(raw) < 19:
            start = int(raw)
        else:
            raise ApiError(400, "Last-Event-ID / last_event_id must be a non-negative integer event id")
        return StreamingResponse(
            event_stream(
                plane.bus, plane.reports, plane.store.events_after, start, who(request).scope, off_loop, KEEPALIVE_S
            ),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
