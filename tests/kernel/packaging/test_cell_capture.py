"""Cells as people write them (issue 11), at the packaging level: IPython's builtins, literal
containers, default arguments, and the handle a refused cell leaves behind.

The same cases run through the real magic in an executed notebook in test_notebook_cells.py.
"""

from __future__ import annotations

import base64
import copy
import math
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lancefn_jupyter.kernel.api import NotRegisteredError, UnregisteredFunction, bind_refused
from lancefn_jupyter.kernel.options import build_options
from lancefn_jupyter.kernel.packaging import PackagingError, infer_signature, package_cell
from lancefn_jupyter.worker.runner import run_task_inline

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def shell():
    """A real IPython shell: its user namespace holds IPython's `open`, `exit`, `quit`, `get_ipython`."""
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def run_artifact(packaged, rows: list[dict]) -> dict:
    """Run the artifact exactly as a worker does (the Ray executor's path) and return the final event."""
    task = {
        "task_id": "t",
        "artifact_b64": base64.b64encode(packaged.source).decode(),
        "entrypoint": packaged.entrypoint,
        "filename": "<gpu_function f@v1>",
        "rows": rows,
        "packages": [],
    }
    return run_task_inline(task, lambda **event: None)


def package_in_shell(shell, cell: str):
    assert shell.run_cell(cell).success
    return package_cell(shell.transform_cell(cell), shell.user_ns)


# ------------------------------------------------------------------------------------------ builtins

BUILTIN_CELLS = {
    "open": ("def f(path: str) -> int:\n    with open(path) as fh:\n        return len(fh.read())\n", "PATH", 5),
    "display": ("def f(x: int) -> int:\n    display(x)\n    return x\n", 7, 7),
    "get_ipython": ("def f(x: int) -> int:\n    return x if get_ipython() is None else -x\n", 3, 3),
    "exit": ("def f(x: int) -> int:\n    if x < 0:\n        exit(1)\n    return x\n", 4, 4),
    "quit": ("def f(x: int) -> int:\n    if x < 0:\n        quit(1)\n    return x\n", 4, 4),
    "print": ("def f(x: int) -> int:\n    print(x)\n    return x\n", 2, 2),
}


@pytest.mark.parametrize("name", sorted(BUILTIN_CELLS))
def test_builtins_and_ipython_stand_ins_resolve_as_builtins(shell, name, tmp_path, capfd):
    cell, argument, expected = BUILTIN_CELLS[name]
    if argument == "PATH":
        (tmp_path / "data.txt").write_text("hello")
        argument = str(tmp_path / "data.txt")
    assert name in shell.user_ns or name in ("display", "print")  # IPython's own binding is there
    packaged = package_in_shell(shell, cell)
    assert packaged.captured == ()
    assert packaged.source_text.startswith("from __future__ import annotations\n\ndef f(")  # nothing captured
    final = run_artifact(packaged, [{next(iter(packaged.signature.inputs)).name: argument}])
    assert final["event"] == "result", final
    assert final["results"] == [expected]
    if name == "display":  # the worker's display writes the repr to the job's log
        assert capfd.readouterr().out.splitlines()[-1] == "7"


def test_exit_in_the_worker_fails_the_row_not_the_worker(shell):
    packaged = package_in_shell(shell, BUILTIN_CELLS["exit"][0])
    final = run_artifact(packaged, [{"x": -1}])
    assert final["event"] == "failed" and final["phase"] == "run"
    assert "SystemExit" in final["message"]


def test_a_notebook_value_shadowing_a_builtin_is_still_captured(shell):
    shell.run_cell("max = 41")
    try:
        packaged = package_in_shell(shell, "def f(x: int) -> int:\n    return x + max\n")
    finally:
        shell.run_cell("del max")
    assert "max = 41" in packaged.source_text


# ------------------------------------------------------------------------------- literal containers

CELL = "def f(x: int) -> int:\n    return x * CONFIG['scale']\n"


def pack_with(value, cell: str = CELL, name: str = "CONFIG"):
    namespace: dict = {name: value}
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), namespace)
    return package_cell(cell, namespace)


def test_a_config_dict_is_captured_as_a_literal_line():
    packaged = pack_with({"scale": 2, "tags": ("a", "b"), "ids": {3, 1, 2}, "ok": frozenset(), "none": None})
    assert packaged.source_text.splitlines()[2] == (
        "CONFIG = {'scale': 2, 'tags': ('a', 'b'), 'ids': {1, 2, 3}, 'ok': frozenset(), 'none': None}"
    )
    assert run_artifact(packaged, [{"x": 5}])["results"] == [10]


