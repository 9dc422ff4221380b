"""lancefn_jupyter.kernel.packaging.cell: which def of a cell is the entry, and CUDA kernel cells kept as
written (packaged, then run under the numba simulator in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import pack, run_cell

from lancefn_jupyter.kernel.packaging import (
    PackagingError,
    package_cell,
)

pytestmark = pytest.mark.unit


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


# ---------------------------------------------------------------- real numba (simulator, subprocess)


def test_real_numba_kernel_cell_packages_and_runs_under_the_simulator(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        from lancefn_jupyter.kernel.packaging import package_cell, package_function
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
