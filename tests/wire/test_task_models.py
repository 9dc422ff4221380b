"""A task's data (wire/task_models.py, ``TaskSpec.data``): read from a typed signature exactly as the data plane
reads it from a signature's wire form, every data-plane field carried into the task line, refusals naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.errors import format_validation_error
from lancefn_jupyter.wire.models import FunctionOutput, FunctionParameter, FunctionSignature
from lancefn_jupyter.wire.task_models import BatchedForms, ResultStage, TaskData

pytestmark = pytest.mark.unit

PER_ROW = FunctionSignature(
    inputs=(FunctionParameter(name="x", arrow_type="float64", nullable=False),),
    output=FunctionOutput(kind="scalar", arrow_type="float64", nullable=False),
)
BATCHED = FunctionSignature(
    inputs=(FunctionParameter(name="x", arrow_type="float64", nullable=False, form="ndarray"),),
    output=FunctionOutput(kind="scalar", arrow_type="float64", nullable=False, form="list"),
    batched=True,
)


@pytest.mark.parametrize("signature", [PER_ROW, BATCHED])
def test_task_data_reads_a_typed_signature_as_the_data_plane_reads_its_wire_form(signature):
    data = TaskData.of(signature, rows_total=3)
    assert data.fields() == {**dataplane.task_fields(signature.to_wire()), "rows_total": 3, "result_fsync": True}


def test_task_data_carries_every_data_plane_field():
    data = TaskData.of(
        BATCHED,
        rows_total=4,
        rows_file="/home/data/rows/r.arrow",
        result_file="/home/data/results/j.arrow",
        result_fsync=False,
        result_max_bytes=1 << 30,
        result_stage={"file": "/dev/shm/s/j.arrow", "max_bytes": 1 << 20, "slot": "/dev/shm/s/free"},
        on_error="skip",
    )
    assert data.batched == BatchedForms(inputs={"x": "ndarray"}, output="list")
    assert data.result_stage == ResultStage(file="/dev/shm/s/j.arrow", max_bytes=1 << 20, slot="/dev/shm/s/free")
    assert data.fields() == {
        "input_types": {"x": "float64"},
        "output_type": "float64",
        "batched": {"inputs": {"x": "ndarray"}, "output": "list"},
        "rows_total": 4,
        "rows_file": "/home/data/rows/r.arrow",
        "result_file": "/home/data/results/j.arrow",
        "result_fsync": False,
        "result_max_bytes": 1 << 30,
        "result_stage": {"file": "/dev/shm/s/j.arrow", "max_bytes": 1 << 20, "slot": "/dev/shm/s/free"},
        "on_error": "skip",
    }


def test_empty_task_data_is_plain_json_rows_and_results():
    assert TaskData().fields() == {"input_types": {}, "result_fsync": True}
    assert TaskData().rows_file is None and TaskData().rows_total is None


@pytest.mark.parametrize(
    ("change", "field"),
    [({"on_error": "ignore"}, "on_error"), ({"rows_total": "3"}, "rows_total"), ({"result_stage": {}}, "result_stage")],
)
def test_task_data_refuses_a_wrong_field(change, field):
    with pytest.raises(ValidationError) as caught:
        TaskData.model_validate(change)
    assert format_validation_error(caught.value).startswith(field)
