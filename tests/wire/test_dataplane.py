"""The Arrow data plane's pure parts: annotation → signature type, and exact IPC round trips."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

from lancefn_jupyter.kernel.packaging import PackagingError, infer_signature
from lancefn_jupyter.wire import dataplane as dp

pytestmark = pytest.mark.unit

DTYPES = [np.dtype(name) for name in dp.DTYPES]


def roundtrip_results(values: list, sig_type: str) -> list:
    table = dp.encode_results(values, sig_type, many=len(values) > 1)
    return dp.decode_results(dp.read_ipc(dp.to_ipc_bytes(table)))


def assert_same_array(got: Any, want: np.ndarray) -> None:
    """Exact: type, dtype, shape and every bit (NaN payloads, -0.0 included)."""
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


# ------------------------------------------------------------------------------ annotations


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (NDArray[np.float32], "tensor<float32>"),
        (NDArray[np.bool_], "tensor<bool>"),
        (NDArray[np.uint8], "tensor<uint8>"),
        (NDArray[np.float16], "tensor<float16>"),
        (np.ndarray, "tensor<any>"),
        (NDArray[Any], "tensor<any>"),
        (pa.Array, "arrow.array"),
        (pa.Table, "arrow.table"),
    ],
)
def test_annotation_maps_to_signature_type(annotation, expected):
    assert dp.annotation_type(annotation) == expected


def test_signature_of_array_function_and_plain_types_unchanged():
    def f(x: NDArray[np.float32], k: float, t: pa.Table | None) -> NDArray[np.float32]: ...

    signature = infer_signature(f)
    assert [(p.name, p.arrow_type, p.nullable) for p in signature.inputs] == [
        ("x", "tensor<float32>", False),
        ("k", "float64", False),
        ("t", "arrow.table", True),
    ]
    assert signature.output.arrow_type == "tensor<float32>"


def test_complex_and_abstract_dtypes_are_refused_saying_what_is_supported():
    def c(x: NDArray[np.complex64]) -> float: ...

    def g(x: NDArray[np.floating]) -> float: ...

    with pytest.raises(PackagingError) as info:
        infer_signature(c)
    assert "Arrow has no complex type" in str(info.value)
    assert "NDArray[dtype]" in str(info.value) and "pyarrow.Table" in str(info.value)
    with pytest.raises(PackagingError, match="does not name one dtype"):
        infer_signature(g)


def test_list_of_arrays_is_refused():
    def f(x: list[np.ndarray]) -> float: ...

    with pytest.raises(PackagingError, match="a list of"):
        infer_signature(f)


# ------------------------------------------------------------------------------ round trips


same_dtype_arrays = st.sampled_from(DTYPES).flatmap(
    lambda dtype: st.lists(
        hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)), min_size=1, max_size=4
    )
)


@settings(max_examples=150, deadline=None)
@given(same_dtype_arrays, st.booleans())
def test_arrays_round_trip_exactly(values, declared):
    sig_type = f"tensor<{values[0].dtype.name}>" if declared else "tensor<any>"
    for got, want in zip(roundtrip_results(values, sig_type), values, strict=False):
        assert_same_array(got, want)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=6),
        elements=st.floats(allow_nan=True, allow_infinity=True),
    )
)
def test_non_contiguous_and_fortran_inputs_round_trip_as_their_values(value):
    for view in (value[::2], np.asfortranarray(value), value.T, value[..., ::-1]):
        table = dp.encode_rows([{"x": view}], {"x": "tensor<float64>"})
        (row,) = dp.decode_rows(dp.read_ipc(dp.to_ipc_bytes(table)))
        assert_same_array(row["x"], np.ascontiguousarray(view))


def test_special_floats_survive_in_arrays_and_plain_floats():
    special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf], dtype=np.float32)
    (got,) = roundtrip_results([special], "tensor<float32>")
    assert_same_array(got, special)
    plain = roundtrip_results([float("nan"), -0.0, float("inf"), float("-inf")], "float64")
    assert np.isnan(plain[0]) and str(plain[1]) == "-0.0" and plain[2:] == [float("inf"), float("-inf")]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=8),
    st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=8, max_size=8),
)
def test_tables_with_nulls_round_trip(ints, texts):
    table = pa.table({"i": pa.array(ints, pa.int64()), "s": pa.array(texts[: len(ints)], pa.utf8())})
    (got,) = roundtrip_results([table], "arrow.table")
    assert got.equals(table) and got.schema == table.schema


def test_arrow_arrays_round_trip_with_nulls_and_rows_share_one_type():
    first, second = pa.array([1.5, None, float("nan")]), pa.array([2.5])
    got = roundtrip_results([first, second], "arrow.array")
    assert got[0].type == pa.float64() and got[0].to_pylist()[:2] == [1.5, None] and np.isnan(got[0][2].as_py())
    assert got[1].equals(second)
    with pytest.raises(dp.DataPlaneError, match="differs in type"):
        dp.encode_results([first, pa.array([1])], "arrow.array", many=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(st.floats(allow_nan=False), max_size=3), max_size=3), min_size=1, max_size=3))
def test_nested_lists_round_trip_as_today(values):
    assert roundtrip_results(values, "list<list<float64>>") == values


def test_rows_encode_every_parameter_and_coerce_array_likes():
    rows = [{"x": [1, 2, 3], "k": 2.0, "t": None}, {"x": np.ones((2, 2)), "k": float("nan"), "t": pa.table({"a": [1]})}]
    table = dp.encode_rows(rows, {"x": "tensor<float32>", "k": "float64", "t": "arrow.table"})
    got = dp.decode_rows(dp.read_ipc(dp.to_ipc_bytes(table)))
    assert_same_array(got[0]["x"], np.array([1, 2, 3], np.float32))
    assert_same_array(got[1]["x"], np.ones((2, 2), np.float32))
    assert got[0]["t"] is None and got[1]["t"].equals(pa.table({"a": [1]}))
    assert np.isnan(got[1]["k"])


def test_json_rows_for_array_parameters_become_arrays():
    (row,) = dp.rows_from_json([{"x": [[1, 2], [3, 4]], "k": 1}], {"x": "tensor<int8>", "k": "int64"})
    assert_same_array(row["x"], np.array([[1, 2], [3, 4]], np.int8))
    assert row["k"] == 1


# ------------------------------------------------------------------------------ result checks


@pytest.mark.parametrize(
    ("value", "sig_type", "message"),
    [
        (
            np.zeros(3),
            "tensor<float32>",
            "expected an ndarray of dtype float32, got ndarray of dtype float64 and shape (3,)",
        ),
        ([1.0, 2.0], "tensor<float32>", "expected an ndarray of dtype float32, got list"),
        (np.zeros(2, np.complex64), "tensor<any>", "complex64"),
        (pa.array([1]), "arrow.table", "expected a pyarrow.Table, got pyarrow.Array of type int64"),
        ("text", "float64", "expected float64, got str"),
    ],
)
def test_a_result_that_does_not_match_names_expected_and_actual(value, sig_type, message):
    with pytest.raises(dp.DataPlaneError) as info:
        dp.encode_results([value], sig_type, many=False)
    assert message in str(info.value) and str(info.value).startswith("the result")


def test_a_wrong_row_is_named_in_a_map():
    with pytest.raises(dp.DataPlaneError, match=r"the result of row 1: expected an ndarray of dtype int32"):
        dp.encode_results([np.zeros(1, np.int32), np.zeros(1, np.int64)], "tensor<int32>", many=True)


def test_summary_never_holds_the_data():
    value = np.zeros((1000, 768), np.float32)
    assert dp.summarize_results([value], 123) == {
        "type": "ndarray",
        "dtype": "float32",
        "shape": [1000, 768],
        "nbytes": value.nbytes,
    }
    assert dp.summarize_results([value, value], 99) == {
        "type": "list",
        "shape": [2],
        "nbytes": 99,
        "items_nbytes": 2 * value.nbytes,
        "item": {"type": "ndarray", "dtype": "float32", "shape": [1000, 768]},
    }


def test_a_maps_summary_is_true_of_every_row_and_counts_all_their_bytes():
    """Rows shaped (1,) and (2,): not "(1,), 4 B" (the first row's) but varying shapes and 12 B in all, through
    what the control plane keeps of a worker's summary."""
    from lancefn_jupyter.kernel.display import cards as display
    from lancefn_jupyter.server.control.results import result_summary
    from lancefn_jupyter.wire.models import Job

    summary = result_summary(dp.summarize_results([np.zeros(1, np.float32), np.zeros(2, np.float32)], 500))
    assert summary["item"] == {"type": "ndarray", "dtype": "float32", "shape_varies": True}
    base = dict(job_id="a", job_type="run_function", job_state="DONE", creation_ms=1, placement={}, progress={})
    job = Job.from_wire({**base, "result_format": "arrow", "result_summary": summary})
    assert display.result_text(job) == "list of 2 × ndarray float32 of varying shapes, 12 B in all"
    mixed = dp.summarize_results([np.zeros(1, np.float32), np.zeros(1, np.int8)], 500)
    assert mixed["item"] == {"type": "ndarray", "shape": [1]} and mixed["items_nbytes"] == 5


def test_ipc_file_is_written_atomically(tmp_path):
    path = tmp_path / "results" / "job.arrow"
    table = dp.encode_results([np.arange(10)], "tensor<int64>", many=False)
    size = dp.write_ipc_file(path, table)
    assert size == path.stat().st_size
    assert [p.name for p in path.parent.iterdir()] == ["job.arrow"]  # no temp file left
    assert_same_array(dp.decode_results(dp.read_ipc(path))[0], np.arange(10))


def test_pyarrow_stays_unloaded_by_load_ext_and_the_api():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "InteractiveShell.instance().run_line_magic('load_ext', 'lancefn_jupyter')\n"
        "import lancefn_jupyter.kernel.api, lancefn_jupyter.kernel.packaging, lancefn_jupyter.wire.dataplane\n"
        "print(sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pyarrow" not in out, out


def test_a_parameter_only_some_rows_give_is_filled_from_its_default_and_absent_columns_are_left_out():
    rows = [{"x": [1.0], "k": 3}, {"x": [2.0]}]
    table = dp.encode_rows(rows, {"x": "tensor<float32>", "k": "int64"}, defaults={"k": 7})
    assert [r["k"] for r in dp.decode_rows(table)] == [3, 7]
    table = dp.encode_rows([{"x": [1.0]}], {"x": "tensor<float32>", "k": "int64"})
    assert table.column_names == ["x"]
    with pytest.raises(dp.DataPlaneError, match="parameter 'k' of the function \\(row 1\\) is missing"):
        dp.encode_rows(rows, {"x": "tensor<float32>", "k": "int64"})


def test_result_text_summarises_without_the_data():
    from lancefn_jupyter.kernel.display import cards as display
    from lancefn_jupyter.wire.models import Job

    base = dict(job_id="a", job_type="run_function", job_state="DONE", creation_ms=1, placement={}, progress={})
    summary = {"type": "ndarray", "dtype": "float32", "shape": [1000, 768], "nbytes": 3072000}
    arrow = Job.from_wire({**base, "result_format": "arrow", "result_summary": summary})
    assert display.result_text(arrow) == "ndarray float32 (1000, 768), 2.9 MiB"
    assert display.job_summary(arrow).endswith("→ ndarray float32 (1000, 768), 2.9 MiB")
    assert display.result_text(Job.from_wire({**base, "result": [[1.0] * 100_000]})) == "list of 100000"
    assert display.result_text(Job.from_wire({**base, "result": [3.5]})) == "3.5"
    from lancefn_jupyter.kernel.display.jobs import jobs_table

    assert "ndarray float32" in jobs_table([arrow])[0]
    nan = dp.summarize_results([np.array([np.nan, 1.0, -np.inf])], 24)
    assert nan["nonfinite"] == {"nan": 1, "inf": 0, "-inf": 1, "floats": 3}
    nan_job = Job.from_wire({**base, "result_format": "arrow", "result_summary": nan})
    assert display.result_text(nan_job).endswith("; holds 1 NaN, 1 -Inf of 3 floats")
    assert "nonfinite" not in dp.summarize(np.ones(3))


STRUCT_XW = (
    '{"fields":[{"name":"x","nullable":false,"type":{"type":"float64"}},'
    '{"name":"w","nullable":true,"type":{"fields":[{"name":"item","nullable":false,"type":{"type":"int8"}}],'
    '"type":"list"}}],"type":"struct"}'
)


def test_lancedb_040_types_are_read():
    """LanceDB 0.40's grammar and canonical JSON (its ``_canonical_arrow_type``) as pyarrow types."""
    item = pa.field("item", pa.int8(), nullable=False)
    assert dp.arrow_type(STRUCT_XW) == pa.struct(
        [pa.field("x", pa.float64(), nullable=False), pa.field("w", pa.list_(item))]
    )
    assert dp.arrow_type("large_list<int8>") == pa.large_list(item)
    assert dp.arrow_type("fixed_size_list<int8, 3>") == pa.list_(item, 3)
    assert dp.arrow_type("large_utf8") == pa.large_utf8() and dp.arrow_type("date32") == pa.date32()
    with pytest.raises(ValueError, match="is not an Arrow type this server reads"):
        dp.arrow_type('{"type": "map"}')
    assert dp.struct_fields(STRUCT_XW) == ["x", "w"]
    assert dp.struct_fields("float64") is None and dp.struct_fields('{"type":"list","fields":[]}') is None


def test_struct_column_packs_columns_by_name_and_names_what_does_not_fit():
    packed = dp.struct_column({"w": pa.array([[1], None]), "x": pa.array([1, 2])}, STRUCT_XW, "the batch")
    assert packed.type == dp.arrow_type(STRUCT_XW) and packed.to_pylist() == [
        {"x": 1.0, "w": [1]},
        {"x": 2.0, "w": None},
    ]
    with pytest.raises(dp.DataPlaneError, match="the batch has no column 'w'; its RecordBatch has the columns"):
        dp.struct_column({"x": pa.array([1.0])}, STRUCT_XW, "the batch")
    with pytest.raises(dp.DataPlaneError, match="the batch: column 'x' does not cast to double"):
        dp.struct_column({"x": pa.array(["a"]), "w": pa.array([[1]])}, STRUCT_XW, "the batch")
