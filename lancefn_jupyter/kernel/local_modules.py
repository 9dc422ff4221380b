"""The notebook's own modules, kernel side: found next to the notebook and shipped inside the artifact.

:func:`collect`: the modules a ``%%gpu_function`` cell uses (its imports, the modules of the
names it captures, and what those modules import in turn) whose files lie under the notebook's directory
— not in site-packages or the standard library — plus ``include=PATH`` files and packages. Pure-Python only:
a compiled extension is refused naming its path. The result maps each module name to ``(path relative to
the notebook's directory, source bytes)``.

The artifact's first header line (:func:`prelude_line`) hands that mapping to ``install`` of
``lancefn_jupyter.local_modules``, the worker side, which serves them to the cell's imports.
"""

from __future__ import annotations

import ast
import importlib.machinery
import sys
import sysconfig
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["LocalModuleError", "collect", "prelude_line"]

Modules = dict[str, tuple[str, bytes]]


class LocalModuleError(ValueError):
    """A local module cannot be shipped; the message names the path and says what to do."""


def _excluded_dirs() -> list[Path]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {entry for entry in sys.path if entry.rstrip("/").endswith(("site-packages", "dist-packages"))}
    return [Path(d).resolve() for d in dirs if d]


def _under(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _compiled(path: Path) -> bool:
    return any(path.name.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _imported_names(source: bytes) -> set[str]:
    """Top-level module names a source imports (absolute imports only)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


class _Collector:
    def __init__(self, root: Path):
        self.root = root
        self.excluded = [d for d in _excluded_dirs() if not _under(root, d)]
        self.modules: Modules = {}
        self.seen: set[str] = set()

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def local_path(self, name: str) -> Path | None:
        """The file or package directory of top-level module `name` if it is a local one."""
        module = sys.modules.get(name)
        location: str | None = None
        if module is not None:
            paths = list(getattr(module, "__path__", None) or ())
            location = getattr(module, "__file__", None) or (paths[0] if paths else None)
        else:
            # An import inside a function body has not run yet: look next to the notebook only.
            spec = importlib.machinery.PathFinder.find_spec(name, [str(self.root)])
            if spec is not None:
                location = spec.origin if spec.has_location else next(iter(spec.submodule_search_locations or ()), None)
        if not location:
            return None
        path = Path(location).resolve()
        if not _under(path, self.root) or any(_under(path, d) for d in self.excluded):
            return None
        return path.parent if path.name == "__init__.py" else path

    def add_name(self, name: str) -> None:
        if name in self.seen or name == "lancefn_jupyter":  # the worker has it (and runs the installer)
            return
        self.seen.add(name)
        path = self.local_path(name)
        if path is not None:
            self.add_path(name, path, f"module {name!r}")

    def add_path(self, name: str, path: Path, what: str) -> None:
        if path.is_dir():
            entries = sorted(p for p in path.rglob("*") if "__pycache__" not in p.parts)
            for entry in entries:
                if entry.is_symlink() and not _under(entry.resolve(), self.root):
                    raise LocalModuleError(
                        f"{what} includes {self.relative(entry)}, a symlink to {entry.resolve()}, outside the "
                        f"notebook's directory {self.root}; only files next to the notebook are shipped: copy the "
                        "file into the package, or remove the link"
                    )
            files = [p for p in entries if p.is_file()]
            for file in files:
                if _compiled(file):
                    self.refuse_compiled(file, what)
            sources = [p for p in files if p.suffix == ".py"]
            if not (path / "__init__.py").exists():
                self.modules[name] = (self.relative(path) + "/", b"")
            for file in sources:
                parts = list(file.relative_to(path).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                self.ship(".".join([name, *parts]), file)
        elif _compiled(path):
            self.refuse_compiled(path, what)
        else:
            self.ship(name, path)

    def ship(self, name: str, file: Path) -> None:
        source = file.read_bytes()
        self.modules[name] = (self.relative(file), source)
        for imported in sorted(_imported_names(source)):
            self.add_name(imported)

    def refuse_compiled(self, path: Path, what: str) -> None:
        raise LocalModuleError(
            f"{what} includes {self.relative(path)}, a compiled extension module, which cannot be shipped "
            "with a function version; build and install it as a package in the control plane's "
            "environment (pip=/conda=) instead"
        )

    def include(self, text: str) -> None:
        path = (self.root / text).resolve()
        if not _under(path, self.root):
            raise LocalModuleError(
                f"include={text}: {path} is outside the notebook's directory {self.root}; only files next "
                "to the notebook are shipped: move it there, or install it as a package (pip=/conda=)"
            )
        if not path.exists():
            raise LocalModuleError(f"include={text}: {path} does not exist; give a .py file or a package directory")
        if path.is_file() and not _compiled(path) and path.suffix != ".py":
            raise LocalModuleError(
                f"include={text}: {path.name} is not a Python module; give a .py file or a package directory"
            )
        name = path.name if path.is_dir() else path.name.split(".")[0]
        if not name.isidentifier():
            raise LocalModuleError(
                f"include={text}: {name!r} is not a valid module name; rename it so it can be imported"
            )
        self.seen.add(name)
        self.add_path(name, path, f"include={text}")


def collect(
    cell: str, namespace: Mapping[str, Any], captured: Iterable[str], root: Path | str, include: Iterable[str] = ()
) -> Modules:
    """The local modules a cell uses (see the module docstring), keyed by module name."""
    collector = _Collector(Path(root).resolve())
    for text in include:
        collector.include(text)
    names = _imported_names(cell.encode("utf-8"))
    for name in captured:
        value = namespace.get(name)
        module_name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(module_name, str):
            names.add(module_name.split(".")[0])
    for name in sorted(names):
        collector.add_name(name)
    return dict(sorted(collector.modules.items()))


def prelude_line(modules: Mapping[str, tuple[str, bytes]]) -> str:
    """The artifact header line that installs `modules` in the worker (no name is bound)."""
    table = ", ".join(f"{name!r}: ({path!r}, {source!r})" for name, (path, source) in sorted(modules.items()))
    return f"__import__('lancefn_jupyter.local_modules', fromlist=['install']).install({{{table}}})"
