"""How a task's data reaches a worker elsewhere (``executors/shipping.py``): ``as_bytes`` carries the worker's call
mode and checks (docs/ARCHITECTURE.md, "Batched functions", "LanceDB 0.40 dialect"), the rows as IPC bytes."""

from __future__ import annotations

import pyarrow as pa

from lancefn_jupyter.server.executors.shipping import as_bytes
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import FunctionSignature
from lancefn_jupyter.wire.task_models import TaskData


def test_as_bytes_carries_a_named_struct_outputs_fields_and_the_rows(tmp_path):
    signature = FunctionSignature.from_wire(
        {
            "inputs": [{"name": "x", "arrow_type": "int64", "nullable": False}],
            "output": {
                "kind": "named_struct",
                "fields": [
                    {"name": "q", "arrow_type": "int64", "nullable": False},
                    {"name": "r", "arrow_type": "int64", "nullable": True},
                ],
            },
        }
    )
    rows = tmp_path / "rows.arrow"
    dataplane.write_ipc_file(rows, pa.table({"x": [1, 2]}))
    data = TaskData.of(signature, rows_file=str(rows), on_error="skip").fields()
    assert data["output_fields"] == {"q": False, "r": True}
    shipped = as_bytes(data)
    assert shipped["output_fields"] == {"q": False, "r": True} and shipped["on_error"] == "skip"
    assert data["output_field_types"] == shipped["output_field_types"] == {"q": "int64", "r": "int64"}
    assert dataplane.read_ipc(shipped["rows_ipc"]).column("x").to_pylist() == [1, 2]
    scalar = {"inputs": [], "output": {"kind": "scalar", "arrow_type": "int64", "nullable": False}}
    assert "output_fields" not in TaskData.of(FunctionSignature.from_wire(scalar)).fields()
