"""Class entries (docs/ARCHITECTURE.md, "Warm state"): a cell or a decorated .py class with ``__call__`` is the
entry; its signature is ``__call__``'s without ``self``; what the worker cannot drive is refused."""

from __future__ import annotations

import pytest
from helpers import HEADER, pack, run_cell

from lancefn_jupyter.kernel.packaging import PackagingError, entry_name, package_cell, package_function

pytestmark = pytest.mark.unit

SCALER_CELL = """\
import math
class Scaler:
    factor = 1.0
    def setup(self):
        self.factor = math.sqrt(4.0)
    def __call__(self, x: float, bias: float = 0.0) -> float:
        return x * self.factor + bias
def _helper(x: float) -> float:
    return x
Scaler()(3.0)
"""


def test_a_class_with_call_is_the_entry_and_its_signature_is_call_without_self():
    packaged = pack(SCALER_CELL)
    assert packaged.entrypoint == "Scaler"
    assert packaged.entry_is_class and packaged.entry_has_setup
    assert [(p.name, p.arrow_type, p.default) for p in packaged.signature.inputs] == [
        ("x", "float64", None),
        ("bias", "float64", "0.0"),
    ]
    assert packaged.signature.output.arrow_type == "float64"
    # The trial call through an instance is left out like a function's.
    assert packaged.left_out == ((10, "Scaler()(3.0)"),)
    assert packaged.source_text.startswith(HEADER + "\nimport math\n\nclass Scaler:\n")
    assert "Scaler()(3.0)" not in packaged.source_text


def test_a_class_without_call_is_a_helper_not_a_candidate():
    cell = "class Config:\n    size = 2\ndef run(x: int) -> int:\n    return x * Config.size\n"
    packaged = pack(cell)
    assert packaged.entrypoint == "run" and not packaged.entry_is_class
    assert entry_name(cell) == "run"


def test_entry_choice_over_functions_and_classes():
    cell = "class Model:\n    def __call__(self, x: int) -> int:\n        return x\ndef score(x: int) -> int:\n    return x\n"
    assert entry_name(cell) == "score"  # the last of two public candidates
    assert pack(cell).entrypoint == "score"
    assert entry_name(cell, "Model") == "Model"
    named = pack(cell, entry="Model")
    assert named.entrypoint == "Model" and named.entry_is_class and not named.entry_has_setup
    private = "class _Impl:\n    def __call__(self, x: int) -> int:\n        return x\nclass Model(_Impl):\n    def __call__(self, x: int) -> int:\n        return x\n"
    assert entry_name(private) == "Model"


def test_trial_calls_are_those_of_the_chosen_entry():
    cell = "def helper(x: int) -> int:\n    return x\ndef score(x: int) -> int:\n    return helper(x)\nhelper(1)\nscore(2)\nx = 1\n"
    # name= picks `helper`: its calls are trial runs, `score(2)` is an ordinary statement (kept).
    packaged = pack(cell, entry="helper")
    assert packaged.left_out == ((5, "helper(1)"),)
    assert packaged.source_text.endswith("score(2)\nx = 1\n")
    assert pack(cell).left_out == ((6, "score(2)"),)  # two public defs: the last is the entry


def test_the_packaged_class_runs_setup_then_call():
    module: dict = {}
    exec(pack(SCALER_CELL).source_text, module)
    instance = module["Scaler"]()
    instance.setup()
    assert instance(3.0, bias=1.0) == 7.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "    def __init__(self, path):\n        self.path = path\n",
            "the class entry 'M' (line 1) is instantiated with no arguments: give every __init__ parameter a "
            "default, or load in setup() (__init__ needs 'path'); or annotate every __init__ parameter "
            "(`factor: float`) to give the values per run: submit(x, init={...})",
        ),
        (
            "    def setup(self, device):\n        pass\n",
            "the class entry 'M' (line 1): setup() is called with no arguments besides self, but it takes 'device'; "
            "write `def setup(self):`",
        ),
        (
            "    def teardown(self, wait=1):\n        pass\n",
            "the class entry 'M' (line 1): teardown() is called with no arguments besides self, but it takes "
            "'wait'; write `def teardown(self):`",
        ),
    ],
)
def test_refused_class_entries_name_the_fix(body, message):
    cell = f"class M:\n{body}    def __call__(self, x: int) -> int:\n        return x\n"
    with pytest.raises(PackagingError) as refused:
        pack(cell)
    assert str(refused.value) == message


