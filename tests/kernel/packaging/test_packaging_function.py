"""lancefn_jupyter.kernel.packaging.function: ``package_function`` of a function from ``__main__`` (kernels,
helpers, decorators, recursion) or an importable module, and what it refuses."""

from __future__ import annotations

import sys
import types

import pytest
from helpers import HEADER, run_cell, sha

from lancefn_jupyter.packaging import (  # the public path: captured names keep it (see test below)
    PackagingError,
    infer_signature,
    package_function,
)

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- package_function


class _FakeKernel:
    """Looks like a numba CUDA dispatcher: a wrapper object with ``py_func``."""

    def __init__(self, fn, **options):
        self.py_func = fn
        self.options = options
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__

    def __call__(self, *args):
        return self.py_func(*args)


def _jit(fn=None, **options):
    if fn is None:
        return lambda f: _FakeKernel(f, **options)
    return _FakeKernel(fn)


FAKE_CUDA = types.ModuleType("lancefn_test_fakecuda")
FAKE_CUDA.jit = _jit


@pytest.fixture
def fake_cuda():
    sys.modules[FAKE_CUDA.__name__] = FAKE_CUDA
    yield FAKE_CUDA
    sys.modules.pop(FAKE_CUDA.__name__, None)


def load_main(tmp_path, source: str, **extra) -> dict:
    """Define functions the way a notebook does: in a `__main__` namespace, with source."""
    path = tmp_path / "notebook_cell.py"
    path.write_text(source)
    namespace = {"__name__": "__main__", **extra}
    exec(compile(source, str(path), "exec", dont_inherit=True), namespace)
    return namespace


NOTEBOOK_SOURCE = """\
import math
import lancefn_test_fakecuda as cuda

SCALE = 2.0

@cuda.jit
def _double(x, out):
    for i in range(len(x)):
        out[i] = _twice(x[i])

def _twice(v):
    return SCALE * v

@gpu_function(num_gpus=1)
def double_all(values: list[float]) -> list[float]:
    out = [0.0] * len(values)
    _double(values, out)
    return [math.fabs(v) for v in out]
"""


def test_package_function_includes_kernel_and_helpers_from_main(tmp_path, fake_cuda):
    namespace = load_main(tmp_path, NOTEBOOK_SOURCE, gpu_function=lambda **kw: lambda f: f)
    packaged = package_function(namespace["double_all"])
    assert packaged.source_text == (
        "from __future__ import annotations\n"
        "\n"
        "SCALE = 2.0\n"
        "import lancefn_test_fakecuda as cuda\n"
        "import math as math\n"
        "\n"
        "def _twice(v):\n"
        "    return SCALE * v\n"
        "\n"
        "@cuda.jit\n"
        "def _double(x, out):\n"
        "    for i in range(len(x)):\n"
        "        out[i] = _twice(x[i])\n"
        "\n"
        "def double_all(values: list[float]) -> list[float]:\n"
        "    out = [0.0] * len(values)\n"
        "    _double(values, out)\n"
        "    return [math.fabs(v) for v in out]\n"
    )
    assert packaged.captured == ("SCALE", "_double", "_twice", "cuda", "math")
    assert packaged.entrypoint == "double_all"
    assert packaged.digest == sha(packaged.source)
    # line map: artifact lines -> lines of the notebook source
    lines = packaged.source_text.splitlines()
    assert packaged.line_map[lines.index("def _twice(v):") + 1] == 11
    assert packaged.line_map[lines.index("@cuda.jit") + 1] == 6
    assert packaged.line_map[lines.index("    _double(values, out)") + 1] == 17
    # the artifact runs on its own
    fresh: dict = {}
    exec(compile(packaged.source, "<artifact>", "exec"), fresh)
    assert fresh["double_all"]([1.0, -2.5]) == [2.0, 5.0]
    assert isinstance(fresh["_double"], _FakeKernel)


