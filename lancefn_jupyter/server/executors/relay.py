"""The parent side of the worker protocol (docs/ARCHITECTURE.md, "Worker protocol"): what a worker's event must be
(:func:`event_problem`, pure: a job may write to its worker's protocol channel, so every event is checked before it
is believed), and one event as the executor callback it means (:func:`relay`). Both executors relay through it, in
the control plane (the Ray bridge checks its actors' events with the same rules)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import ExecutorCallbacks
    from lancefn_jupyter.wire.models import JobFailure

__all__ = [
    "ALL_PHASES",
    "TASK_EVENTS",
    "WORKER_PHASES",
    "event_problem",
    "failure_of",
    "relay",
]

# What a worker sends for a task: its output, its progress, then one outcome (a Ray actor's events add ``started``).
TASK_EVENTS = ("log", "progress", "result", "failed")
# The phases a worker's ``failed`` event may name: the others (``worker``, ``timeout``, ``executor``,
# ``server_restart``) are the control plane's own findings, never a worker's word.
WORKER_PHASES = ("validation", "environment", "setup", "run", "result")
# Every phase of ``JobFailure`` (the Ray bridge's own outcomes name the control plane's phases too).
ALL_PHASES = (*WORKER_PHASES, "import", "worker", "timeout", "server_restart", "executor")
_STREAMS = ("stdout", "stderr")


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _outcome_problem(event: Mapping[str, Any], task_id: str | None) -> str | None:
    """What is wrong with the fields every outcome may carry (its task, timings, memory), or None."""
    if task_id is not None and event.get("task_id", task_id) != task_id:
        return f"it is for another task ({str(event.get('task_id'))[:80]!r}), not job {task_id}"
    timings = event.get("timings")
    if timings is not None and not (isinstance(timings, dict) and all(_number(v) for v in timings.values())):
        return "its timings are not a mapping of numbers"
    if "rss_mb" in event and not _number(event["rss_mb"]):
        return "rss_mb is not a number"
    return None


def _kind_problem(kind: str, event: Mapping[str, Any], phases: Collection[str]) -> str | None:
    """What is wrong with an event of a known ``kind``, or None."""
    if kind == "log":
        if event.get("stream") not in _STREAMS:
            return f"its stream is {str(event.get('stream'))[:80]!r}, not one of {', '.join(_STREAMS)}"
        return None if _texts(event.get("lines")) else "its lines are not a list of strings"
    if kind == "progress":
        return None if _count(event.get("rows_done")) else "rows_done is not a whole number ≥ 0"
    if kind == "started":
        devices, node = event.get("devices", []), event.get("node")
        return None if _texts(devices) and (node is None or isinstance(node, str)) else "its placement is malformed"
    if kind == "failed":
        if event.get("phase") not in phases:
            return f"its phase is {str(event.get('phase'))[:80]!r}, not one of {', '.join(phases)}"
        if not isinstance(event.get("message"), str):
            return "its message is not a string"
        if not isinstance(event.get("traceback"), (str, type(None))):
            return "its traceback is not a string"
        return None if isinstance(event.get("retryable", False), bool) else "retryable is not true or false"
    if "results" in event:  # result: JSON results, or an Arrow result file
        return None if isinstance(event["results"], list) and "result_file" not in event else "results is not a list"
    if not isinstance(event.get("result_file"), str) or not _count(event.get("nbytes")):
        return "it has neither a results list nor a result file with its size"
    return None if isinstance(event.get("summary", {}), dict) else "its summary is not a mapping"


def event_problem(
    event: object,
    task_id: str | None = None,
    *,
    kinds: Collection[str] = TASK_EVENTS,
    phases: Collection[str] = WORKER_PHASES,
) -> str | None:
    """Why ``event`` (a parsed protocol line) is no valid event of ``kinds`` for the task ``task_id``, as the end of
    "the worker sent an invalid … event: …" (``worker.process.invalid_event``); None when it is one. An outcome naming another
    task (``task_id``) is refused: a worker that still runs an earlier job's code (it sent an outcome early) must
    not end the next one with it."""
    if not isinstance(event, dict):
        return "a line that is not a JSON object"
    kind = event.get("event")
    if not isinstance(kind, str) or kind not in kinds:
        return f"no such event here (the protocol's: {', '.join(kinds)})"
    problem = _kind_problem(kind, event, phases)
    if problem is None and kind in ("result", "failed"):
        problem = _outcome_problem(event, task_id)
    return problem


def failure_of(event: Mapping[str, Any]) -> JobFailure:
    """The ``JobFailure`` a valid ``failed`` event describes."""
    from lancefn_jupyter.wire.models import JobFailure

    return JobFailure(
        phase=event.get("phase", "executor"),
        message=str(event.get("message", "")),
        retryable=bool(event.get("retryable", False)),
        traceback=event.get("traceback"),
    )


def relay(callbacks: ExecutorCallbacks, job_id: str, event: Mapping[str, Any]) -> None:
    """One valid worker event (``started``, ``log``, ``progress``, ``result``, ``failed``: :func:`event_problem`) as
    the executor callback it means. A ``result`` carries JSON ``results`` or names an Arrow result file; a final
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
