"""`package_cell`: a notebook cell (the cell is the module) as an artifact (pure)."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping
from typing import Any

from lancefn_jupyter.kernel.packaging import capture
from lancefn_jupyter.kernel.packaging.capture import PackagedFunction, PackagingError
from lancefn_jupyter.kernel.packaging.signature import check_class_entry, infer_signature

# --------------------------------------------------------------------------
# package_cell


def _candidates(body: list[ast.stmt]) -> list[ast.stmt]:
    """What can be the entry: top-level ``def``s, and top-level classes whose body defines ``__call__``."""
    return [
        node
        for node in body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        or (
            isinstance(node, ast.ClassDef)
            and any(
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__call__"
                for item in node.body
            )
        )
    ]


def _choose_entry(defs: list[ast.stmt], entry: str | None) -> ast.stmt:
    if not defs:
        raise PackagingError(
            "a %%gpu_function cell must define a function: add a top-level "
            "`def name(param: type) -> type:` whose body does the work (or a class with "
            "`def __call__(self, param: type) -> type:`); the cell's other statements "
            "(imports, constants, kernels, helpers) are packaged with it"
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
    """The entry's name `package_cell` would choose, or None (no candidate, or a syntax error):
    what a refused cell would have bound."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return None
    defs = _candidates(tree.body)
    return _choose_entry(defs, entry).name if defs else None  # type: ignore[attr-defined]


def _calls_entry(node: ast.stmt, entry: str) -> bool:
    """An expression statement calling the entry: ``f(x)``, ``f.local(x)``, ``f.submit(x).result()``,
    ``Scaler()(x)`` — a trial run, which the worker must not repeat at import."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    callee: ast.expr = node.value.func
    while isinstance(callee, (ast.Attribute, ast.Call)):
        callee = callee.value if isinstance(callee, ast.Attribute) else callee.func
    return isinstance(callee, ast.Name) and callee.id == entry


def _left_out(body: list[ast.stmt], entry: str) -> list[ast.stmt]:
    """The statements the artifact leaves out (docs/ARCHITECTURE.md, "Function versions"): the cell's
    trailing expression (its display value) and trial calls of the entry."""
    return [
        node
        for index, node in enumerate(body)
        if (index == len(body) - 1 and isinstance(node, ast.Expr)) or _calls_entry(node, entry)
    ]


def _entry_object(namespace: Mapping[str, Any], node: ast.stmt) -> Any:
    name = node.name  # type: ignore[attr-defined]
    value = namespace.get(name, capture.MISSING)
    if value is capture.MISSING:
        raise PackagingError(
            f"the entry {name!r} (line {node.lineno}) is not defined in the "
            "notebook yet; run the cell first, then package it"
        )
    if isinstance(node, ast.ClassDef):
        return _entry_class(value, node)
    if capture.kernel_function(value) is not None:
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
                f"the entry {name!r} (line {node.lineno}) is bound to {capture.describe(value)} "
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


def _entry_class(value: Any, node: ast.ClassDef) -> type:
    """The notebook's class for a class entry, checked against the cell and the worker's contract."""
    call = next(
        item
        for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__call__"
    )
    if isinstance(call, ast.AsyncFunctionDef):
        raise PackagingError(
            f"the class entry {node.name!r} (line {node.lineno}) has `async def __call__` (line {call.lineno}); "
            "a GPU function entry must be a plain synchronous `def`"
        )
    cls = value if inspect.isclass(value) else getattr(value, "__wrapped__", None)
    if not inspect.isclass(cls) or cls.__name__ != node.name or not inspect.isfunction(vars(cls).get("__call__")):
        raise PackagingError(
            f"the notebook's {node.name!r} is not the class the cell defines on line {node.lineno}; "
            f"run the cell (so it defines {node.name!r}) before packaging it"
        )
    check_class_entry(cls, f" (line {node.lineno})")
    return cls


def package_cell(
    cell: str,
    namespace: Mapping[str, Any],
    *,
    entry: str | None = None,
    modules: Mapping[str, tuple[str, bytes]] | None = None,
    batched: bool = False,
) -> PackagedFunction:
    """Package a ``%%gpu_function`` cell.

    `cell` is the cell body after IPython's ``transform_cell`` (no ``%``
    syntax, no magic line); `namespace` is the user namespace *after* the
    cell ran (the entry must exist there: its annotations give the
    signature). `entry` selects the entry if it names a top-level ``def``
    (or class with ``__call__``) of the cell. `modules` (from
    ``local_modules.collect``) are the notebook's own modules to ship inside
    the artifact. `batched`: the entry takes a chunk's rows in one call
    (docs/ARCHITECTURE.md, "Batched functions").
    """
    try:
        tree = ast.parse(cell)
    except SyntaxError as error:
        raise PackagingError(
            f"the cell has a syntax error{f' on line {error.lineno}' if error.lineno else ''}: {error.msg}; "
            "fix it and run the cell again"
        ) from None
    entry_node = _choose_entry(_candidates(tree.body), entry)
    if isinstance(entry_node, ast.AsyncFunctionDef):
        raise PackagingError(
            f"the entry function {entry_node.name!r} (line {entry_node.lineno}) is "
            "`async def`; a GPU function entry must be a plain synchronous `def`"
        )
    entry_id: str = entry_node.name  # type: ignore[attr-defined]
    left_out = _left_out(tree.body, entry_id)
    kept = [
        node
        for node in tree.body
        if node not in left_out and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]

    code = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    found = capture.free_values(kept, code, namespace, lambda line: line, "the cell, the notebook")
    header = {name: capture.capture_line(name, value, where) for name, value, where in found}

    signature = infer_signature(_entry_object(namespace, entry_node), batched=batched)
    return capture.build_artifact(
        header,
        kept,
        [0] * len(kept),
        entry_id,
        signature,
        tuple(sorted(header)),
        code,
        modules,
        tuple((node.lineno, ast.get_source_segment(cell, node) or ast.unparse(node)) for node in left_out),
    )
