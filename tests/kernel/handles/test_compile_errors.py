"""Compile errors on the user's lines (issue 17 §4): numba typing and lowering errors from kernels and
`@numba.jit` helpers, run through `.local()` (worker subprocess on the CUDA simulator) and remote jobs
(a real control plane whose default class is simulated), plus every reference form on its own."""

from __future__ import annotations

import pytest

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client import LancefnError
from lancefn_jupyter.kernel.handles import local_run as local
from lancefn_jupyter.kernel.handles.tracebacks import map_error_text, say_once

# numba's documented cpu_gpu_compat example (docs/source/cuda/cpu_gpu_compat), as a cell with an entry.
COMPAT = """\
from math import pi

import numba
import numpy as np
from numba import cuda


@numba.jit
def business_logic(x, y, z):
    return 4 * z * (2 * x - (4 * y) / 2 * pi)


@cuda.jit
def f(res, xarr, yarr, zarr):
    tid = cuda.grid(1)
    if tid < len(xarr):
        # The function decorated with numba.jit may be directly reused
        res[tid] = business_logic(xarr[tid], yarr[tid], zarr[tid])


def compat(x: float | None, y: float, z: float) -> float:
    res = np.zeros(1)
    f.forall(1)(res, np.array([x]), np.array([y]), np.array([z]))
    return float(res[0])
"""

LOWERING = """\
import numba
from numba.experimental import jitclass


@jitclass([("x", numba.float64)])
class Vec:
    def __init__(self, x):
        self.x = x


@numba.njit
def same(a, b):
    return a   is   b


def lowering(x: float) -> bool:
    v = Vec(x)
    return same(v, v)
"""


def cell_line(cell: str, text: str) -> int:
    """The notebook line of `text` in a %%gpu_function cell (the magic line is line 1)."""
    return next(i for i, line in enumerate(cell.splitlines(), start=1) if text in line) + 1


# ------------------------------------------------------------------------------------ every form


def test_every_reference_form_is_mapped():
    mapping = {9: 8, 12: 11, 20: 19}
    cell = [f"user line {n}" for n in range(1, 30)]
    cell[7] = "    return (4 * y) / 2"
    text = "\n".join(
        [
            "During: typing of intrinsic-call at <gpu_function c@abc> (9)",
            "",
            'File "<gpu_function c@abc>", line 9:',
            "def business_logic(x, y, z):",
            "    <source elided>",
            "    return 4 * y / 2",
            "    ^",
            "",
            'During: lowering "$x = a is b" at <gpu_function c@abc> (12)',
            "warning at <gpu_function c@abc>:20",
            '  File "<gpu_function c@abc>", line 9, in business_logic',
            "    return 4 * y / 2",
            "           ^^^^^^^^^",
            '  File "<gpu_function c@abc>", line 20',
            "    x = = 1",
            "        ^",
            "SyntaxError: invalid syntax",
            'File "<gpu_function c@abc>", line 99, in unmapped',
            "    kept as is",
        ]
    )
    mapped = map_error_text(text, mapping.get, cell, line_offset=1)
    assert "<gpu_function" not in mapped.replace('File "<gpu_function c@abc>", line 99', "")
    assert "at cell line 9" in mapped and "at cell line 12" in mapped and "warning at cell line 20" in mapped
    assert "cell line 9:\n    return (4 * y) / 2\n\nDuring: lowering" in mapped  # snippet replaced, blank kept
    assert "4 * y / 2" not in mapped and "<source elided>" not in mapped and "def business_logic" not in mapped
    assert (
        "cell line 9, in business_logic\n    return (4 * y) / 2\n  cell line 20\n    user line 19\nSyntaxError"
        in mapped
    )
    assert "^" not in mapped  # carets of a re-formatted line would point at the wrong columns
    assert "line 99, in unmapped\n    kept as is" in mapped


def test_caret_kept_when_the_line_reads_the_same():
    mapped = map_error_text(
        '  File "<gpu_function c@abc>", line 5, in f\n    return x[9]\n           ^^^^\nIndexError: x',
        {5: 2}.get,
        ["def f(x):", "    return x[9]"],
    )
    assert mapped == "  cell line 2, in f\n    return x[9]\n           ^^^^\nIndexError: x"


def test_message_said_once():
    long = "TypingError: Failed in nopython mode\nNo implementation of function"
    assert say_once(long, "Traceback ...\nnumba.core.errors." + long.split(": ", 1)[1]) == "TypingError (message below)"
    assert (
        say_once(long + " (row 2 of 3)", "x\n" + long.split(": ", 1)[1]) == "TypingError (row 2 of 3) (message below)"
    )
    assert say_once("ValueError: short", "ValueError: short") == "ValueError: short"  # one line: kept
    assert say_once(long, "unrelated traceback") == long


# ----------------------------------------------------------------------------- real numba errors


@pytest.fixture
def ip(ip, monkeypatch):
    """conftest's shell, with ``.local()`` running its worker on the simulator."""
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    local.gpu_available.cache_clear()
    yield ip
    local.gpu_available.cache_clear()


def _assert_on_user_lines(text: str, cell: str, typed: str, packaged: str, marker: str) -> None:
    line = cell_line(cell, typed)
    assert "<gpu_function" not in text, text
    assert f"at cell line {line}" in text and f"cell line {line}:\n    {typed.strip()}" in text, text
    assert packaged not in text, text  # numba's re-formatted snippet is gone
    assert text.count(marker) == 1, text  # the ~25-line message is said once


def test_typing_error_in_numba_jit_helper_called_from_kernel(ip):
    ip.run_cell_magic("gpu_function", "", COMPAT)
    compat = ip.user_ns["compat"]
    assert compat.local(1.0, 1.0, 2.0) == pytest.approx(4 * 2.0 * (2 * 1.0 - (4 * 1.0) / 2 * 3.141592653589793))
    with pytest.raises(LancefnError) as local_error:
        compat.local(None, 1.0, 2.0)
    text = str(local_error.value)
    assert "failed in phase run: TypingError (message below)" in text
    _assert_on_user_lines(
        text, COMPAT, "return 4 * z * (2 * x - (4 * y) / 2 * pi)", "4 * y / 2", "No implementation of function"
    )
    assert f"cell line {cell_line(COMPAT, 'res[tid] = business_logic')}, in f" in text  # the kernel's frame

    with pytest.raises(api.RemoteFunctionError) as remote_error:
        compat.remote(None, 1.0, 2.0)
    remote = str(remote_error.value)
    _assert_on_user_lines(
        remote, COMPAT, "return 4 * z * (2 * x - (4 * y) / 2 * pi)", "4 * y / 2", "No implementation of function"
    )
    assert "TypingError (message below)" in remote


def test_lowering_error_in_numba_njit_helper(ip):
    ip.run_cell_magic("gpu_function", "", LOWERING)
    with pytest.raises(LancefnError) as raised:
        ip.user_ns["lowering"].local(1.0)
    text = str(raised.value)
    assert "no default `is` implementation" in text
    line = cell_line(LOWERING, "return a   is   b")
    assert 'During: lowering "$' in text and f"at cell line {line}" in text and "<gpu_function" not in text
    with pytest.raises(api.RemoteFunctionError) as remote:
        ip.user_ns["lowering"].remote(1.0)
    assert f"at cell line {line}" in str(remote.value) and "<gpu_function" not in str(remote.value)
