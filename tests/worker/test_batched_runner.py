"""Batched versions in the worker (docs/ARCHITECTURE.md, "Batched functions"): one call per task with the
rows as one batch of each form (list, ndarray, pyarrow.Array, RecordBatch), the result's length checked in
phase `result`, and `on_error="skip"`: per-row functions skip failing rows, batched ones bisect."""

from __future__ import annotations

import base64
import json
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from lancefn_jupyter.kernel.packaging import package_cell
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.worker import runner

pytestmark = pytest.mark.unit

FILENAME = "<gpu_function f@v1>"


def run(cell: str, rows_table=None, *, rows=None, batched=True, **fields) -> dict:
    """Run the cell's entry on the rows in this process, as a Ray task would (run_task_inline)."""
    cell = textwrap.dedent(cell)
    namespace: dict = {}
    exec(cell, namespace)
    packaged = package_cell(cell, namespace, batched=batched)
    task = {
        "task_id": "t",
        "artifact_b64": base64.b64encode(packaged.source).decode(),
        "entrypoint": packaged.entrypoint,
        "filename": FILENAME,
        "packages": [],
        "result_ipc": True,
        **dataplane.task_fields(packaged.signature.to_wire()),
        **fields,
    }
    if rows_table is not None:
        task["rows_ipc"] = dataplane.to_ipc_bytes(rows_table)
    else:
        task["rows"] = rows
    final = runner.run_task_inline(task, lambda **event: None)
    if "result_ipc" in final:
        final["table"] = dataplane.read_ipc(final.pop("result_ipc"))
    return final


def calls() -> list:
    """What the loaded artifact recorded in its module-level CALLS (the version stays loaded)."""
    return sys.modules["__gpu_function__"].CALLS


@pytest.fixture(autouse=True)
def _fresh_worker_state():
    yield
    runner.release()


def rows_of(batches: dict, types: dict, forms: dict):
    return dataplane.batch_rows(batches, types, forms, name="f")


def test_list_form_one_call_over_every_row():
    cell = """
        CALLS = []
        def f(x: list[float], label: list[str]) -> list[str]:
            CALLS.append(len(x))
            return [f"{s}={v * 2}" for v, s in zip(x, label)]
    """
    table = rows_of(
        {"x": [1.0, 2.5, 3.0], "label": ["a", "b", "c"]},
        {"x": "float64", "label": "utf8"},
        {"x": "list", "label": "list"},
    )
    final = run(cell, table)
    assert final["event"] == "result" and calls() == [3]
    assert final["results"] == ["a=2.0", "b=5.0", "c=6.0"]  # small plain values: JSON, as for per-row
    json_rows = run(cell, rows=[{"x": 1.0, "label": "z"}, {"x": 4.0, "label": "y"}])  # JSON rows: the same call
    assert json_rows["results"] == ["z=2.0", "y=8.0"] and calls() == [3, 2]  # the version stayed loaded


def test_ndarray_form_is_the_stacked_rows_and_the_result_goes_back_whole():
    cell = """
        import numpy as np
        from numpy.typing import NDArray
        CALLS = []
        def f(x: NDArray[np.float32]) -> NDArray[np.float32]:
            CALLS.append((x.shape, x.dtype.name, x.flags.writeable))
            return x * np.float32(2)
    """
    data = np.arange(1000 * 4, dtype=np.float32).reshape(1000, 4)
    data[3, 1] = np.nan
    final = run(cell, rows_of({"x": data}, {"x": "tensor<float32>"}, {"x": "ndarray"}))
    assert final["event"] == "result" and calls() == [((1000, 4), "float32", True)]
    assert final["summary"]["type"] == "ndarray" and final["summary"]["shape"] == [1000, 4]
    out = dataplane.decode_results(final["table"], "ndarray")
    assert out.shape == (1000, 4) and out.tobytes() == (data * np.float32(2)).tobytes()
    assert dataplane.decode_results(final["table"])[3].tobytes() == (data[3] * 2).tobytes()  # per-row view too


def test_ndarray_rows_of_different_shapes_fail_in_validation():
    cell = """
        import numpy as np
        from numpy.typing import NDArray
        def f(x: NDArray[np.float64]) -> list[float]:
            return [0.0] * len(x)
    """
    table = dataplane.encode_rows([{"x": np.zeros(2)}, {"x": np.zeros(3)}], {"x": "tensor<float64>"})
    final = run(cell, table)
    assert final["event"] == "failed" and final["phase"] == "validation"
    assert "different shapes" in final["message"]


def test_a_fixed_size_list_column_is_an_ndarray_batch():
    cell = """
        import numpy as np
        from numpy.typing import NDArray
        def f(x: NDArray[np.float32]) -> list[float]:
            return x.sum(axis=1).tolist()
    """
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 3)
    table = pa.table(
        [vectors], schema=pa.schema([pa.field("x", vectors.type, metadata={b"lancefn.type": b"tensor<float32>"})])
    )
    final = run(cell, table)
    assert final["results"] == [3.0, 12.0, 21.0, 30.0]


