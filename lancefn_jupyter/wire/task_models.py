"""A task's data-plane fields (docs/ARCHITECTURE.md, "Executor interface", "Worker protocol"): what
``TaskSpec.data`` holds for an executor, and what the worker's task line carries besides the task itself.

The control plane builds it once per launch (``JobMachine``); an executor reads its fields, and writes it into
a task line as :meth:`TaskData.fields` (the worker reads plain JSON: it runs without pydantic). Every field is
optional: an empty ``TaskData`` means plain JSON rows and results, as before the data plane.

Pure: pydantic and the standard library only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.backfill_models import OnError
from lancefn_jupyter.wire.models import FunctionSignature, TextMap, WireModel

__all__ = ["BatchedForms", "ResultStage", "TaskData"]


class BatchedForms(WireModel):
    """How a batched version's chunk arrives and leaves (docs/ARCHITECTURE.md, "Batched functions")."""

    inputs: Mapping[StrictStr, StrictStr | None]  # param → "list" | "ndarray" | "arrow" | "record_batch"
    output: StrictStr | None


class ResultStage(WireModel):
    """Where an Arrow result may be staged in memory ("Result staging"): the file, the largest it may be,
    and a free slot to write it into (if there is one)."""

    file: StrictStr
    max_bytes: StrictInt
    slot: StrictStr | None = None


class TaskData(WireModel):
    """The data-plane fields of one task. ``rows_file``: the rows are an Arrow IPC file (the task's JSON
    rows are then empty; a backfill chunk's slice is read into it by the executor); ``result_*``: where and how an
    Arrow result is written; ``on_error``: ``"skip"`` gives a failing row a null result ("Batched functions")."""

    input_types: TextMap = Field(default_factory=dict)  # param → its per-row type
    output_type: StrictStr | None = None
    batched: BatchedForms | None = None
    rows_total: StrictInt | None = None
    rows_file: StrictStr | None = None
    result_file: StrictStr | None = None
    result_fsync: StrictBool = True
    result_max_bytes: StrictInt | None = None  # --max-arrow-result-bytes
    result_stage: ResultStage | None = None
    on_error: OnError | None = None

    @classmethod
    def of(cls, signature: FunctionSignature, **fields: Any) -> TaskData:
        """A task's data: what the version's ``signature`` sets (input/output types, a batched version's forms),
        and ``fields``."""
        return cls(**_signature_fields(signature), **fields)

    def fields(self) -> dict[str, Any]:
        """The fields as a worker's task line carries them (unset ones left out)."""
        return self.model_dump(exclude_none=True)


@functools.lru_cache(maxsize=256)
def _signature_fields(signature: FunctionSignature) -> dict[str, Any]:
    """``dataplane.task_fields`` of a signature, once per signature (read it, never change it)."""
    return dataplane.task_fields(signature.to_wire())
