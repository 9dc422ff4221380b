"""`package_function`: one Python function (and same-module helpers/kernels it uses) as an artifact (pure)."""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.kernel.packaging import capture
from lancefn_jupyter.kernel.packaging.capture import PackagedFunction, PackagingError
from lancefn_jupyter.kernel.packaging.signature import check_class_entry, defines_call, infer_signature

if TYPE_CHECKING:
    from lancefn_jupyter.wire.models import FunctionSignature

# --------------------------------------------------------------------------
# package_function


def _is_gpu_function_decorator(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Name) and node.id == "gpu_function") or (
        isinstance(node, ast.Attribute) and node.attr == "gpu_function"
    )


def _definition(function: types.FunctionType, label: str) -> ast.stmt:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        raise PackagingError(
            f"the source of {label} {function.__qualname__!r} is not available "
            "(functions created by exec or typed at a plain REPL have none); define it "
            "in a notebook cell or a .py file"
        ) from None
    try:
        module = ast.parse(source)
    except SyntaxError:
        raise PackagingError(
            f"the source of {label} {function.__qualname__!r} cannot be parsed on its own "
            "(is it a lambda?); define it with a top-level `def`"
        ) from None
    matches = [
        node
        for node in module.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function.__name__
    ]
    if len(matches) != 1:
        raise PackagingError(
            f"the source of {label} {function.__qualname__!r} must contain exactly one "
            f"`def {function.__name__}`; define it with a plain top-level `def`"
        )
    return matches[0]


class _FunctionPackager:
    def __init__(self, module_globals: dict[str, Any]):
        self.module_globals = module_globals
        self.header: dict[str, str] = {}
        self.body: list[ast.stmt] = []
        self.offsets: list[int] = []
        self.helpers: list[str] = []
        self.visiting: set[str] = set()

    def artifact(self, name: str, signature: FunctionSignature) -> PackagedFunction:
        """The artifact of what was added, ``name`` its entry."""
        return capture.build_artifact(
            self.header, self.body, self.offsets, name, signature, tuple(sorted({*self.header, *self.helpers}))
        )

    def add(self, name: str, node: ast.stmt, offset: int, label: str) -> None:
        """Add the definition `node` of `name` (its first line is line ``offset + 1`` of its file)."""
        self.visiting.add(name)

        def file_line(line: int | None) -> int | None:
            return None if line is None else line + offset

        code = ast.unparse(node)
        scopes = f"{label} {name!r}'s module"

        def skip(ref: str) -> bool:  # asked per name: both grow as helpers are added
            return ref in self.header or ref in self.visiting

        for ref, value, where in capture.free_values([node], code, self.module_globals, file_line, scopes, skip):
            helper = self._local_helper(ref, value, where)
            if helper is not None:
                helper_function, helper_label = helper
                helper_node = _definition(helper_function, helper_label)
                if isinstance(helper_node, ast.AsyncFunctionDef):
                    raise PackagingError(
                        f"{helper_label} {ref!r}{where()} is `async def`, which cannot run "
                        "in a GPU function; make it a plain `def`"
                    )
                self.add(ref, helper_node, helper_function.__code__.co_firstlineno - 1, helper_label)
                self.helpers.append(ref)
            else:
                self.header[ref] = capture.capture_line(ref, value, where)
        self.body.append(node)
        self.offsets.append(offset)

    def _local_helper(self, name: str, value: Any, where: Callable[[], str]) -> tuple[types.FunctionType, str] | None:
        """A function/kernel of the same non-importable module, to include."""
        kernel = capture.kernel_function(value)
        if kernel is not None:
            function, label = kernel, "kernel"
        elif inspect.isfunction(value):
            function, label = inspect.unwrap(value), "helper function"
        else:
            return None
        if capture.importable_qualname(value) is not None:
            return None
        if not inspect.isfunction(function) or function.__name__ == "<lambda>":
            return None
        if function.__globals__ is not self.module_globals:
            return None
        if function.__code__.co_freevars:
            raise PackagingError(
                f"{label} {name!r}{where()} is a closure over "
                f"{', '.join(repr(v) for v in function.__code__.co_freevars)}; "
                "define it at the top level of the cell or module"
            )
        if function.__name__ != name:
            raise PackagingError(
                f"{name!r}{where()} is another name for {label} {function.__name__!r}; "
                f"call it as {function.__name__!r} or define `def {name}` in the cell"
            )
        return function, label


