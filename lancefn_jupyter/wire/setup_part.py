"""The *setup part* of a function version's source (docs/ARCHITECTURE.md, "Warm state", "Setup reuse").

Pure and standard library only: the control plane derives a version's setup digest from its artifact with it, the
worker uses it to rebind a new version's code onto a live module, and the kernel's card names the setup part.

The setup part of an artifact is:

* every top-level statement that is not a function definition nor the entry class (imports, assignments, the
  header lines of captured values and shipped modules, other classes, ``if`` blocks, …);
* of the entry class: its header (bases, keywords, decorators), every body statement that is not a method, and
  the methods ``__init__``, ``setup`` and every other dunder method but ``__call__``;
* every top-level function and entry-class method named, transitively, by what is already in it (a function by
  its name, a method by ``self.NAME`` / ``cls.NAME``).

What is left (the *rebound* definitions: other functions, ``__call__`` and other methods) can change without
touching what setup built; a worker holding a version with the same setup digest executes only those.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["SetupPart", "class_def", "setup_part"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SETUP_METHODS = frozenset({"__init__", "setup"})


@dataclass(frozen=True)
class SetupPart:
    """``digest``: of the setup part's code (no line numbers: moving code is no change); ``setup``: the names of
    the functions and methods in it (``Model.setup``); ``functions`` / ``methods``: the rebound top-level functions
    and entry-class methods; ``entry_class``: whether the entry is a class."""

    digest: str
    setup: tuple[str, ...]
    functions: tuple[str, ...]
    methods: tuple[str, ...]
    entry_class: bool


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    """Names a piece of code reads: bare names, and attributes of ``self`` / ``cls``."""
    found: set[str] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                found.add(sub.id)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"):
                found.add(sub.attr)
    return found


def class_def(node: ast.ClassDef, body: list[ast.stmt], *, bare: bool = False) -> ast.ClassDef:
    """``node`` with ``body``; ``bare``: without its bases, keywords and decorators (``type_params`` only where this
    Python has them: a worker may run another Python than the plane)."""
    fields: dict = {
        "name": node.name,
        "bases": [] if bare else node.bases,
        "keywords": [] if bare else node.keywords,
        "body": body,
        "decorator_list": [] if bare else node.decorator_list,
    }
    if "type_params" in ast.ClassDef._fields:
        fields["type_params"] = [] if bare else node.type_params  # type: ignore[attr-defined]
    return ast.ClassDef(**fields)


def _is_setup_method(name: str) -> bool:
    return name in _SETUP_METHODS or (name.startswith("__") and name.endswith("__") and name != "__call__")


def setup_part(source: str, entrypoint: str) -> SetupPart | None:
    """The setup part of an artifact's ``source`` whose entry is ``entrypoint``; None when it cannot be parsed."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    functions = {s.name: s for s in module.body if isinstance(s, _FUNCTIONS)}
    entry = next((s for s in module.body if isinstance(s, ast.ClassDef) and s.name == entrypoint), None)
    methods = {s.name: s for s in entry.body if isinstance(s, _FUNCTIONS)} if entry is not None else {}
    kept: list[ast.AST] = [s for s in module.body if not isinstance(s, _FUNCTIONS) and s is not entry]
    if entry is not None:
        kept += [*entry.bases, *entry.keywords, *entry.decorator_list]
        kept += [s for s in entry.body if not isinstance(s, _FUNCTIONS)]
    in_setup_functions: set[str] = set()
    in_setup_methods = {name for name in methods if _is_setup_method(name)}
    pending = list(kept) + [methods[name] for name in in_setup_methods]
    while pending:  # the transitive closure of what the setup part names
        named = _names(pending)
        pending = []
        for name in named:
            if name in functions and name not in in_setup_functions:
                in_setup_functions.add(name)
                pending.append(functions[name])
            if name in methods and name not in in_setup_methods:
                in_setup_methods.add(name)
                pending.append(methods[name])
    digest = hashlib.sha256(entrypoint.encode())
    for statement in module.body:
        if statement is entry:
            body = [s for s in statement.body if not isinstance(s, _FUNCTIONS) or s.name in in_setup_methods]
            shell = class_def(statement, body)
            digest.update(ast.dump(shell, include_attributes=False).encode())
        elif not isinstance(statement, _FUNCTIONS) or statement.name in in_setup_functions:
            digest.update(ast.dump(statement, include_attributes=False).encode())
        digest.update(b"\0")
    setup = sorted(in_setup_functions) + sorted(f"{entrypoint}.{name}" for name in in_setup_methods)
    return SetupPart(
        digest=digest.hexdigest(),
        setup=tuple(setup),
        functions=tuple(sorted(set(functions) - in_setup_functions)),
        methods=tuple(sorted(set(methods) - in_setup_methods)),
        entry_class=entry is not None,
    )
