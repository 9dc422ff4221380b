"""Tests for lancefn_jupyter.packaging: cell / function -> artifact bytes, digest, signature.

Size: over 600 lines because it follows the packaging package's four modules (capture, cell, function,
signature) test by test; all of it is the fast unit tier.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from collections import OrderedDict
from typing import List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lancefn_jupyter.models import decode_artifact
from lancefn_jupyter.packaging import (
    PackagedFunction,
    PackagingError,
    infer_signature,
    package_cell,
    package_function,
)

HEADER = "from __future__ import annotations\n"


def normalize_score(value: float) -> float:
    return value / 100.0


LANCEDB_SNAPSHOT = (
    b"from __future__ import annotations\n\ndef normalize_score(value: float) -> float:\n    return value / 100.0\n"
)


def run_cell(cell: str, namespace: Optional[dict] = None) -> dict:
    """What the kernel does before packaging: execute the cell in the user namespace."""
    namespace = {} if namespace is None else namespace
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), namespace)
    return namespace


def pack(cell: str, namespace: Optional[dict] = None, **kwargs) -> PackagedFunction:
    cell = textwrap.dedent(cell)
    return package_cell(cell, run_cell(cell, namespace), **kwargs)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- LanceDB layout


def test_package_function_matches_lancedb_snapshot_bytes_and_digest():
    packaged = package_function(normalize_score)
    assert packaged.source == LANCEDB_SNAPSHOT
    assert packaged.digest == sha(LANCEDB_SNAPSHOT)
    assert packaged.entrypoint == "normalize_score"
    assert packaged.captured == ()
    assert packaged.signature.to_canonical_json() == (
        '{"inputs":[{"arrow_type":"float64","name":"value","nullable":false}],'
        '"output":{"arrow_type":"float64","kind":"scalar","nullable":false}}'
    )


def test_package_cell_of_the_same_one_line_cell_is_identical():
    cell = "def normalize_score(value: float) -> float: return value / 100.0"
    packaged = package_cell(cell, run_cell(cell))
    assert packaged.source == LANCEDB_SNAPSHOT
    assert packaged.digest == sha(LANCEDB_SNAPSHOT)
    assert packaged.digest == package_function(normalize_score).digest
    assert packaged.source_text == LANCEDB_SNAPSHOT.decode()


def test_artifact_request_carries_content_digest_and_adapter():
    packaged = package_function(normalize_score)
    request = packaged.artifact_request()
    wire = json.loads(request.to_canonical_json())
    assert wire == {
        "adapter": {"kind": "scalar_to_arrow_batch", "version": 1},
        "content": {"data": base64.b64encode(LANCEDB_SNAPSHOT).decode("ascii"), "encoding": "base64"},
        "digest": sha(LANCEDB_SNAPSHOT),
        "entrypoint": "normalize_score",
        "kind": "python_callable",
    }
    assert decode_artifact(request) == LANCEDB_SNAPSHOT


# ---------------------------------------------------------------- digest stability

BASE_CELL = """\
import math

LIMIT = 10

def _clip(x):
    return min(x, LIMIT)

def score(value: float, weight: int) -> float:
    total = _clip(value) * weight
    return math.sqrt(total)
"""


def test_identical_cell_gives_identical_digest():
    first = pack(BASE_CELL)
    second = pack(BASE_CELL)
    assert first.source == second.source
    assert first.digest == second.digest == sha(first.source)


def test_comments_and_whitespace_do_not_change_the_digest():
    reformatted = """\
# a comment at the top
import math


LIMIT = 10   # trailing comment

def _clip( x ):
    # explain
    return min( x,
                LIMIT )



def score(value: float, weight: int) -> float:
    total = (_clip(value)
             * weight)

    return math.sqrt(total)  # done
"""
    assert pack(reformatted).digest == pack(BASE_CELL).digest


def test_code_edit_gives_a_new_digest():
    edited = BASE_CELL.replace("* weight", "* weight + 1")
    assert pack(edited).digest != pack(BASE_CELL).digest
    assert pack(BASE_CELL.replace("LIMIT = 10", "LIMIT = 11")).digest != pack(BASE_CELL).digest


def test_captured_value_change_gives_a_new_digest():
    cell = "def f(x: int) -> int:\n    return x * FACTOR\n"
    assert pack(cell, {"FACTOR": 2}).digest != pack(cell, {"FACTOR": 3}).digest
    assert pack(cell, {"FACTOR": 2}).source_text.splitlines()[2] == "FACTOR = 2"


def test_bare_expression_statements_are_dropped_and_statements_kept():
    cell = """\
\"\"\"module docstring\"\"\"
import math
def double(x: float) -> float:
    return x * 2
double(3.0)
print("trial run")
_ = math.floor(1.5)
"""
    packaged = pack(cell, {"print": lambda *a: None})
    assert packaged.source_text == (
        HEADER + "\n" + "import math\n\ndef double(x: float) -> float:\n    return x * 2\n_ = math.floor(1.5)\n"
    )


def test_future_imports_of_the_cell_are_dropped():
    cell = "from __future__ import annotations\ndef f(x: int) -> int:\n    return x\n"
    packaged = pack(cell)
    assert packaged.source_text == HEADER + "\ndef f(x: int) -> int:\n    return x\n"


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


# ---------------------------------------------------------------- entry rules


TWO_PUBLIC = """\
def first(x: int) -> int:
    return x