def _strip_decorators(node: ast.stmt, name: str, first_line: int) -> None:
    """Drop the entry's own ``@gpu_function``; refuse any other decorator (it would wrap the entry)."""
    for decorator in node.decorator_list:  # type: ignore[attr-defined]
        if not _is_gpu_function_decorator(decorator):
            raise PackagingError(
                f"the decorator @{ast.unparse(decorator)} on {name!r} "
                f"(line {first_line + decorator.lineno - 1}) cannot be "
                "packaged; remove it (only @gpu_function is allowed on the entry "
                "function) and apply it inside the function body instead"
            )
    node.decorator_list = []  # type: ignore[attr-defined]


def _package_class(cls: type, batched: bool) -> PackagedFunction:
    """A class entry (docs/ARCHITECTURE.md, "Warm state") from its source file: the class definition, with
    same-module helper functions and kernels its methods use, as for a function."""
    name = cls.__name__
    if cls.__qualname__ != name:
        raise PackagingError(f"the class {cls.__qualname__!r} is nested; define the class entry at the top level")
    if not defines_call(cls):
        raise PackagingError(
            f"gpu_function needs a function, or a class with `def __call__(self, …)`; {name!r} has no __call__"
        )
    check_class_entry(cls)
    signature = infer_signature(cls, batched=batched)
    try:
        lines, first_line = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        raise PackagingError(
            f"the source of class {name!r} is not available (a class defined in a notebook cell has none "
            "here): make the cell a %%gpu_function cell, or define the class in a .py file"
        ) from None
    matches = [
        node
        for node in ast.parse(textwrap.dedent("".join(lines))).body
        if isinstance(node, ast.ClassDef) and node.name == name
    ]
    if len(matches) != 1:
        raise PackagingError(f"the source of class {name!r} must contain exactly one `class {name}`")
    node = matches[0]
    _strip_decorators(node, name, first_line)
    module = sys.modules.get(cls.__module__)
    packager = _FunctionPackager(vars(module) if module is not None else {})
    packager.add(name, node, first_line - 1, "class")
    return packager.artifact(name, signature)


def package_function(fn: Callable[..., Any], *, batched: bool = False) -> PackagedFunction:
    """Snapshot one function (the ``gpu_function`` decorator's packaging).

    A plain module-level function without helpers gives exactly LanceDB's
    ``udf`` artifact. Functions and numba CUDA kernels it references that are
    defined in the same non-importable module (a notebook's ``__main__``) are
    included as definitions before it, recursively, in dependency order.
    A class with ``__call__`` is a class entry, packaged from its source file
    (``inspect.getsourcelines``), so in .py files only. ``batched``: the entry takes a chunk's
    rows in one call (docs/ARCHITECTURE.md, "Batched functions").
    """
    if inspect.isclass(fn):
        return _package_class(fn, batched)
    if not inspect.isfunction(fn):
        if capture.kernel_function(fn) is not None:
            raise PackagingError(
                f"{getattr(fn, '__name__', fn)!r} is a numba CUDA kernel; decorate a "
                "plain Python function that launches it instead"
            )
        raise PackagingError(
            f"gpu_function needs a plain Python function defined with `def`, got {capture.describe(fn)}"
        )
    name = fn.__name__
    if name == "<lambda>":
        raise PackagingError(
            "gpu_function cannot package a lambda; define the function with `def` "
            "and annotate its parameters and return type"
        )
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise PackagingError(f"{name!r} is `async def`; a GPU function must be a plain synchronous `def`")
    if fn.__code__.co_freevars:
        captured = ", ".join(repr(v) for v in fn.__code__.co_freevars)
        raise PackagingError(
            f"{name!r} is a closure over {captured} (it is defined inside another "
            "function); define it at the top level of the cell or module, and define "
            f"{captured} there too"
        )
    signature = infer_signature(fn, batched=batched)
    node = _definition(fn, "function")
    if isinstance(node, ast.AsyncFunctionDef):  # pragma: no cover - caught above
        raise PackagingError(f"{name!r} is `async def`; use a plain `def`")
    _strip_decorators(node, name, fn.__code__.co_firstlineno)
    packager = _FunctionPackager(fn.__globals__)
    packager.add(name, node, fn.__code__.co_firstlineno - 1, "function")
    return packager.artifact(name, signature)
