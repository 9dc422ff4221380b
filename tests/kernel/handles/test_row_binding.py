"""How a call's arguments become a job's row (``GpuFunction.item_row`` / ``submit``): as ``inspect.Signature.bind``
binds them, whether the quick path (every parameter plain and given by position) or ``bind`` does it."""

from __future__ import annotations

import inspect

import pytest

from lancefn_jupyter.kernel.handles.function import function_from_cell
from lancefn_jupyter.kernel.options import build_options

CELLS = {
    "plain": "def f(x: int, y: int) -> int:\n    return x + y\n",
    "default": "def f(x: int, y: int = 2) -> int:\n    return x + y\n",
    "keyword_only": "def f(x: int, *, y: int) -> int:\n    return x + y\n",
    "none": "def f() -> int:\n    return 1\n",
}
CALLS = [((1, 2), {}), ((1,), {"y": 2}), ((), {"x": 1, "y": 2}), ((1,), {}), ((), {}), ((1, 2, 3), {})]


def handle(kind: str):
    namespace: dict = {}
    exec(compile(CELLS[kind], "<cell>", "exec"), namespace)
    return function_from_cell(CELLS[kind], namespace, build_options(num_gpus=1, register=False)), namespace["f"]


@pytest.mark.parametrize("kind", sorted(CELLS))
@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_a_calls_row_is_what_signature_bind_makes_of_it(kind, args, kwargs):
    fn, python = handle(kind)
    try:
        expected = dict(inspect.signature(python).bind(*args, **kwargs).arguments)
    except TypeError as error:
        with pytest.raises(TypeError) as raised:
            fn._row(args, kwargs)
        assert str(raised.value) == f"f(): {error}"  # the function's name, then bind's own words
        return
    assert fn._row(args, kwargs) == expected