def second(y: float) -> float:
    return y
"""


def test_entry_named_explicitly():
    packaged = pack(TWO_PUBLIC, entry="first")
    assert packaged.entrypoint == "first"
    assert [p.name for p in packaged.signature.inputs] == ["x"]


def test_entry_name_that_is_not_a_def_falls_back_to_the_rules():
    assert pack(TWO_PUBLIC, entry="scores.v2").entrypoint == "second"


def test_entry_is_the_only_public_def():
    cell = """\
def run(x: int) -> int:
    return _a(x) + _b(x)
def _a(x):
    return x
def _b(x):
    return x
"""
    assert pack(cell).entrypoint == "run"


def test_entry_is_the_last_def_when_several_are_public():
    assert pack(TWO_PUBLIC).entrypoint == "second"
    only_private = "def _a(x: int) -> int:\n    return x\ndef _b(x: int) -> int:\n    return x\n"
    assert pack(only_private).entrypoint == "_b"


def test_cell_without_def_is_refused():
    with pytest.raises(PackagingError, match="a %%gpu_function cell must define a function"):
        pack("x = 1\n")


def test_async_entry_is_refused():
    cell = "async def fetch(x: int) -> int:\n    return x\n"
    with pytest.raises(PackagingError, match="'fetch' \\(line 1\\) is `async def`"):
        pack(cell)


def test_entry_must_have_been_run():
    with pytest.raises(PackagingError, match="run the cell first"):
        package_cell("def f(x: int) -> int:\n    return x\n", {})


def test_stale_entry_in_the_namespace_is_refused():
    stale = run_cell("def f(y: int) -> int:\n    return y\n")
    with pytest.raises(PackagingError, match="does not match the cell's definition"):
        package_cell("def f(x: int) -> int:\n    return x\n", stale)


# ---------------------------------------------------------------- CUDA kernel cells

KERNEL_CELL = """\
import numpy as np
from numba import cuda

@cuda.jit
def _double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = _twice(x[i])

@cuda.jit(device=True)
def _twice(v):
    return 2 * v

def double_all(values: list[float]) -> list[float]:
    x = np.asarray(values, dtype=np.float32)
    out = np.zeros_like(x)
    _double.forall(x.size)(x, out)
    return out.tolist()

double_all([1.0, 2.0])
"""


def test_kernel_cell_keeps_kernels_and_helpers_as_is():
    # The kernel is not executed here: only the entry needs to exist in the namespace.
    namespace = run_cell("def double_all(values: list[float]) -> list[float]:\n    return values\n")
    packaged = package_cell(KERNEL_CELL, namespace)
    assert packaged.entrypoint == "double_all"
    assert packaged.captured == ()
    assert packaged.source_text == (
        "from __future__ import annotations\n"
        "\n"
        "import numpy as np\n"
        "from numba import cuda\n"
        "\n"
        "@cuda.jit\n"
        "def _double(x, out):\n"
        "    i = cuda.grid(1)\n"
        "    if i < x.size:\n"
        "        out[i] = _twice(x[i])\n"
        "\n"
        "@cuda.jit(device=True)\n"
        "def _twice(v):\n"
        "    return 2 * v\n"
        "\n"
        "def double_all(values: list[float]) -> list[float]:\n"
        "    x = np.asarray(values, dtype=np.float32)\n"
        "    out = np.zeros_like(x)\n"
        "    _double.forall(x.size)(x, out)\n"
        "    return out.tolist()\n"
    )
    assert packaged.signature.to_canonical_json() == (
        '{"inputs":[{"arrow_type":"list<float64>","name":"values","nullable":false}],'
        '"output":{"arrow_type":"list<float64>","kind":"scalar","nullable":false}}'
    )
    # decorator lines map back to the cell too
    lines = packaged.source_text.splitlines()
    assert packaged.line_map[lines.index("@cuda.jit") + 1] == 4
    assert packaged.line_map[lines.index("@cuda.jit(device=True)") + 1] == 10


# ---------------------------------------------------------------- line map


def test_line_map_points_back_to_cell_lines():
    cell = """\
# comment line 1
import math

THRESHOLD = 2  # line 4


def score(value: float) -> float:
    scaled = value * FACTOR
    if scaled > THRESHOLD:
        return math.sqrt(
            scaled
        )
    return scaled
