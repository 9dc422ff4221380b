"""The house rule the linters cannot see (docs/ARCHITECTURE.md, "Package layout"): no module of
lancefn_jupyter reads another module's private names, neither by importing them
(``from lancefn_jupyter.x import _name``) nor as an attribute of an imported module (``x._name``).

ruff's SLF001 catches ``obj._name`` on objects, import-linter's private_modules contract catches
private *modules* imported from outside their package; this scan catches private *names* crossing
modules. Dunders (``__version__``) are public. The scan reads source only (AST), so it costs no import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "lancefn_jupyter"
ROOT = PACKAGE.name

FIX = (
    "fix: give the name a public spelling in the module that owns it (drop the underscore, or add a small "
    "public function or property), or move the code that needs it into that module"
)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(dotted: str, package: Path) -> bool:
    """Whether ``dotted`` names a module or package of lancefn_jupyter (rather than a name in one)."""
    path = package.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def absolute(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    """The module an ``import from`` reads, with relative imports resolved against ``here``."""
    if not node.level:
        return node.module or ""
    base = here.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def violations(path: Path, package: Path = PACKAGE) -> list[str]:
    """``file:line: what`` for each private name of another module that ``path`` reads."""
    here = module_name(path, package)
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(package.parent)
    found: list[str] = []
    modules: dict[str, str] = {}  # local name -> lancefn_jupyter module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT:
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else ROOT
        elif isinstance(node, ast.ImportFrom):
            source = absolute(node, here, path.name == "__init__.py")
            if source.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                target = f"{source}.{alias.name}"
                if is_module(target, package):
                    # A submodule, private or not: import-linter's private_modules contract owns that rule.
                    modules[alias.asname or alias.name] = target
                elif is_private(alias.name) and source != here:
                    found.append(
                        f"{where}:{node.lineno}: `from {source} import {alias.name}` reads a private name of {source}"
                    )
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        owner = dotted(node.value, modules, package)
        if owner is not None and owner != here and not is_module(f"{owner}.{node.attr}", package):
            found.append(f"{where}:{node.lineno}: `{ast.unparse(node)}` reads a private name of {owner}")
    return found


def dotted(node: ast.expr, modules: dict[str, str], package: Path) -> str | None:
    """The lancefn_jupyter module an expression like ``api`` or ``lancefn_jupyter.kernel.handles.job`` names."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = dotted(node.value, modules, package)
        if owner is not None and is_module(f"{owner}.{node.attr}", package):
            return f"{owner}.{node.attr}"
    return None


def test_no_module_reads_another_modules_private_names():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in violations(path)]
    assert not found, "\n".join([f"{len(found)} private name(s) read across modules:", *found, FIX])


def test_the_scan_sees_both_forms(tmp_path):
    """The scan itself: an imported private name and a private attribute of an imported module are found;
    dunders, a module's own names, private submodules and other packages' names are not."""
    package = tmp_path / ROOT
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from lancefn_jupyter.sub import _impl\n")
    (package / "sub" / "_impl.py").write_text("X = 1\n")
    (package / "a.py").write_text("_hidden = 1\n__version__ = '1'\nprint(_hidden)\n")
    (package / "b.py").write_text(
        "import os\n"
        "from lancefn_jupyter import a\n"
        "from lancefn_jupyter.a import _hidden, __version__\n"
        "from os import _exit\n"
        "print(a._hidden, a.__version__, os._exit)\n"
    )
    assert violations(package / "b.py", package) == [
        f"{ROOT}/b.py:3: `from lancefn_jupyter.a import _hidden` reads a private name of lancefn_jupyter.a",
        f"{ROOT}/b.py:5: `a._hidden` reads a private name of lancefn_jupyter.a",
    ]
    assert violations(package / "a.py", package) == violations(package / "sub" / "__init__.py", package) == []


ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
LONG = 600


def _long_modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if len(path.read_text().splitlines()) > LONG)


def test_each_long_module_says_why_and_is_listed():
    """A module over 600 lines says why in its docstring (one long concern, not several), and the layout's
    list of them names it."""
    layout = ARCHITECTURE.read_text()
    listed = layout[layout.index("Files over ~600 lines") :].split("\n\n", 1)[0]
    for path in _long_modules():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "Over 600 lines" in doc, f"{path}: say why it is long in its docstring, or split it"
        relative = path.relative_to(PACKAGE).as_posix()
        assert f"`{relative}`" in listed, f"{relative}: add it to ARCHITECTURE's list of long files"


def test_the_layout_table_names_every_folder():
    """Each package folder has its row in ARCHITECTURE's layout table (``kernel/handles/``, ``environments/``)."""
    layout = ARCHITECTURE.read_text()
    table = layout[layout.index("| folder | runs in | holds |") :].split("\n\n", 1)[0]
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent.relative_to(PACKAGE).as_posix()
        if folder in (".", "handles"):  # the root's row; ``handles/`` keeps one public path (a re-export)
            continue
        parent, _, leaf = folder.rpartition("/")
        rows = {row.split("|")[1].strip(): row for row in table.splitlines()[2:]}
        own = any(key.split(" ")[0] == f"`{folder}/`" for key in rows)  # also "`server/` (root modules)"
        in_parent = parent and f"`{leaf}/`" in rows.get(f"`{parent}/`", "")  # e.g. ``routes/`` in ``server/http/``
        assert own or in_parent, f"{folder}/: add its row to the layout table"
