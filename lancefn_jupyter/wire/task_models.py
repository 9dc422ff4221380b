"""A task's data-plane fields (docs/ARCHITECTURE.md, "Executor interface", "Worker protocol"): what
``TaskSpec.data`` holds for an executor, and what the worker's task line carries besides the task itself.

The control plane builds it once per launch (``JobMachine``); an executor reads its fields, and writes it into
a task line as :meth:`TaskData.fields` (the worker reads plain JSON: it runs without pydantic). Every field is
optional: an empty ``TaskData`` means plain JSON rows and results, as before the data plane.

Pure: pydantic and the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr

from lancefn_jupyter.wire.backfill_models import OnError
from lancefn_jupyter.wire.models import FunctionSignature, WireModel

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
    Arrow result is written; ``on_error``: ``"skip"`` gives a failing row a null result ("Batched functions").

    Built on every launch (a warm job's hot path), so its field types are the ones pydantic checks quickest: a
    plain ``dict`` of input types (never changed once built) and ``Literal`` words."""

    input_types: dict[StrictStr, StrictStr] = Field(default_factory=dict)  # param → its per-row type
    output_type: StrictStr | None = None
    batched: BatchedForms | None = None
    rows_total: StrictInt | None = None
    rows_file: StrictStr | None = None
    result_file: StrictStr | None = None
    result_fsync: StrictBool = True
    result_max_bytes: StrictInt | None = None  # --max-arrow-result-bytes
    result_stage: ResultStage | None = None
    on_error: OnError | None = None
    # A class entry's ``__init__`` arguments (LanceDB 0.40's initialization); each distinct set is its own instance.
    init: dict[StrictStr, Any] | None = None
    # A ``named_struct`` output's fields (name → nullable): each row's result is a dict of exactly these.
    output_fields: dict[StrictStr, StrictBool] | None = None
    # Their types (name → signature type): each row's values must convert to them.
    output_field_types: dict[StrictStr, StrictStr] | None = None

    @classmethod
    def of(cls, signature: FunctionSignature, **fields: Any) -> TaskData:
        """A task's data: what the version's ``signature`` sets (input and output types, a batched version's
        forms; as ``dataplane.task_fields`` reads them from a signature's wire form), and ``fields``."""
        batched = None
        if signature.batched:
            forms = {p.name: p.form for p in signature.inputs}
            batched = BatchedForms(inputs=forms, output=signature.output.form)
        types = {p.name: p.arrow_type for p in signature.inputs}
        struct = {f.name: f.nullable for f in signature.output.fields} or None
        struct_types = {f.name: f.arrow_type for f in signature.output.fields} or None
        return cls(
            input_types=types,
            output_type=signature.output.arrow_type,
            batched=batched,
            output_fields=struct,
            output_field_types=struct_types,
            **fields,
        )

    def fields(self) -> dict[str, Any]:
        """The fields as a worker's task line carries them (unset ones left out)."""
        return self.model_dump(exclude_none=True)