def test_dicts_keep_insertion_order_and_sets_are_sorted():
    assert "CONFIG = {'b': 1, 'a': 2}" in pack_with({"b": 1, "a": 2}).source_text
    left = pack_with({"scale": 1, "s": {"x", "y", "z", 10, (1, 2)}})
    right = pack_with({"scale": 1, "s": {(1, 2), 10, "z", "y", "x"}})
    assert left.digest == right.digest


def test_editing_a_captured_literal_makes_a_new_digest():
    assert pack_with({"scale": 2}).digest != pack_with({"scale": 3}).digest


def test_literals_over_the_cap_are_refused_naming_the_cap():
    with pytest.raises(PackagingError) as info:
        pack_with({"scale": 1, "table": list(range(20_000))})
    message = str(info.value)
    assert "'CONFIG' (line 2)" in message and "capped at 64 KiB" in message
    assert "read the data inside the function" in message


def test_a_container_that_contains_itself_is_refused():
    loop: list = [1]
    loop.append(loop)
    with pytest.raises(PackagingError, match="nested more than 100 levels deep \\(or contains itself\\)"):
        pack_with({"scale": 1, "loop": loop})


def test_a_dict_subclass_is_not_a_literal():
    from collections import OrderedDict

    with pytest.raises(PackagingError, match="'CONFIG' is a collections.OrderedDict"):
        pack_with(OrderedDict(scale=1))


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
_hashables = st.recursive(
    _scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6
)
_literals = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner)
        | st.tuples(inner, inner, inner)
        | st.dictionaries(_hashables, inner, max_size=4)
        | st.sets(_hashables, max_size=4)
        | st.frozensets(_hashables, max_size=4)
    ),
    max_leaves=20,
)


