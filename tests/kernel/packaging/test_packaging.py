"""lancefn_jupyter.kernel.packaging, the artifact: LanceDB's byte layout, a digest that ignores formatting
but follows code and captured values, the line map back to the cell, and running the artifact.

The other packaging tests follow the package's modules: test_packaging_capture.py (free names, what
is refused), test_packaging_cell.py (entry rules, CUDA kernel cells), test_packaging_signature.py,
test_packaging_function.py (``package_function``).
"""

from __future__ import annotations

import base64
import json
import math

import pytest
from helpers import HEADER, pack, run_cell, sha
from hypothesis import given, settings
from hypothesis import strategies as st

from lancefn_jupyter.kernel.packaging import (
    package_cell,
    package_function,
)
from lancefn_jupyter.wire.models import decode_artifact


def normalize_score(value: float) -> float:
    return value / 100.0


LANCEDB_SNAPSHOT = (
    b"from __future__ import annotations\n\ndef normalize_score(value: float) -> float:\n    return value / 100.0\n"
)


pytestmark = pytest.mark.unit


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


def test_every_statement_is_kept_but_the_trailing_expression_and_trial_calls_of_the_entry():
    cell = """\
\"\"\"module docstring\"\"\"
import math
_STATE = {}
_STATE.update(mode="eval")
def double(x: float) -> float:
    return x * 2
double(3.0)
print("loading")
double.local(1.0)
_ = math.floor(1.5)
double.submit(2.0).result()
math.sqrt(4.0)
"""
    # Not run here: `double.local` needs the handle the magic binds.
    packaged = package_cell(cell, run_cell("def double(x: float) -> float:\n    return x * 2\n"))
    assert packaged.source_text == (
        HEADER + '\n"""module docstring"""\n' + "import math\n_STATE = {}\n_STATE.update(mode='eval')\n\n"
        "def double(x: float) -> float:\n    return x * 2\nprint('loading')\n_ = math.floor(1.5)\n"
    )
    assert packaged.left_out == (
        (7, "double(3.0)"),
        (9, "double.local(1.0)"),
        (11, "double.submit(2.0).result()"),
        (12, "math.sqrt(4.0)"),
    )


# A cell with a mid-cell side effect (kept) and both kinds of left-out statement; its bytes and digest are
# golden: the rule that keeps the call must not drift.
SIDE_EFFECT_CELL = """\
import numpy as np
np.random.seed(0)
def noisy(x: float) -> float:
    return x + float(np.random.rand())
noisy(1.0)
noisy
"""
SIDE_EFFECT_ARTIFACT = (
    b"from __future__ import annotations\n\nimport numpy as np\nnp.random.seed(0)\n\n"
    b"def noisy(x: float) -> float:\n    return x + float(np.random.rand())\n"
)


def test_golden_a_mid_cell_call_is_kept_and_the_trial_call_and_trailing_expression_left_out():
    packaged = pack(SIDE_EFFECT_CELL)
    assert packaged.source == SIDE_EFFECT_ARTIFACT
    assert packaged.digest == sha(SIDE_EFFECT_ARTIFACT)
    assert packaged.digest == "sha256:5a93484c80d772851b416ffa53998aceac770b8f56f3017121ace9f08a6e0c7a"
    assert packaged.left_out == ((5, "noisy(1.0)"), (6, "noisy"))
    assert packaged.user_line(4) == 2  # the kept call maps back to its cell line


def test_a_cell_without_left_out_statements_keeps_its_bytes():
    cell = "def normalize_score(value: float) -> float: return value / 100.0\nnormalize_score(3.0)\n"
    packaged = pack(cell)
    assert packaged.source == LANCEDB_SNAPSHOT and packaged.left_out == ((2, "normalize_score(3.0)"),)


def test_the_kept_statements_run_when_the_artifact_module_executes():
    cell = "_STATE = {}\n_STATE.update(mode='eval')\ndef f(x: int) -> int:\n    return x + len(_STATE)\nf(1)\n"
    module: dict = {}
    exec(pack(cell).source_text, module)
    assert module["_STATE"] == {"mode": "eval"} and module["f"](1) == 2


def test_future_imports_of_the_cell_are_dropped():
    cell = "from __future__ import annotations\ndef f(x: int) -> int:\n    return x\n"
    packaged = pack(cell)
    assert packaged.source_text == HEADER + "\ndef f(x: int) -> int:\n    return x\n"


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
