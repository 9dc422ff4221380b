"""The notebook's own modules, worker side: the artifact's first header line calls :func:`install` with the
modules the kernel shipped (``kernel/local_modules.py``), which puts a finder first on ``sys.meta_path`` serving
them from memory, so the cell's own imports find them. The worker calls :func:`uninstall` when it drops the
version that shipped them, so a warm worker never serves one version's modules to another. Standard library
only: it runs in every worker.

This module must stay importable at exactly ``lancefn_jupyter.local_modules``, and ``install`` keep its
name: registered versions' artifacts contain ``__import__('lancefn_jupyter.local_modules', ...)``
(``kernel.local_modules.prelude_line``), so moving it would change new versions' digests and break stored ones.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import linecache
import sys
from collections.abc import Mapping

__all__ = ["install", "uninstall"]


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, modules: Mapping[str, tuple[str, bytes]]):
        self.modules = dict(modules)

    def find_spec(self, fullname, path=None, target=None):
        entry = self.modules.get(fullname)
        if entry is None:
            return None
        relative = entry[0]
        package = relative.endswith(("__init__.py", "/"))
        return importlib.util.spec_from_loader(fullname, self, origin=relative, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        relative, source = self.modules[module.__name__]
        filename = f"<local module {relative}>"
        text = source.decode("utf-8")
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        module.__file__ = filename
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)


_installed: _Finder | None = None


def install(modules: Mapping[str, tuple[str, bytes]]) -> None:
    """Serve `modules` to imports in this process (first on sys.meta_path) until :func:`uninstall`."""
    global _installed
    uninstall()
    finder = _Finder(modules)
    for name in finder.modules:  # an earlier import of the same name must not shadow the shipped file
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, finder)
    _installed = finder


def uninstall() -> None:
    """Forget the installed modules (the worker calls this when it drops the version that shipped them)."""
    global _installed
    finder, _installed = _installed, None
    if finder is None:
        return
    if finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for name, (relative, _) in finder.modules.items():
        sys.modules.pop(name, None)
        linecache.cache.pop(f"<local module {relative}>", None)