def _same(a, b) -> bool:
    """Equal, and the same types all the way down (1 == 1.0 == True would hide a wrong repr)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


@settings(max_examples=150, deadline=None)
@given(_literals)
def test_any_nested_literal_round_trips_with_a_stable_digest(value):
    cell = "def f(x: int) -> int:\n    return x + len(repr(V))\n"
    packaged = pack_with(value, cell, "V")
    fresh: dict = {}
    exec(packaged.source, fresh)
    assert fresh["V"] == value
    if not isinstance(value, (set, frozenset)):  # set members equal but of another type (1, True) may collapse
        assert _same(fresh["V"], value)
    # the same value built again (sets re-hashed in another order) and the round-tripped value
    assert pack_with(copy.deepcopy(value), cell, "V").digest == packaged.digest
    assert pack_with(fresh["V"], cell, "V").digest == packaged.digest


# ------------------------------------------------------------------------------------------ defaults


def test_literal_defaults_and_keyword_only_parameters_are_optional_inputs():
    namespace: dict = {"Optional": Optional}
    exec(
        "def kw(x: int, *, scale: int = 2, tags: list[str] = ['a']) -> int:\n    return x * scale\n"
        "def opt(x: Optional[int] = None) -> int:\n    return -1 if x is None else x\n",
        namespace,
    )
    kw = infer_signature(namespace["kw"])
    assert [(p.name, p.default) for p in kw.inputs] == [("x", None), ("scale", "2"), ("tags", "['a']")]
    opt = infer_signature(namespace["opt"])
    assert [(p.name, p.arrow_type, p.nullable, p.default) for p in opt.inputs] == [("x", "int64", True, "None")]


def test_a_parameter_without_a_default_encodes_as_before():
    namespace: dict = {}
    exec("def f(x: int) -> int:\n    return x\n", namespace)
    wire = infer_signature(namespace["f"]).to_wire()
    assert wire["inputs"] == [{"name": "x", "arrow_type": "int64", "nullable": False}]


def test_the_worker_applies_an_omitted_default():
    cell = "def kw(x: int, *, scale: int = 2) -> int:\n    return x * scale\n"
    packaged = pack_with(None, cell, "unused")
    final = run_artifact(packaged, [{"x": 3}, {"x": 3, "scale": 5}])
    assert final["results"] == [6, 15]


# ------------------------------------------------------------------------------------ refused cells


def test_a_refused_cell_binds_a_handle_that_raises_the_registration_error():
    cell = "def f(x: int) -> int:\n    return x + len(TABLE)\n"
    namespace: dict = {"TABLE": bytearray(b"ab")}
    exec(cell, namespace)
    with pytest.raises(PackagingError, match="'TABLE' is a bytearray"):
        package_cell(cell, namespace)
    handle = bind_refused(namespace, cell, build_options(), "TABLE is an object")
    assert isinstance(handle, UnregisteredFunction) and namespace["f"] is handle
    assert handle(1) == 3  # the cell ran: calling it in the kernel works as without the magic
    for call in (
        lambda: handle.submit(1),
        lambda: handle.map([1]),
        lambda: handle.remote(1),
        lambda: handle.local(1),
        lambda: handle.register(),
        lambda: handle.version,
        lambda: handle.artifact_source,
    ):
        with pytest.raises(
            NotRegisteredError, match="f is not registered: TABLE is an object\nFix the cell and run it again"
        ):
            call()
    assert "not registered" in repr(handle)
    assert not hasattr(handle, "_repr_html_")  # display and introspection still see plain AttributeErrors


def test_a_refused_cell_without_a_def_binds_nothing():
    namespace: dict = {}
    assert bind_refused(namespace, "x = 1\n", build_options(), "no def") is None
    assert namespace == {}


# ------------------------------------------------------------------------------------- local modules


def test_local_modules_are_found_next_to_the_notebook_only(tmp_path, monkeypatch):
    from lancefn_jupyter.kernel.local_modules import collect

    (tmp_path / "mylib.py").write_text("import json\nimport numpy\nfrom mydep import K\n")
    (tmp_path / "mydep.py").write_text("K = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cell = "import numpy as np\nimport json\n\ndef f(x: int) -> int:\n    import mylib\n    return x\n"
    modules = collect(cell, {}, (), tmp_path)
    assert {name: path for name, (path, _) in modules.items()} == {"mydep": "mydep.py", "mylib": "mylib.py"}
    assert modules["mydep"][1] == b"K = 1\n"
    # the standard library and site-packages never ship, even when the notebook's directory holds them
    assert collect("import json\nimport numpy\nimport hypothesis\n", {}, (), "/") == {}


def test_include_refusals_name_the_path(tmp_path):
    from lancefn_jupyter.kernel.local_modules import LocalModuleError, collect

    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "fast.abi3.so").write_bytes(b"\x7fELF")
    for include, needle in [
        ("../elsewhere.py", "is outside the notebook's directory"),
        ("missing.py", "does not exist"),
        ("notes.txt", "notes.txt is not a Python module"),
        ("fast.abi3.so", "fast.abi3.so, a compiled extension module"),
    ]:
        with pytest.raises(LocalModuleError, match=f"include={include}"):
            collect("", {}, (), tmp_path, [include])
        with pytest.raises(LocalModuleError) as info:
            collect("", {}, (), tmp_path, [include])
        assert needle in str(info.value)


def test_include_refuses_a_package_with_a_symlink_leaving_the_notebooks_directory(tmp_path):
    from lancefn_jupyter.kernel.local_modules import LocalModuleError, collect

    notebook, outside = tmp_path / "nb", tmp_path / "outside"
    (notebook / "pkg").mkdir(parents=True)
    (outside / "keys").mkdir(parents=True)
    (outside / "secret.py").write_text("TOKEN = 'do not ship'\n")
    (notebook / "pkg" / "__init__.py").write_text("")
    (notebook / "helper.py").write_text("VALUE = 1\n")
    (notebook / "pkg" / "alias.py").symlink_to(notebook / "helper.py")  # inside the directory: shipped
    assert set(collect("", {}, (), notebook, ["pkg"])) == {"pkg", "pkg.alias"}
    for link, target in (("leak.py", outside / "secret.py"), ("keys", outside / "keys")):
        (notebook / "pkg" / link).symlink_to(target)
        with pytest.raises(LocalModuleError) as info:
            collect("", {}, (), notebook, ["pkg"])
        assert f"pkg/{link}, a symlink to {target}" in str(info.value) and "outside the notebook" in str(info.value)
        (notebook / "pkg" / link).unlink()


def test_cells_without_local_modules_package_to_the_same_bytes(tmp_path):
    cell = "def f(x: int) -> int:\n    return x\n"
    plain = pack_with(None, cell, "unused")
    namespace: dict = {}
    exec(cell, namespace)
    assert package_cell(cell, namespace, modules={}).source == plain.source
    shipped = package_cell(cell, namespace, modules={"m": ("m.py", b"A = 1\n")})
    assert shipped.local_modules == ("m",) and shipped.digest != plain.digest
    assert shipped.source_text.endswith(plain.source_text.split("\n\n", 1)[1])
