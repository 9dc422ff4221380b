"""The data plane's batches (docs/ARCHITECTURE.md, "Batched functions"): an `(n, …)` ndarray to and from a
tensor column by its buffer, `arrow.value` columns, `arrow.record_batch` rows tables, and the task fields."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lancefn_jupyter.wire import dataplane

pytestmark = pytest.mark.unit


def where(i):
    return "parameter 'x'" + ("" if i is None else f" (row {i})")


def test_an_ndarray_batch_is_the_tensor_column_of_its_rows_and_back_without_copies():
    data = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    data[1, 0, 0], data[2, 1, 1] = np.nan, -0.0
    column = dataplane.batch_column(data, "tensor<float32>", "ndarray", coerce=False, where=where)
    finite = np.nan_to_num(data)  # the same column the per-row path builds, row by row (NaN != NaN in equals)
    assert dataplane.batch_column(finite, "tensor<float32>", "ndarray", coerce=False, where=where).equals(
        dataplane.encode_column(list(finite), "tensor<float32>", coerce=False, where=where)
    )
    back = dataplane.batch_value(column, "tensor<float32>", "ndarray")
    assert back.shape == (5, 3, 2) and back.tobytes() == data.tobytes()
    assert not back.flags.writeable  # a view of the Arrow buffer
    assert dataplane.batch_value(column, "tensor<float32>", "ndarray", writable=True).flags.writeable
    sliced = dataplane.batch_value(column.slice(2, 2), "tensor<float32>", "ndarray")
    assert sliced.tobytes() == data[2:4].tobytes()
    as_list = dataplane.batch_value(column, "tensor<float32>", "list")
    assert [row.tobytes() for row in as_list] == [row.tobytes() for row in data]


def test_ndarray_batches_refuse_what_does_not_stack_or_fit():
    ragged = dataplane.encode_column([np.zeros(2), np.zeros(3)], "tensor<float64>", coerce=False, where=where)
    with pytest.raises(dataplane.DataPlaneError, match="different shapes"):
        dataplane.batch_value(ragged, "tensor<float64>", "ndarray")
    with pytest.raises(dataplane.DataPlaneError, match="expected an ndarray of dtype float32"):
        dataplane.batch_column(np.zeros((2, 2)), "tensor<float32>", "ndarray", coerce=False, where=where)
    coerced = dataplane.batch_column([[1, 2], [3, 4]], "tensor<float32>", "ndarray", coerce=True, where=where)
    assert dataplane.batch_value(coerced, "tensor<float32>", "ndarray").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(dataplane.DataPlaneError, match="0-d"):
        dataplane.batch_column(np.float32(1), "tensor<float32>", "ndarray", coerce=True, where=where)


def test_a_vector_column_is_an_ndarray_batch():
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float32)), 2)
    got = dataplane.batch_value(vectors.slice(1, 3), "tensor<float64>", "ndarray")  # same-kind cast
    assert got.dtype == np.float64 and got.tolist() == [[2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def test_arrow_value_columns_and_record_batch_rows():
    strings = pa.array(["a", None, "c"])
    assert dataplane.batch_column(strings, "arrow.value", "arrow", coerce=False, where=where) is strings
    assert dataplane.encode_column([1, None, 3], "arrow.value", coerce=True, where=where).to_pylist() == [1, None, 3]
    assert dataplane.encode_column([pa.scalar(1.5)], "arrow.value", coerce=True, where=where).type == pa.float64()
    table = dataplane.batch_rows(
        {"batch": pa.table({"a": [1, 2], "b": ["x", "y"]})},
        {"batch": "arrow.record_batch"},
        {"batch": "record_batch"},
        name="f",
    )
    assert table.schema.names == ["a", "b"]
    assert {f.metadata[b"lancefn.type"] for f in table.schema} == {b"arrow.value"}
    with pytest.raises(dataplane.DataPlaneError, match=r"differ in length \(2, 3\)"):
        dataplane.batch_rows(
            {"x": [1.0, 2.0], "y": [1.0, 2.0, 3.0]},
            {"x": "float64", "y": "float64"},
            {"x": "list", "y": "list"},
            name="f",
        )


def test_results_with_an_error_column_and_in_their_form():
    data = np.ones((3, 2), np.float32)
    column = dataplane.batch_column(data, "tensor<float32>", "ndarray", coerce=False, where=where)
    table = dataplane.encode_results(None, "tensor<float32>", many=True, column=column, errors=[None, "{}", None])
    assert table.schema.names == ["result", "error"] and table.column("error").null_count == 2
    assert dataplane.decode_results(table, "ndarray").shape == (3, 2)
    nulls = pa.concat_arrays([column.slice(0, 1), pa.nulls(1, column.type)])
    table = dataplane.encode_results(None, "tensor<float32>", many=True, column=nulls)
    assert dataplane.decode_results(table, "ndarray")[1] is None  # a null row: the per-row list


def test_task_fields_add_the_forms_only_for_batched_signatures():
    per_row = {"inputs": [{"name": "x", "arrow_type": "float64"}], "output": {"arrow_type": "float64"}}
    assert dataplane.task_fields(per_row) == {"input_types": {"x": "float64"}, "output_type": "float64"}
    batched = {
        "inputs": [{"name": "x", "arrow_type": "tensor<float32>", "form": "ndarray"}],
        "output": {"arrow_type": "float64", "form": "list"},
        "batched": True,
    }
    assert dataplane.task_fields(batched)["batched"] == {"inputs": {"x": "ndarray"}, "output": "list"}
