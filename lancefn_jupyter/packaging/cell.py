"""`package_cell`: a notebook cell (the cell is the module) as an artifact (pure)."""

from __future__ import annotations

import ast
import inspect
import types
from collections.abc import Mapping
from typing import Any

from lancefn_jupyter.packaging.capture import (
    MISSING,
    PackagedFunction,
    PackagingError,
    build_artifact,
    capture_line,
    describe,
    free_values,
    kernel_function,
)
from lancefn_jupyter.packaging.signature import infer_signature

# --------------------------------------------------------------------------
# package_cell


def _choose_entry(defs: list[ast.stmt], entry: str | None) -> ast.stmt:
    if not defs:
        raise PackagingError(
            "a %%gpu_function cell must define a function: add a top-level "
            "`def name(param: type) -> type:` whose body does the work; the cell's "
            "other statements (imports, constants, kernels, helpers) are packaged with it"
        )
    if entry is not None:
        named = [node for node in defs if node.name == entry]  # type: ignore[attr-defined]
        if named:
            return named[-1]
    public = list(dict.fromkeys(node.name for node in defs if not node.name.startswith("_")))  # type: ignore[attr-defined]
    if len(public) == 1:
        return [node for node in defs if node.name == public[0]][-1]  # type: ignore[attr-defined]
    return defs[-1]


def entry_name(cell: str, entry: str | None = None) -> str | None:
    """The entry function's name `package_cell` would choose, or None (no ``def``, or a
    syntax error): what a refused cell would have bound."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return None
    defs = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return _choose_entry(defs, entry).name if defs else None  # type: ignore[arg-type, attr-defined]


def _entry_object(namespace: Mapping[str, Any], node: ast.stmt) -> types.FunctionType:
    name = node.name  # type: ignore[attr-defined]
    value = namespace.get(name, MISSING)
    if value is MISSING:
        raise PackagingError(
            f"the entry function {name!r} (line {node.lineno}) is not defined in the "
            "notebook yet; run the cell first, then package it"
        )
    if kernel_function(value) is not None:
        raise PackagingError(
            f"the entry function {name!r} (line {node.lineno}) is a numba CUDA kernel; "
            "add a plain Python function that takes annotated row values, launches the "
            "kernel and returns the result, and make it the entry (name=...)"
        )
    function = value
    if not inspect.isfunction(function):
        unwrapped = getattr(value, "__wrapped__", None)
        if inspect.isfunction(unwrapped):
            function = unwrapped
        else:
            raise PackagingError(
                f"the entry {name!r} (line {node.lineno}) is bound to {describe(value)} "
                "in the notebook, not to the function the cell defines; run the cell again"
            )
    arguments = node.args  # type: ignore[attr-defined]
    cell_params = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    code = function.__code__
    ns_params = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    if function.__name__ != name or cell_params != ns_params:
        raise PackagingError(
            f"the notebook's {name!r} does not match the cell's definition on line "
            f"{node.lineno}; run the cell (so it defines {name!r}) before packaging it"
        )
    return function


def package_cell(
    cell: str,
    namespace: Mapping[str, Any],
    *,
    entry: str | None = None,
    modules: Mapping[str, tuple[str, bytes]] | None = None,
) -> PackagedFunction:
    """Package a ``%%gpu_function`` cell.

    `cell` is the cell body after IPython's ``transform_cell`` (no ``%``
    syntax, no magic line); `namespace` is the user namespace *after* the
    cell ran (the entry function must exist there: its annotations give the
    signature). `entry` selects the entry function if it names a top-level
    ``def`` of the cell. `modules` (from ``local_modules.collect``) are the
    notebook's own modules to ship inside the artifact.
    """
    try:
        tree = ast.parse(cell)
    except SyntaxError as error:
        raise PackagingError(
            f"the cell has a syntax error{f' on line {error.lineno}' if error.lineno else ''}: {error.msg}; "
            "fix it and run the cell again"
        ) from None
    kept = [
        node
        for node in tree.body
        if not isinstance(node, ast.Expr) and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]
    defs = [node for node in kept if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    entry_node = _choose_entry(defs, entry)  # type: ignore[arg-type]
    if isinstance(entry_node, ast.AsyncFunctionDef):
        raise PackagingError(
            f"the entry function {entry_node.name!r} (line {entry_node.lineno}) is "
            "`async def`; a GPU function entry must be a plain synchronous `def`"
        )

    code = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    found = free_values(kept, code, namespace, lambda line: line, "the cell, the notebook")
    header = {name: capture_line(name, value, where) for name, value, where in found}

    function = _entry_object(namespace, entry_node)
    signature = infer_signature(function)
    return build_artifact(
        header,
        kept,
        [0] * len(kept),
        entry_node.name,  # type: ignore[attr-defined]
        signature,
        tuple(sorted(header)),
        code,
        modules,
    )
