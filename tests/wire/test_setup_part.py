"""The setup part of a version's source (docs/ARCHITECTURE.md, "Setup reuse"): what counts as setup, what is
rebound, and that only a change to the setup part changes its digest."""

from __future__ import annotations

import textwrap

import pytest

from lancefn_jupyter.wire.setup_part import setup_part

pytestmark = pytest.mark.unit

MODEL = """
import math
SCALE = 3

def load(path):
    return {"w": SCALE, "path": path}

def post(y):
    return round(y, 2)

class Model:
    kind = "linear"

    def setup(self):
        self.m = load("weights")
        self.prepare()

    def prepare(self):
        self.ready = True

    def __call__(self, x: float) -> float:
        return post(self.m["w"] * x)

    def describe(self):
        return "model"
"""


def part(source: str, entry: str = "Model"):
    found = setup_part(textwrap.dedent(source), entry)
    assert found is not None
    return found


def test_setup_covers_module_statements_setup_and_what_they_call_and_leaves_the_rest_to_rebind():
    found = part(MODEL)
    assert found.entry_class
    assert found.setup == ("load", "Model.prepare", "Model.setup")
    assert found.functions == ("post",)
    assert found.methods == ("__call__", "describe")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('return post(self.m["w"] * x)', 'return post(self.m["w"] * x + 1)'),  # __call__
        ("return round(y, 2)", "return round(y, 3)"),  # a function only __call__ calls
        ('return "model"', 'return "a model"'),  # another method
        ("    def describe(self):", "    def other(self):\n        return 1\n\n    def describe(self):"),  # added
    ],
)
def test_edits_outside_the_setup_part_keep_the_digest(old, new):
    assert old in MODEL
    assert part(MODEL.replace(old, new)).digest == part(MODEL).digest


def test_moving_code_down_keeps_the_digest():
    assert part("\n\n\n" + MODEL).digest == part(MODEL).digest


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("import math", "import cmath"),  # an import
        ("SCALE = 3", "SCALE = 4"),  # a module-level value (a captured literal's header line alike)
        ('"path": path', '"path": path.upper()'),  # a function setup calls
        ("self.ready = True", "self.ready = 1"),  # a method setup calls through self
        ('self.m = load("weights")', 'self.m = load("other")'),  # setup itself
        ('kind = "linear"', 'kind = "cubic"'),  # a class-level statement
        ("class Model:", "class Model(object):"),  # the class header
    ],
)
def test_edits_of_the_setup_part_change_the_digest(old, new):
    assert old in MODEL
    assert part(MODEL.replace(old, new)).digest != part(MODEL).digest


def test_a_function_entry_keeps_a_module_level_model_as_setup():
    source = (
        "MODEL = {'w': 2}\n\ndef helper(x):\n    return x\n\ndef f(x: int) -> int:\n    return helper(x) * MODEL['w']\n"
    )
    found = part(source, "f")
    assert not found.entry_class and found.setup == () and found.functions == ("f", "helper")
    assert part(source.replace("* MODEL", "+ MODEL"), "f").digest == found.digest
    assert part(source.replace("'w': 2", "'w': 3"), "f").digest != found.digest


def test_a_function_named_by_a_module_statement_is_setup():
    found = part("def f(x):\n    return x\n\nHANDLERS = [f]\n", "f")
    assert found.setup == ("f",) and found.functions == ()


def test_another_entry_name_changes_the_digest_and_bad_source_has_no_part():
    assert part(MODEL, "Model").digest != part(MODEL.replace("Model", "Net"), "Net").digest
    assert setup_part("def f(:\n", "f") is None