def test_init_with_defaults_is_accepted():
    cell = "class M:\n    def __init__(self, scale=2):\n        self.scale = scale\n    def __call__(self, x: int) -> int:\n        return x * self.scale\n"
    assert pack(cell).entrypoint == "M"


def test_async_call_is_refused():
    cell = "class M:\n    async def __call__(self, x: int) -> int:\n        return x\n"
    with pytest.raises(PackagingError, match=r"'M' \(line 1\) has `async def __call__` \(line 2\)"):
        pack(cell)


def test_unannotated_call_names_the_method():
    cell = "class M:\n    def __call__(self, x) -> int:\n        return x\n"
    with pytest.raises(PackagingError, match=r"annotate parameter 'x' of M.__call__"):
        pack(cell)


def test_a_stale_notebook_binding_is_refused():
    cell = "class M:\n    def __call__(self, x: int) -> int:\n        return x\n"
    with pytest.raises(PackagingError, match="is not the class the cell defines on line 1"):
        package_cell(cell, {"M": lambda x: x})


# ---------------------------------------------------------------- the decorator (package_function)


def _twice(x: float) -> float:
    return 2 * x


class Doubler:
    """Loads once, then doubles."""

    def setup(self) -> None:
        self.offset = 0.5

    def __call__(self, x: float) -> float:
        return _twice(x) + self.offset


class NeedsPath:
    def __init__(self, path: str):
        self.path = path

    def __call__(self, x: float) -> float:
        return x


class NoCall:
    pass


def test_package_function_takes_a_class_from_a_py_file():
    packaged = package_function(Doubler)
    assert packaged.entrypoint == "Doubler" and packaged.entry_is_class and packaged.entry_has_setup
    assert [p.name for p in packaged.signature.inputs] == ["x"]
    text = packaged.source_text
    # Its helper is importable from this test module, so it is imported, as for a decorated function.
    assert text.startswith(HEADER + f"\nfrom {__name__} import _twice as _twice\n\nclass Doubler:\n")
    assert "@" not in text and packaged.captured == ("_twice",)
    module: dict = {}
    exec(text, module)
    instance = module["Doubler"]()
    instance.setup()
    assert instance(2.0) == 4.5


def test_package_function_refuses_classes_it_cannot_drive():
    # An annotated __init__ parameter is an initialization value now (given per run), not a refusal.
    assert [f.name for f in package_function(NeedsPath).signature.initialization] == ["path"]
    with pytest.raises(PackagingError, match="'NoCall' has no __call__"):
        package_function(NoCall)


def test_package_function_refuses_a_class_without_source():
    namespace = run_cell("class Made:\n    def __call__(self, x: int) -> int:\n        return x\n")
    with pytest.raises(PackagingError, match="the source of class 'Made' is not available"):
        package_function(namespace["Made"])


def test_annotated_init_parameters_are_the_initialization_and_defaults_keep_none():
    cell = (
        "class Scale:\n    def __init__(self, factor: float, offset: float = 0.0):\n        self.f, self.o = factor, offset\n"
        "    def __call__(self, x: float) -> float:\n        return x * self.f + self.o\n"
    )
    fields = pack(cell).signature.initialization
    assert [(f.name, f.arrow_type, f.nullable) for f in fields] == [
        ("factor", "float64", False),
        ("offset", "float64", True),
    ]
    defaults = "class M:\n    def __init__(self, scale: int = 2):\n        self.scale = scale\n    def __call__(self, x: int) -> int:\n        return x\n"
    assert pack(defaults).signature.initialization == ()  # nothing required: no initialization, ids as before
