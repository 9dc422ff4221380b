"""The function card names a class entry's form and the cell's statements the artifact leaves out, in text and
HTML (docs/ARCHITECTURE.md, "Function versions", "Warm state"); no control plane needed (register=no)."""

from __future__ import annotations

import math

import pytest
from helpers import run_cell

from lancefn_jupyter.kernel.handles.function import function_from_cell
from lancefn_jupyter.kernel.options import build_options

pytestmark = pytest.mark.unit

CELL = """\
import math
class Embedder:
    scale = 1.0
    def setup(self):
        self.scale = math.pi
    def __call__(self, text: str) -> float:
        return len(text) * self.scale
Embedder()("a very long trial call with a string that goes on and on and on and on")
"""


def handle(cell: str, **options):
    return function_from_cell(cell, run_cell(cell), build_options(register=False, **options), line_offset=1)


def test_card_text_and_html_name_the_class_and_the_left_out_call():
    embed = handle(CELL.replace("    def setup(self):\n        self.scale = math.pi\n", ""))
    text, markup = embed.card()
    assert "  entry       class Embedder\n" in text
    assert '  left out: line 7, Embedder()("a very long trial call with a string that goes…\n' in text
    assert "<code>class Embedder</code>" in markup
    assert "left out: line 7, Embedder()(&quot;a very long trial call" in markup


def test_card_says_where_setup_runs():
    assert "entry       class Embedder: setup once per worker" in handle(CELL).card()[0]
    assert "entry       class Embedder: setup once per job" in handle(CELL, state="per_job").card()[0]


def test_a_function_card_has_neither_line():
    text, markup = handle("def f(x: int) -> int:\n    return x\n").card()
    assert "entry" not in text and "left out" not in text and "left out" not in markup


def test_the_kernel_side_instance_is_made_and_set_up_once():
    cell = CELL.replace("        self.scale = math.pi\n", "        SETUPS.append(1)\n        self.scale = math.pi\n")
    cell = "SETUPS = []\n" + cell.replace("Embedder()(", "_ = (")
    namespace = run_cell(cell)
    embed = function_from_cell(cell, namespace, build_options(register=False))
    assert embed("ab") == pytest.approx(2 * math.pi) and embed(text="a") == pytest.approx(math.pi)
    assert namespace["SETUPS"] == [1]
