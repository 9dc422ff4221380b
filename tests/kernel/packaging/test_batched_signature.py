"""Batched signatures (docs/ARCHITECTURE.md, "Batched functions"): every batched form's per-row Arrow type
and `form`, every refusal listing the supported forms, and per-row signatures left as they were."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from numpy.typing import NDArray

from lancefn_jupyter.kernel.options import OptionsError, build_options, build_profile, parse_function_line
from lancefn_jupyter.kernel.packaging import PackagingError, infer_signature, package_cell

pytestmark = pytest.mark.unit


def _fn(*params, returns):
    """A function of ``len(params)`` parameters with these annotations (a real ``def``, so no *args)."""
    names = [f"p{i}" for i in range(len(params))]
    code = f"def f({', '.join(names)}):\n    return None\n"
    scope: dict = {}
    exec(code, scope)
    f = scope["f"]
    f.__annotations__ = {**dict(zip(names, params, strict=True)), "return": returns}
    return f


@pytest.mark.parametrize(
    "annotation, arrow_type, form",
    [
        (list[float], "float64", "list"),
        (list[str], "utf8", "list"),
        (list[list[float]], "list<float64>", "list"),
        (list[NDArray[np.float32]], "tensor<float32>", "list"),
        (NDArray[np.float32], "tensor<float32>", "ndarray"),
        (NDArray[np.int64], "tensor<int64>", "ndarray"),
        (np.ndarray, "tensor<any>", "ndarray"),
        (pa.Array, "arrow.value", "arrow"),
        (pa.ChunkedArray, "arrow.value", "arrow"),
    ],
)
def test_each_batched_form_records_the_per_row_type_and_its_form(annotation, arrow_type, form):
    signature = infer_signature(_fn(annotation, returns=annotation), batched=True)
    assert signature.batched is True
    (param,) = signature.inputs
    assert (param.arrow_type, param.form) == (arrow_type, form)
    assert (signature.output.arrow_type, signature.output.form) == (arrow_type, form)
    wire = signature.to_wire()
    assert wire["batched"] is True and wire["inputs"][0]["form"] == form and wire["output"]["form"] == form


def test_a_record_batch_parameter_and_mixed_forms():
    signature = infer_signature(_fn(pa.RecordBatch, returns=list[float]), batched=True)
    assert [(p.arrow_type, p.form) for p in signature.inputs] == [("arrow.record_batch", "record_batch")]
    assert (signature.output.arrow_type, signature.output.form) == ("float64", "list")
    mixed = infer_signature(_fn(NDArray[np.float32], list[str], returns=pa.Array), batched=True)
    assert [p.form for p in mixed.inputs] == ["ndarray", "list"]
    assert (mixed.output.arrow_type, mixed.output.form) == ("arrow.value", "arrow")


@pytest.mark.parametrize(
    "params, returns, where",
    [
        ((float,), list[float], "parameter 'p0'"),  # a scalar parameter
        ((list[float] | None,), list[float], "parameter 'p0'"),  # a nullable batch
        ((list,), list[float], "parameter 'p0'"),  # a list without its element type
        ((pa.Table,), list[float], "parameter 'p0'"),  # a Table: RecordBatch is the form
        ((list[float],), float, "the return type"),  # a scalar return
        ((list[float],), pa.RecordBatch, "the return type"),  # a RecordBatch return
        ((pa.RecordBatch, list[float]), list[float], "beside other parameters"),
        ((), list[float], "takes no parameters"),
    ],
)
def test_refusals_list_the_supported_forms(params, returns, where):
    with pytest.raises(PackagingError) as error:
        infer_signature(_fn(*params, returns=returns), batched=True)
    text = str(error.value)
    assert where in text
    assert "list[T]" in text and "NDArray[dtype]" in text and "pyarrow.Array" in text
    assert "pyarrow.RecordBatch as the only parameter" in text


def test_per_row_signatures_stay_byte_identical():
    fn = _fn(float, returns=float)
    signature = infer_signature(fn)
    assert signature.batched is False and signature.inputs[0].form is None
    assert signature.to_canonical_json() == (
        '{"inputs":[{"arrow_type":"float64","name":"p0","nullable":false}],'
        '"output":{"arrow_type":"float64","kind":"scalar","nullable":false}}'
    )
    assert infer_signature(fn, batched=False) == signature


def test_a_batched_cell_and_the_option_everywhere():
    cell = "import numpy as np\nfrom numpy.typing import NDArray\ndef f(x: NDArray[np.float32]) -> NDArray[np.float32]:\n    return x\n"
    namespace: dict = {}
    exec(cell, namespace)
    batched = package_cell(cell, namespace, batched=True)
    assert batched.signature.batched and batched.signature.inputs[0].form == "ndarray"
    assert package_cell(cell, namespace).signature.batched is False
    assert parse_function_line("batched=yes", {}).batched is True
    assert parse_function_line("batched=no", {}).batched is False
    assert build_options(batched=True).batched is True
    profile = build_profile("emb", batched=True)
    assert parse_function_line("profile=emb", {"emb": profile}).batched is True
    assert parse_function_line("profile=emb batched=no", {"emb": profile}).batched is False
    with pytest.raises(OptionsError, match="batched must be yes or no"):
        parse_function_line("batched=maybe", {})
    with pytest.raises(OptionsError, match="batched must be True or False"):
        build_options(batched="yes")
