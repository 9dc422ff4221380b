"""The parent side of the worker protocol (docs/ARCHITECTURE.md, "Worker protocol"): one worker
event as the executor callback it means. Both executors relay through it, in the control plane."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import ExecutorCallbacks
    from lancefn_jupyter.wire.models import JobFailure

__all__ = ["failure_of", "relay"]


def failure_of(event: Mapping[str, Any]) -> JobFailure:
    """The ``JobFailure`` a ``failed`` event describes."""
    from lancefn_jupyter.wire.models import JobFailure

    return JobFailure(
        phase=event.get("phase", "executor"),
        message=str(event.get("message", "")),
        retryable=bool(event.get("retryable", False)),
        traceback=event.get("traceback"),
    )


def relay(callbacks: ExecutorCallbacks, job_id: str, event: Mapping[str, Any]) -> None:
    """One worker event (``started``, ``log``, ``progress``, ``result``, ``failed``) as the executor
    callback it means. A ``result`` carries JSON ``results`` or names an Arrow result file; a final
    event's ``timings`` (the worker's, plus the executor's ``start_ms``) go with it ("Warm state")."""
    kind = event.get("event")
    if kind == "started":
        callbacks.task_started(job_id, devices=tuple(event.get("devices", ())), node=event.get("node"))
    elif kind == "log":
        callbacks.task_log(job_id, event.get("stream", "stdout"), list(event.get("lines", ())))
    elif kind == "progress":
        callbacks.task_progress(job_id, int(event.get("rows_done", 0)))
    elif kind == "result":
        callbacks.task_succeeded(job_id, event.get("results", event), timings=event.get("timings"))
    elif kind == "failed":
        callbacks.task_failed(job_id, failure_of(event), timings=event.get("timings"))
