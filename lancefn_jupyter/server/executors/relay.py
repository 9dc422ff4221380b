"""The parent side of the worker protocol (docs/ARCHITECTURE.md, "Worker protocol"): a task as its worker's task
(:func:`worker_task`), what a worker's event must be (:func:`event_problem`, pure: a job may write to its worker's
protocol channel, so every event is checked before it is believed), and one event as the executor callback it means
(:func:`relay`). Every executor relays through it, in the control plane (the Ray bridge checks its actors' events
with the same rules)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.worker.process import WorkerTask
from lancefn_jupyter.worker.protocol import artifact_filename

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import ExecutorCallbacks, TaskSpec
    from lancefn_jupyter.wire.models import JobFailure

__all__ = [
    "ALL_PHASES",
    "TASK_EVENTS",
    "WORKER_PHASES",
    "event_problem",
    "failure_of",
    "relay",
    "worker_task",
]

# What a worker sends for a task: its output, its progress, then one outcome (a Ray actor's events add ``started``).
TASK_EVENTS = ("log", "progress", "result", "failed")
# The phases a worker's ``failed`` event may name: the others (``worker``, ``timeout``, ``executor``,
# ``server_restart``) are the control plane's own findings, never a worker's word.
WORKER_PHASES = ("validation", "environment", "setup", "run", "result")
# Every phase of ``JobFailure`` (the Ray bridge's own outcomes name the control plane's phases too).
ALL_PHASES = (*WORKER_PHASES, "import", "worker", "timeout", "server_restart", "executor")
_STREAMS = ("stdout", "stderr")
# Exact types, as JSON parses them (a bool is no number here); checked on every event, so kept to a few lookups.
_NUMBERS = (int, float)
# The function env arrives with the task; these would change the worker's devices after start.
_DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "NUMBA_ENABLE_CUDASIM")


def worker_task(task: TaskSpec, data: Mapping[str, object]) -> WorkerTask:
    """``task`` as its worker's task, with ``data`` as its executor's plug-in ships it (``ExecutorPlugin.ship``)."""
    return WorkerTask(
        task.job_id,
        task.artifact,
        task.entrypoint,
        artifact_filename(task.name, task.version),
        task.rows,
        # A built environment's build checked them in its interpreter (environments/build.py).
        task.packages if task.venv is None else (),
        env={name: value for name, value in task.env.items() if name not in _DEVICE_ENV},
        data=data,
        state=task.state,
        python_version=task.environment.python_version if task.environment is not None else None,
        setup_digest=task.setup_digest,
    )


def _count(value: object) -> bool:
    return type(value) is int and value >= 0


def _texts(value: object) -> bool:
    return type(value) is list and all(type(item) is str for item in value)


def _log(event: dict, _phases: Collection[str]) -> str | None:
    if event.get("stream") not in _STREAMS:
        return f"its stream is {str(event.get('stream'))[:80]!r}, not one of {', '.join(_STREAMS)}"
    lines: list = event.get("lines")  # type: ignore[assignment]  # checked next
    if not _texts(lines):
        return "its lines are not a list of strings"
    rows = event.get("rows")
    if rows is not None and not (
        type(rows) is list and len(rows) == len(lines) and all(row is None or _count(row) for row in rows)
    ):
        return "its rows are not a row number (or null) per line"
    return None


def _progress(event: dict, _phases: Collection[str]) -> str | None:
    return None if _count(event.get("rows_done")) else "rows_done is not a whole number ≥ 0"


def _started(event: dict, _phases: Collection[str]) -> str | None:
    node = event.get("node")
    return (
        None if _texts(event.get("devices", [])) and type(node) in (str, type(None)) else "its placement is malformed"
    )


def _failed(event: dict, phases: Collection[str]) -> str | None:
    if event.get("phase") not in phases:
        return f"its phase is {str(event.get('phase'))[:80]!r}, not one of {', '.join(phases)}"
    if type(event.get("message")) is not str:
        return "its message is not a string"
    if type(event.get("traceback")) not in (str, type(None)):
        return "its traceback is not a string"
    if type(event.get("frames", [])) is not list:  # their contents are bounded where stored (wire/frames.py)
        return "its frames are not a list"
    span = event.get("failing_rows", [0, 0])
    if type(span) is not list or len(span) != 2 or not all(_count(n) for n in span) or span[0] > span[1]:
        return "its failing_rows are not [start, end] row numbers"
    return None if type(event.get("retryable", False)) is bool else "retryable is not true or false"


def _result(event: dict, _phases: Collection[str]) -> str | None:
    if "results" in event:  # JSON results, or an Arrow result file
        return None if type(event["results"]) is list and "result_file" not in event else "results is not a list"
    if type(event.get("result_file")) is not str or not _count(event.get("nbytes")):
        return "it has neither a results list nor a result file with its size"
    return None if type(event.get("summary", {})) is dict else "its summary is not a mapping"


_CHECKS = {"log": _log, "progress": _progress, "started": _started, "failed": _failed, "result": _result}


def _outcome_problem(event: dict, task_id: str | None) -> str | None:
    """What is wrong with the fields every outcome may carry (its task, timings, memory), or None."""
    if task_id is not None and event.get("task_id", task_id) != task_id:
        return f"it is for another task ({str(event.get('task_id'))[:80]!r}), not job {task_id}"
    timings = event.get("timings")
    if timings is not None and (type(timings) is not dict or any(type(v) not in _NUMBERS for v in timings.values())):
        return "its timings are not a mapping of numbers"
    return None if type(event.get("rss_mb", 0)) in _NUMBERS else "rss_mb is not a number"


def event_problem(
    event: object,
    task_id: str | None = None,
    *,
    kinds: Collection[str] = TASK_EVENTS,
    phases: Collection[str] = WORKER_PHASES,
) -> str | None:
    """Why ``event`` (a parsed protocol line) is no valid event of ``kinds`` for the task ``task_id``, as the end of
    "the worker sent an invalid … event: …" (``worker.process.invalid_event``); None when it is one. An outcome
    naming another task (``task_id``) is refused: a worker that still runs an earlier job's code (it sent an outcome
    early) must not end the next one with it."""
    if type(event) is not dict:
        return "a line that is not a JSON object"
    kind = event.get("event")
    if type(kind) is not str or kind not in kinds:
        return f"no such event here (the protocol's: {', '.join(kinds)})"
    problem = _CHECKS[kind](event, phases)
    if problem is None and (kind == "result" or kind == "failed"):
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
        **_debugging(event),
    )


def _debugging(event: Mapping[str, Any]) -> dict[str, Any]:
    """A ``failed`` event's frames and failing rows' span as ``JobFailure`` fields, the frames within the bounds
    (docs/ARCHITECTURE.md, "Debugging a failure")."""
    from lancefn_jupyter.wire.frames import bounded_frames

    fields: dict[str, Any] = {}
    frames = bounded_frames(event.get("frames"))
    if frames is not None:
        fields["frames"] = frames
    if "failing_rows" in event:
        fields["failing_rows"] = tuple(event["failing_rows"])
    return fields


def relay(callbacks: ExecutorCallbacks, job_id: str, event: Mapping[str, Any]) -> None:
    """One valid worker event (``started``, ``log``, ``progress``, ``result``, ``failed``: :func:`event_problem`) as
    the executor callback it means. A ``result`` carries JSON ``results`` or names an Arrow result file; a final
    event's ``timings`` (the worker's, plus the executor's ``start_ms``) go with it ("Warm state")."""
    kind = event.get("event")
    if kind == "started":
        callbacks.task_started(job_id, devices=tuple(event.get("devices", ())), node=event.get("node"))
    elif kind == "log":
        rows = event.get("rows")
        lines = list(event.get("lines", ()))
        if rows is None:
            callbacks.task_log(job_id, event.get("stream", "stdout"), lines)
        else:
            callbacks.task_log(job_id, event.get("stream", "stdout"), lines, rows=list(rows))
    elif kind == "progress":
        callbacks.task_progress(job_id, int(event.get("rows_done", 0)))
    elif kind == "result":
        callbacks.task_succeeded(job_id, event.get("results", event), timings=event.get("timings"))
    elif kind == "failed":
        callbacks.task_failed(job_id, failure_of(event), timings=event.get("timings"))
