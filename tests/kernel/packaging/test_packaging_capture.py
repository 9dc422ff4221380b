"""lancefn_jupyter.kernel.packaging.capture: which free names of a cell are captured (modules, functions,
classes, literals) and which notebook values and constructs are refused, naming the name or line."""

from __future__ import annotations

import json
import math
import sys
from collections import OrderedDict

import pytest
from helpers import HEADER, pack, run_cell

from lancefn_jupyter.kernel.packaging import (
    PackagingError,
    package_cell,
)

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- captures


def test_capture_lines_modules_functions_classes_literals_sorted():
    cell = """\
def entry(x: float) -> float:
    d = OD()
    d['a'] = (js.dumps(TAGS), root(x), flag, nothing, blob, ratio, big, name, single)
    return m.pi * x
"""
    namespace = {
        "js": json,
        "m": math,
        "root": math.sqrt,
        "OD": OrderedDict,
        "TAGS": ("a", (1, 2.5), None, b"z"),
        "flag": True,
        "nothing": None,
        "blob": b"\x00\xff",
        "ratio": 0.1,
        "big": 10**20,
        "name": "caf\u00e9 'x'",
        "single": (7,),
    }
    packaged = pack(cell, namespace)
    assert packaged.source_text.split("\n\n")[1].splitlines() == [
        "from collections import OrderedDict as OD",
        "TAGS = ('a', (1, 2.5), None, b'z')",
        "big = 100000000000000000000",
        "blob = b'\\x00\\xff'",
        "flag = True",
        "import json as js",
        "import math as m",
        "name = \"caf\u00e9 'x'\"",
        "nothing = None",
        "ratio = 0.1",
        "from math import sqrt as root",
        "single = (7,)",
    ]
    assert packaged.captured == (
        "OD",
        "TAGS",
        "big",
        "blob",
        "flag",
        "js",
        "m",
        "name",
        "nothing",
        "ratio",
        "root",
        "single",
    )
    # exactly one blank line between header, captures and code
    assert packaged.source_text.startswith(HEADER + "\nfrom collections import OrderedDict as OD\n")
    assert "single = (7,)\n\ndef entry(x: float) -> float:\n" in packaged.source_text


def test_builtins_and_cell_definitions_are_not_captured():
    cell = """\
import math
K = 3
def helper(v):
    return abs(v) + K
def entry(values: list[float]) -> float:
    return sum(helper(v) for v in values) + len(values) + math.pi
"""
    packaged = pack(cell)
    assert packaged.captured == ()
    assert packaged.source_text.startswith(HEADER + "\nimport math\nK = 3\n\ndef helper(v):")


def test_module_dunders_are_not_captured():
    cell = "def f(x: int) -> int:\n    return x\nif __name__ == '__main__':\n    y = f(1)\n"
    packaged = pack(cell, {"__name__": "__main__"})
    assert packaged.captured == ()
    assert packaged.source_text == HEADER + "\n" + cell


def test_namespace_value_shadows_builtin_like_the_interpreter():
    cell = "def f(x: int) -> int:\n    return max(x, 0)\n"
    packaged = pack(cell, {"max": math.fsum})
    assert packaged.source_text.splitlines()[2] == "from math import fsum as max"


def test_names_only_used_in_annotations_are_not_captured():
    cell = "def f(x: float) -> float:\n    y: Weird = x\n    return y\n"
    packaged = pack(cell, {"Weird": object()})
    assert packaged.captured == ()


# ---------------------------------------------------------------- refusals


class DataFrame:
    """Stands in for pandas.DataFrame without importing pandas."""


DataFrame.__module__ = "pandas.core.frame"


def closure_factory():
    offset = 3

    def add_offset(x):
        return x + offset

    return add_offset


@pytest.mark.parametrize(
    "value, description",
    [
        (DataFrame(), "a pandas.core.frame.DataFrame"),
        (lambda v: v, "a lambda"),
        ([1, object()], "'table[1]' is an object"),
        ({"a": {"b": DataFrame()}}, "'table['a']['b']' is a pandas.core.frame.DataFrame"),
        ({object()}, "'table{…}' is an object"),
        (closure_factory(), "a closure"),
        (float("nan"), "a non-finite float (nan)"),
        ((1, [2, float("inf")]), "'table[1][1]' is a non-finite float (inf)"),
        (object(), "an object"),
    ],
)
def test_unsupported_notebook_values_are_refused_naming_the_variable(value, description):
    cell = "def f(x: int) -> int:\n    return x + len(table)\n"
    with pytest.raises(PackagingError) as info:
        pack(cell, {"table": value})
    message = str(info.value)
    assert "'table' (line 2)" in message
    assert description in message
    assert "define it in the cell" in message


def test_function_from_another_cell_is_refused():
    other = run_cell("def helper(v):\n    return v * 2\n", {"__name__": "__main__"})
    cell = "def f(x: int) -> int:\n    return helper(x)\n"
    with pytest.raises(PackagingError) as info:
        pack(cell, {"helper": other["helper"]})
    assert "'helper'" in str(info.value)
    assert "a function defined in another cell" in str(info.value)
    assert "define it in the cell" in str(info.value)


def test_undefined_name_is_refused():
    cell = "def f(x: int) -> int:\n    return x + missing_thing\n"
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError) as info:
        package_cell(cell, namespace)
    assert str(info.value).startswith("name 'missing_thing' (line 2) is not defined")
    assert "define it in the cell" in str(info.value)


def test_shell_syntax_is_refused_naming_the_line():
    # `files = !ls` after transform_cell: needs IPython, which the worker does not have
    cell = "def f(x: int) -> int:\n    return x\nfiles = get_ipython().getoutput('ls')\n"
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError, match="shell and magic syntax .* \\(line 3\\) needs IPython.*subprocess.run"):
        package_cell(cell, namespace)


def test_ipython_only_names_are_still_refused():
    cell = "def f(x: int) -> int:\n    dreload(x)\n    return x\n"
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError, match="'dreload' \\(line 2\\) is provided by IPython"):
        package_cell(cell, namespace)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("    return eval('x')\n", "eval() (line 2) is dynamic namespace access"),
        ("    return globals()['x']\n", "globals() (line 2) is dynamic namespace access"),
        ("    return vars()['x']\n", "vars() (line 2)"),
        ("    import sys\n    return sys.maxsize\n", "'import sys' (line 2)"),
        ("    from importlib import import_module\n    return 1\n", "'import importlib' (line 2)"),
    ],
)
def test_dynamic_namespace_access_is_refused(body, needle):
    cell = "def f(x: int) -> int:\n" + body
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError) as info:
        package_cell(cell, namespace)
    assert needle in str(info.value)


def test_namespace_module_captured_from_the_notebook_is_refused():
    cell = "def f(x: int) -> int:\n    return x + sysmod.maxsize\n"
    with pytest.raises(PackagingError, match="'sysmod' \\(line 2\\) is the module 'sys'"):
        pack(cell, {"sysmod": sys})


def test_syntax_error_names_the_line():
    with pytest.raises(PackagingError, match="syntax error on line 2"):
        package_cell("def f(x: int) -> int:\n    return (\n", {})


def test_code_that_does_not_compile_as_a_module_is_refused():
    namespace = run_cell("def f(x: int) -> int:\n    return x\n")
    with pytest.raises(PackagingError, match="cannot be compiled as a module: nonlocal declaration"):
        package_cell("def f(x: int) -> int:\n    return x\nnonlocal x\n", namespace)
