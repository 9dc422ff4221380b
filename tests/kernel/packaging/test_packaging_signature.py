"""lancefn_jupyter.kernel.packaging.signature: Python annotations to Arrow types, and annotations that are
missing or unsupported refused with how to fix them."""

from __future__ import annotations

from typing import Optional

import pytest
from helpers import run_cell

from lancefn_jupyter.kernel.packaging import (
    PackagingError,
    infer_signature,
)

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- signature inference


def _annotated(annotation):
    def f(value):
        return value

    f.__annotations__ = {"value": annotation, "return": int}
    return f


@pytest.mark.parametrize(
    "annotation, arrow_type, nullable",
    [
        (int, "int64", False),
        (float, "float64", False),
        (str, "utf8", False),
        (bool, "bool", False),
        (bytes, "binary", False),
        (list[float], "list<float64>", False),
        (list[int], "list<int64>", False),
        (list[list[int]], "list<list<int64>>", False),
        (Optional[int], "int64", True),  # noqa: UP045 (the old spelling is what is tested)
        (int | None, "int64", True),
        (Optional[list[str]], "list<utf8>", True),  # noqa: UP045
        ("Optional[float]", "float64", True),
    ],
)
def test_signature_type_table(annotation, arrow_type, nullable):
    function = _annotated(annotation)
    signature = infer_signature(function)
    assert [(p.name, p.arrow_type, p.nullable) for p in signature.inputs] == [("value", arrow_type, nullable)]
    assert signature.output.to_wire() == {"kind": "scalar", "arrow_type": "int64", "nullable": False}


def test_signature_keeps_parameter_order_and_keyword_only_parameters():
    def f(b: str, a: int, *, c: list[bytes]) -> bool:
        return True

    signature = infer_signature(f)
    assert [(p.name, p.arrow_type) for p in signature.inputs] == [
        ("b", "utf8"),
        ("a", "int64"),
        ("c", "list<binary>"),
    ]


def test_missing_annotations_say_how_to_fix():
    def double_all(values):
        return values

    with pytest.raises(PackagingError) as info:
        infer_signature(double_all)
    assert str(info.value).startswith(
        "a GPU function needs type annotations to infer its signature: annotate parameter "
        "'values' of double_all, e.g. `values: float`, and its return type (e.g. `-> float`)."
    )

    def only_return(x: int):
        return x

    with pytest.raises(PackagingError, match="annotate the return type of only_return"):
        infer_signature(only_return)


@pytest.mark.parametrize(
    "source, needle",
    [
        ("def f(x: int) -> Optional[int]: return x", "return type of f is nullable"),
        ("def f(x: int) -> None: return None", "return type of f is unsupported"),
        ("def f(x: dict) -> int: return 1", "parameter 'x' of f has an unsupported type (dict)"),
        ("def f(x: list) -> int: return 1", "list without its element type"),
        ("def f(x: list[Optional[int]]) -> int: return 1", "nullable elements"),
        ("def f(x: int | str) -> int: return 1", "parameter 'x' of f has an unsupported type (the union"),
        ("def f(x: tuple[int, int]) -> int: return 1", "parameter 'x' of f has an unsupported type"),
        ("def f(*args: int) -> int: return 1", "parameter '*args' of f"),
        ("def f(**kw: int) -> int: return 1", "parameter '**kw' of f"),
        ("def f(x: int, /) -> int: return 1", "positional-only"),
        ("def f(x: float = float('nan')) -> int: return 1", "has a default that is not a literal (a non-finite float"),
        ("def f(x: int = Optional) -> int: return 1", "use `= None` and compute"),
    ],
)
def test_unsupported_signatures_are_refused(source, needle):
    namespace = run_cell(source, {"Optional": Optional})
    with pytest.raises(PackagingError) as info:
        infer_signature(namespace["f"])
    assert needle in str(info.value)
    if "unsupported" in needle:
        assert "supported types: int, float, str, bool, bytes, list[T]" in str(info.value)


def test_unresolvable_string_annotation_names_the_parameter():
    namespace = run_cell("def f(x: 'Nope') -> int:\n    return 1\n")
    with pytest.raises(PackagingError, match="annotation 'Nope' of parameter 'x' of f"):
        infer_signature(namespace["f"])
