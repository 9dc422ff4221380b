"""How a task's data reaches its worker: the two ways a plug-in's ``ship`` may be (docs/ARCHITECTURE.md, "Executor
plug-ins", "Arrow data plane").

``TaskSpec.data`` names files in the control plane's home (``HOME_FILES``): ``rows_file`` (the rows, an Arrow IPC
file, instead of ``rows``), ``result_file`` (where an Arrow result goes) and ``result_stage`` (where it may be staged
instead: "Result staging"). A backfill chunk's rows are a slice of a Lance table (``TaskSpec.table_slice``) that the
control plane reads into ``rows_file`` before launch (``table_agent.read_rows``: a team's with the team's rights) or
that travels as it is, for the worker to read.

* :func:`in_place`: the worker is on this machine: it reads and writes those files where they are (a worker run as
  another user gets them on its pipes, ``worker.process.WorkerProcess``). Every slice is read into ``rows_file`` first.
* :func:`as_bytes`: the worker may be on another node: the rows travel as IPC bytes (``rows_ipc``), the result
  comes back as IPC bytes (``result_ipc``) which the executor writes to ``result_file``; a slice that names no
  team's ``root`` travels as it is and is read by the worker, a team's was read into ``rows_file`` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["HOME_FILES", "as_bytes", "in_place"]

HOME_FILES = ("rows_file", "result_file", "result_stage")


def in_place(data: Mapping[str, object], table_slice: Mapping[str, object] | None = None) -> Mapping[str, object]:
    """``data`` as it is (its slice, if any, was read into ``rows_file`` before launch)."""
    return data


def as_bytes(data: Mapping[str, object], table_slice: Mapping[str, object] | None = None) -> dict:
    """The data plane's task fields for a worker elsewhere: Arrow rows as IPC bytes (the task may run on another
    node) and the result back as IPC bytes (``result_ipc``), never as JSON. A backfill chunk's ``table_slice`` goes as
    it is: the task reads its rows from the table."""
    if not data:
        return {}
    fields = {"input_types": data.get("input_types") or {}, "output_type": data.get("output_type"), "result_ipc": True}
    if table_slice is not None:
        fields["table_slice"] = table_slice
    elif "rows_file" in data:
        fields["rows_ipc"] = Path(str(data["rows_file"])).read_bytes()
    for key in (
        "on_error",
        "batched",
        "output_fields",
        "output_field_types",
    ):  # the worker's call mode ("Batched functions"), its checks
        if key in data:
            fields[key] = data[key]
    return fields