def test_arrow_form_gets_the_column_as_it_is():
    cell = """
        import pyarrow as pa
        import pyarrow.compute as pc
        CALLS = []
        def f(s: pa.Array) -> pa.Array:
            CALLS.append(str(s.type))
            return pc.utf8_upper(s)
    """
    final = run(cell, rows_of({"s": pa.array(["ab", None, "cd"])}, {"s": "arrow.value"}, {"s": "arrow"}))
    assert calls() == ["string"]
    field = final["table"].schema.field(0)
    assert field.metadata[b"lancefn.type"] == b"arrow.value"
    assert dataplane.decode_results(final["table"], "arrow").to_pylist() == ["AB", None, "CD"]


def test_record_batch_form_gets_the_columns_by_their_names():
    cell = """
        import pyarrow as pa
        CALLS = []
        def f(batch: pa.RecordBatch) -> list[float]:
            CALLS.append(batch.schema.names)
            return [a * b for a, b in zip(batch.column("a").to_pylist(), batch.column("b").to_pylist())]
    """
    table = rows_of(
        {"batch": pa.table({"a": [1.0, 2.0], "b": [3.0, 4.0]})},
        {"batch": "arrow.record_batch"},
        {"batch": "record_batch"},
    )
    final = run(cell, table)
    assert final["results"] == [3.0, 8.0] and calls() == [["a", "b"]]


@pytest.mark.parametrize(
    "body, message",
    [
        ("return x[:-1]", "the result: expected 1000 values (one per row), got 999"),
        ("return float(x.sum())", "the result: expected an ndarray with one row per input on axis 0, got float"),
    ],
)
def test_a_result_of_the_wrong_length_or_kind_fails_in_phase_result(body, message):
    cell = f"""
        import numpy as np
        from numpy.typing import NDArray
        def f(x: NDArray[np.float64]) -> NDArray[np.float64]:
            {body}
    """
    final = run(cell, rows_of({"x": np.zeros((1000, 2))}, {"x": "tensor<float64>"}, {"x": "ndarray"}))
    assert final["event"] == "failed" and final["phase"] == "result" and final["message"] == message


def _errors(table) -> dict[int, dict]:
    return {i: json.loads(e) for i, e in enumerate(table.column("error").to_pylist()) if e is not None}


def test_skip_per_row_nulls_exactly_the_failing_row():
    cell = """
        def f(x: float) -> float:
            if x == 417:
                raise ValueError(f"no {x}")
            return x + 0.5
    """
    rows = [{"x": float(i)} for i in range(1000)]
    final = run(cell, rows=rows, batched=False, on_error="skip")
    assert final["event"] == "result" and final["summary"]["rows_skipped"] == 1
    values = dataplane.decode_results(final["table"])
    assert values[417] is None and [v for i, v in enumerate(values) if i != 417] == [
        i + 0.5 for i in range(1000) if i != 417
    ]
    (error,) = _errors(final["table"]).items()
    assert error[0] == 417 and error[1]["message"] == "ValueError: no 417.0"
    assert "raise ValueError" in error[1]["traceback"]
    assert run(cell, rows=rows, batched=False)["phase"] == "run"  # on_error="fail" (the default): the job fails


@pytest.mark.parametrize("form", ["ndarray", "list"])
def test_skip_batched_bisects_to_the_failing_row(form):
    annotation = "NDArray[np.float64]" if form == "ndarray" else "list[float]"
    cell = f"""
        import numpy as np
        from numpy.typing import NDArray
        CALLS = []
        def f(x: {annotation}) -> {annotation}:
            CALLS.append(len(x))
            if 613.0 in list(x):
                raise RuntimeError("bad row 613")
            return np.asarray(x) * 2.0 if {form == "ndarray"} else [v * 2.0 for v in x]
    """
    data = np.arange(1000, dtype=np.float64)
    table = rows_of(
        {"x": data if form == "ndarray" else data.tolist()},
        {"x": "float64" if form == "list" else "tensor<float64>"},
        {"x": form},
    )
    final = run(cell, table, on_error="skip")
    assert final["event"] == "result" and final["summary"]["rows_skipped"] == 1
    values = dataplane.decode_results(final["table"])
    assert values[613] is None
    good = [float(np.asarray(v).reshape(())) if form == "ndarray" else v for i, v in enumerate(values) if i != 613]
    assert good == [i * 2.0 for i in range(1000) if i != 613]
    assert (
        list(_errors(final["table"])) == [613]
        and _errors(final["table"])[613]["message"] == "RuntimeError: bad row 613"
    )
    # The whole call, then each half down to the row: 1 + 2 per level of a 1000-row bisection (10 levels).
    recorded = calls()
    assert recorded[0] == 1000 and recorded.count(1) == 2 and len(recorded) == 1 + 2 * 10 and sum(recorded[1:3]) == 1000


def test_skip_still_fails_a_wrong_length():
    cell = """
        def f(x: list[float]) -> list[float]:
            if 5.0 in x:
                raise ValueError("bad")
            return x[1:]
    """
    final = run(cell, rows_of({"x": [float(i) for i in range(8)]}, {"x": "float64"}, {"x": "list"}), on_error="skip")
    assert final["event"] == "failed" and final["phase"] == "result"
    assert final["message"] == "the result: expected 4 values (one per row), got 3"
