"""A task's result as its ``result`` event: JSON for small plain values, else Arrow IPC
(docs/ARCHITECTURE.md, "Arrow data plane" and "Worker protocol").

Runs in the task's process (the local warm worker or a Ray task); the data plane module imports
neither numpy nor pyarrow until a result needs them.
"""

from __future__ import annotations

import os

from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.worker.protocol import JSON_RESULT_MAX_BYTES, dumps, result_target

__all__ = ["TaskFailure", "json_too_large", "result_event", "result_too_large"]

# Plain results up to this much JSON travel inline (faster for small scalar jobs); bigger ones,
# and values JSON cannot carry (NaN, ±Inf), go as Arrow IPC when the task allows it (else JSON up to
# ``JSON_RESULT_MAX_BYTES``: 256 Ki characters are at most that many bytes).
_JSON_RESULT_MAX_CHARS = 256 * 1024
_JSON_RESULT_MAX_ITEMS = 16 * 1024


def json_too_large(nbytes: int) -> str:
    """The failure message of a JSON result over ``JSON_RESULT_MAX_BYTES`` (the control plane says the same)."""
    return (
        f"the result is {nbytes} bytes of JSON, over the limit of {JSON_RESULT_MAX_BYTES >> 20} MiB for a JSON result "
        "(lancefn_jupyter.worker.protocol.JSON_RESULT_MAX_BYTES); return large data as arrays (annotate the return "
        "type as a numpy array or a list of numbers), which travel as Arrow files"
    )


def result_too_large(nbytes: int, limit: int) -> str:
    """The failure message of an Arrow result over ``--max-arrow-result-bytes`` (the control plane says the same)."""
    return (
        f"the result is {nbytes} bytes, over the server's limit of {limit} bytes for a job's result "
        "(--max-arrow-result-bytes); return less per job (map over smaller chunks, or backfill into a table)"
    )


class TaskFailure(Exception):
    """Ends a task with a ``failed`` event of this phase, message and (user-only) traceback."""

    def __init__(
        self,
        phase: str,
        message: str,
        tb: str | None = None,
        *,
        frames: list | None = None,
        rows: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(message)
        self.phase, self.message, self.traceback = phase, message, tb
        # Debugging a failure (docs/ARCHITECTURE.md): the artifact frames' locals and the failing rows' span.
        self.frames, self.rows = frames, rows
        self.original: BaseException | None = None  # the user's exception a setup failure stands for


def _to_json(value: object, where: str) -> object:
    """Plain JSON values; numpy scalars and arrays become Python values; anything else is refused."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TaskFailure("result", f"{where} is {value}, which JSON cannot carry; return None or a finite number")
        return value
    if type(value).__module__.split(".")[0] == "numpy" and hasattr(value, "tolist"):
        return _to_json(value.tolist(), where)
    if isinstance(value, (list, tuple)):
        return [_to_json(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _to_json(item, f"{where}[{key!r}]") for key, item in value.items()}
    kind = (
        "dict with non-str keys"
        if isinstance(value, dict)
        else f"type {type(value).__module__}.{type(value).__qualname__}"
    )
    raise TaskFailure(
        "result",
        f"{where} has {kind}, which cannot be sent back as JSON; return None, bool, int, float, str, "
        "lists or dicts with str keys (numpy scalars and arrays are converted)",
    )


def _rough_items(values: list) -> int:
    """About how many scalars ``values`` hold (top level only): big results skip JSON at once."""
    return sum(len(v) if isinstance(v, (list, tuple, str, bytes)) else getattr(v, "size", 1) for v in values)


def result_event(
    task: dict,
    values: list | None,
    *,
    column: object = None,
    batch: object = None,
    errors: list | None = None,
) -> dict:
    """The ``result`` event's fields: ``results`` (JSON) for small plain values, else the Arrow
    IPC result written to ``result_file`` (``{result_file, nbytes, summary}``), or returned as
    ``result_ipc`` bytes when the task has no file (Ray moves those bytes natively).

    A batched call's result may come as its Arrow ``column`` already built (``batch``: the value
    it came from, for the summary); ``errors`` (one per row, None for good rows) carries skipped rows
    (``on_error="skip"``), and such a result always goes as Arrow (docs/ARCHITECTURE.md, "Batched functions")."""
    output_type = task.get("output_type")
    arrow_ok = output_type is not None and ("result_file" in task or task.get("result_ipc") or task.get("result_frame"))
    rows = len(values) if values is not None else len(column)  # type: ignore[arg-type]
    many = rows > 1

    def where(index: int) -> str:
        return f"the result of row {index}" if many else "the result"

    plain = column is None and errors is None and not dataplane.is_data_type(output_type)
    if plain and (not arrow_ok or _rough_items(values) <= _JSON_RESULT_MAX_ITEMS):  # type: ignore[arg-type]
        try:
            results = [_to_json(value, where(index)) for index, value in enumerate(values)]  # type: ignore[arg-type]
            text = dumps(results)
        except TaskFailure:
            if not arrow_ok:  # no Arrow path (an old caller): the JSON rules apply
                raise
        else:
            if len(text) <= _JSON_RESULT_MAX_CHARS:
                return {"results": results}
            if not arrow_ok:  # JSON or nothing: up to the limit the control plane holds it to
                nbytes = len(text.encode())
                if nbytes > JSON_RESULT_MAX_BYTES:
                    raise TaskFailure("result", json_too_large(nbytes))
                return {"results": results}
    if not arrow_ok:
        needs = "skipped rows need" if errors is not None else f"the result is declared {output_type}, which needs"
        raise TaskFailure("result", f"{needs} the Arrow data plane")
    try:
        table = dataplane.encode_results(values, output_type, many=many, column=column, errors=errors)  # type: ignore[arg-type]
    except dataplane.DataPlaneError as error:
        raise TaskFailure("result", str(error)) from None

    def summary(nbytes: int) -> dict:
        if values is not None:
            found = dataplane.summarize_results(values, nbytes)
        else:
            found = {**(dataplane.summarize(batch) if batch is not None else {"type": "list", "shape": [rows]})}
            found["nbytes"] = int(nbytes)
        if errors is not None:
            found["rows_skipped"] = sum(error is not None for error in errors)
        return found

    most = task.get("result_max_bytes")
    if isinstance(most, int) and table.nbytes > most:  # the control plane would refuse it: not written at all
        raise TaskFailure("result", result_too_large(table.nbytes, most))
    if "result_file" in task:
        path, slot = result_target(task, table.nbytes)
        if slot is not None and os.path.exists(slot):
            nbytes = dataplane.write_ipc_into(slot, path, table)
        else:
            nbytes = dataplane.write_ipc_file(path, table, durable=bool(task.get("result_fsync", True)))
        return {"result_file": path, "nbytes": nbytes, "summary": summary(nbytes)}
    data = dataplane.to_ipc_bytes(table)
    key = "result_frame" if task.get("result_frame") else "result_ipc"
    return {key: data, "nbytes": len(data), "summary": summary(len(data))}