def test_package_function_strips_only_gpu_function_decorators(tmp_path):
    fake = types.SimpleNamespace(gpu_function=lambda f=None, **kw: f if f else (lambda g: g))
    source = """\
@gpu_function
def a(x: int) -> int:
    return x

@lf.gpu_function(num_gpus=2)
def b(x: int) -> int:
    return x

@staticmethod
def c(x: int) -> int:
    return x
"""
    namespace = load_main(tmp_path, source, gpu_function=fake.gpu_function, lf=fake)
    assert package_function(namespace["a"]).source_text == HEADER + "\ndef a(x: int) -> int:\n    return x\n"
    assert package_function(namespace["b"]).source_text == HEADER + "\ndef b(x: int) -> int:\n    return x\n"
    with pytest.raises(PackagingError, match="the decorator @staticmethod on 'c' \\(line 9\\)"):
        package_function(namespace["c"].__func__)


def test_package_function_recursion_and_refusals(tmp_path):
    source = """\
def fact(n: int) -> int:
    return 1 if n <= 1 else n * fact(n - 1)

def uses_list(n: int) -> int:
    return n + len(DATA)

def uses_lambda(n: int) -> int:
    return SQUARE(n)

def outer():
    k = 2
    def inner(n: int) -> int:
        return n * k
    return inner

def uses_eval(n: int) -> int:
    return eval('n')
"""
    namespace = load_main(tmp_path, source, DATA=[1, object()], SQUARE=lambda v: v * v)
    fact = package_function(namespace["fact"])
    assert fact.source_text == HEADER + "\ndef fact(n: int) -> int:\n    return 1 if n <= 1 else n * fact(n - 1)\n"
    fresh: dict = {}
    exec(fact.source, fresh)
    assert fresh["fact"](5) == 120

    with pytest.raises(PackagingError) as info:
        package_function(namespace["uses_list"])
    assert "'DATA' (line 5)" in str(info.value) and "'DATA[1]' is an object" in str(info.value)
    assert "define it in the cell" in str(info.value)

    with pytest.raises(PackagingError, match="'SQUARE' \\(line 8\\).*a lambda.*define it in the cell"):
        package_function(namespace["uses_lambda"])

    with pytest.raises(PackagingError, match="'inner' is a closure over 'k'"):
        package_function(namespace["outer"]())

    with pytest.raises(PackagingError, match="eval\\(\\) \\(line 17\\) is dynamic namespace access"):
        package_function(namespace["uses_eval"])

    with pytest.raises(PackagingError, match="cannot package a lambda"):
        package_function(lambda x: x)

    async def coro(x: int) -> int:
        return x

    with pytest.raises(PackagingError, match="`async def`"):
        package_function(coro)


def test_package_function_needs_inspectable_source():
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError, match="the source of function 'f' is not available"):
        package_function(namespace["f"])


def test_package_function_refuses_an_aliased_helper(tmp_path):
    source = "def _impl(v):\n    return v\nalias = _impl\ndef f(x: int) -> int:\n    return alias(x)\n"
    namespace = load_main(tmp_path, source)
    with pytest.raises(PackagingError, match="'alias' \\(line 5\\) is another name for helper function '_impl'"):
        package_function(namespace["f"])


def test_package_function_refuses_a_kernel_as_entry(tmp_path, fake_cuda):
    namespace = load_main(tmp_path, "import lancefn_test_fakecuda as cuda\n@cuda.jit\ndef k(x):\n    pass\n")
    with pytest.raises(PackagingError, match="is a numba CUDA kernel"):
        package_function(namespace["k"])


def test_package_function_imports_importable_functions():
    packaged = package_function(_uses_importable)
    assert packaged.source_text.splitlines()[2:4] == [
        "from lancefn_jupyter.packaging import infer_signature as infer_signature",
        "from math import sqrt as sqrt",
    ]


from math import sqrt  # noqa: E402  (module-level, referenced below)


def _uses_importable(x: float) -> float:
    return sqrt(x) if infer_signature else x
