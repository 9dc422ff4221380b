"""The pure splitter/stacker behind batches: chunks of a sequence, a numpy array (axis 0) and a
pyarrow Table, stacked back as the input's kind, and input that cannot be cut refused clearly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lancefn_jupyter.kernel.handles.chunking import auto_chunk_size, split, stack

pytestmark = pytest.mark.unit


def test_a_sequence_is_cut_in_order_with_row_ranges():
    parts = split(list(range(10)), 4)
    assert parts.kind == "list" and parts.chunks == ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9])
    assert parts.bounds == ((0, 4), (4, 8), (8, 10)) and parts.rows_total == 10
    assert split((x for x in "abc"), 3).chunks == (["a", "b", "c"],)  # any iterable
    assert stack("list", [[1, 2], np.array([3]), pa.array([4])]) == [1, 2, 3, 4]


def test_numpy_rows_are_axis_0_and_results_stack_as_an_array():
    data = np.arange(12.0).reshape(6, 2)
    parts = split(data, 4)
    assert parts.kind == "numpy" and [len(c) for c in parts.chunks] == [4, 2]
    assert parts.chunks[1][0].tolist() == [8.0, 9.0]
    out = stack("numpy", [[1.0, 2.0], np.array([3.0])])
    assert isinstance(out, np.ndarray) and out.tolist() == [1.0, 2.0, 3.0]


def test_a_table_is_cut_into_rows_and_results_come_back_as_a_table():
    table = pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    parts = split(table, 2)
    assert parts.kind == "arrow" and parts.chunks[0] == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    out = stack("arrow", [[10, 20], pa.table({"result": [30]})])
    assert isinstance(out, pa.Table) and out.column("result").to_pylist() == [10, 20, 30]


def test_auto_chunk_size_gives_about_four_chunks_per_slot():
    assert auto_chunk_size(64, 8) == 2 and auto_chunk_size(3, 8) == 1
    assert len(split(list(range(64)), None, slots=8).chunks) == 32


@pytest.mark.parametrize(
    ("items", "chunk_size", "error", "needle"),
    [
        ([], None, ValueError, "at least one item"),
        ([1, 2], 3, ValueError, "chunk_size=3 is larger than the input (2 rows)"),
        ([1, 2], 0, ValueError, "whole number of rows ≥ 1"),
        ([1, 2], 1.5, ValueError, "whole number of rows ≥ 1"),
        ("text", None, TypeError, "not str"),
        (5, None, TypeError, "not int"),
        (np.float64(1.0), None, TypeError, "not float64"),
    ],
)
def test_input_that_cannot_be_cut_is_refused_saying_how_to_fix_it(items, chunk_size, error, needle):
    with pytest.raises(error) as raised:
        split(items, chunk_size)
    assert needle in str(raised.value)