"""
    packaged = pack(cell, {"FACTOR": 3})
    lines = packaged.source_text.splitlines()
    # header lines map to nothing
    assert lines[:4] == ["from __future__ import annotations", "", "FACTOR = 3", ""]
    assert all(n not in packaged.line_map for n in (1, 2, 3, 4))
    assert packaged.line_map[lines.index("import math") + 1] == 2
    assert packaged.line_map[lines.index("THRESHOLD = 2") + 1] == 4
    assert packaged.line_map[lines.index("def score(value: float) -> float:") + 1] == 7
    assert packaged.line_map[lines.index("    scaled = value * FACTOR") + 1] == 8
    assert packaged.line_map[lines.index("    if scaled > THRESHOLD:") + 1] == 9
    assert packaged.line_map[lines.index("        return math.sqrt(scaled)") + 1] == 10
    assert packaged.line_map[lines.index("    return scaled") + 1] == 13
    assert packaged.user_line(lines.index("    return scaled") + 1) == 13
    assert packaged.user_line(1) is None


def test_line_map_of_a_runtime_error_in_the_artifact():
    cell = "\n\n\n\n\n\ndef boom(x: int) -> int:\n    return x // 0\n"
    packaged = pack(cell)
    namespace: dict = {}
    exec(compile(packaged.source, "<artifact>", "exec"), namespace)
    with pytest.raises(ZeroDivisionError) as info:
        namespace["boom"](1)
    artifact_line = info.traceback[-1].lineno + 1
    assert packaged.line_map[artifact_line] == 8
    assert packaged.line_map[artifact_line - 1] == 7


# ---------------------------------------------------------------- executing the artifact


def test_executing_the_artifact_defines_a_working_entry():
    packaged = pack(BASE_CELL)
    namespace: dict = {}
    exec(compile(packaged.source, "<artifact>", "exec"), namespace)
    assert namespace[packaged.entrypoint](4.0, 4) == 4.0
    assert namespace["score"](20.0, 5) == math.sqrt(50)  # clipped to LIMIT

    captured = pack("def f(x: float) -> float:\n    return root(x) * K\n", {"root": math.sqrt, "K": 2.0})
    fresh: dict = {}
    exec(captured.source, fresh)
    assert fresh["f"](9.0) == 6.0


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
        (List[int], "list<int64>", False),
        (list[list[int]], "list<list<int64>>", False),
        (Optional[int], "int64", True),
        (int | None, "int64", True),
        (Optional[list[str]], "list<utf8>", True),
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

pytestmark = pytest.mark.unit


def _uses_importable(x: float) -> float:
    return sqrt(x) if infer_signature else x


# ---------------------------------------------------------------- real numba (simulator, subprocess)


def test_real_numba_kernel_cell_packages_and_runs_under_the_simulator(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        from lancefn_jupyter.packaging import package_cell, package_function
        cell = sys.argv[1]
        namespace = {"__name__": "__main__"}
        exec(compile(cell, sys.argv[2], "exec"), namespace)
        packaged = package_cell(cell, namespace)
        fresh = {}
        exec(compile(packaged.source, "<artifact>", "exec"), fresh)
        by_function = package_function(namespace["double_all"])
        fresh2 = {}
        exec(compile(by_function.source, "<artifact2>", "exec"), fresh2)
        print(json.dumps({
            "result": fresh["double_all"]([1.0, 2.5]),
            "result2": fresh2["double_all"]([3.0]),
            "captured": list(packaged.captured),
            "captured2": list(by_function.captured),
            "source2": by_function.source_text,
        }))
        """
    )
    cell_path = tmp_path / "cell.py"
    cell_path.write_text(KERNEL_CELL)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run(
        [sys.executable, "-c", script, KERNEL_CELL, str(cell_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == [2.0, 5.0]
    assert report["result2"] == [6.0]
    assert report["captured"] == []
    assert report["captured2"] == ["_double", "_twice", "cuda", "np"]
    assert report["source2"].startswith(
        "from __future__ import annotations\n\nimport numba.cuda as cuda\nimport numpy as np\n\n"
        "@cuda.jit(device=True)\ndef _twice(v):"
    )


# ---------------------------------------------------------------- property


_FORMATTING_BASE = [
    ("import math", 0),
    ("K = (1, 2)", 0),
    ("def helper(v):", 0),
    ("return v * K[0]", 1),
    ("def entry(x: float, n: int) -> float:", 0),
    ("total = helper(x) + n", 1),
    ("if total > 3:", 1),
    ("total = math.sqrt(total)", 2),
    ("return total", 1),
]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),  # blank lines before
            st.one_of(
                st.none(), st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20)
            ),
            st.integers(min_value=0, max_value=8),  # comment indentation
            st.integers(min_value=0, max_value=3),  # trailing spaces
            st.booleans(),  # trailing comment
        ),
        min_size=len(_FORMATTING_BASE),
        max_size=len(_FORMATTING_BASE),
    ),
    st.sampled_from([2, 4, 8]),
)
def test_formatting_changes_never_change_the_digest(edits, indent):
    reference = "\n".join("    " * level + text for text, level in _FORMATTING_BASE) + "\n"
    lines = []
    for (text, level), (blanks, comment, comment_indent, trailing, tail) in zip(_FORMATTING_BASE, edits, strict=False):
        lines.extend([" " * trailing] * blanks)
        if comment is not None:
            lines.append(" " * comment_indent + "#" + comment)
        line = " " * (indent * level) + text + " " * trailing
        if tail:
            line += "  # tail " + (comment or "")
        lines.append(line)
    formatted = "\n".join(lines) + "\n"
    assert pack(formatted).digest == pack(reference).digest
