"""Package a notebook cell (or one Python function) as an immutable artifact.

This module is pure: it reads source text, a namespace mapping and function
objects, and returns bytes. It does no I/O and never imports IPython.

The artifact layout (docs/ARCHITECTURE.md, "Function versions"; byte-compatible with LanceDB's ``udf`` snapshot)::

    from __future__ import annotations
    <blank>
    import numpy as np                       # one line per captured name,
    from mylib import helper as helper       # sorted by name
    THRESHOLD = 0.5
    <blank>
    <the code, re-emitted with ast.unparse>
    <trailing newline>

With no captured names the header is followed by exactly one blank line, so a
plain module-level function without helpers is byte-for-byte LanceDB's layout::

    from __future__ import annotations\\n\\ndef f(value: float) -> float:\\n    return value / 100.0\\n

Decisions worth knowing
-----------------------
* **The cell is the module.** ``package_cell`` keeps every top-level statement
  of the cell in order (imports, assignments, ``@cuda.jit`` kernels, helpers,
  the entry function, classes, ``if``/``for`` blocks …) **except bare
  expression statements** such as ``double_all([1.0])`` or a trailing
  ``df.head()``: those are interactive display / trial calls and must not run
  when the worker imports the artifact. Module docstrings are expression
  statements too and are dropped. To keep a side-effecting call at import,
  bind it: ``_ = np.random.seed(0)``. ``from __future__`` imports of the cell
  are dropped (the header already enables postponed annotations).
* Statements are re-emitted with ``ast.unparse``, so comments, blank lines
  and formatting never change the digest; any code change does.
* Free names are found with :mod:`symtable` on the emitted text (Python's own
  scope analysis). Under ``from __future__ import annotations`` annotations
  are not runtime loads, so names used only in annotations are not captured.
  The analysis is flow-insensitive: a name the cell binds anywhere at module
  level counts as defined by the cell.
* A free name is resolved from the namespace first, then the builtins (like
  the interpreter). Builtins, and IPython's stand-ins for them (``open``,
  ``exit``, ``quit``, ``get_ipython``, ``display``), are never captured; the
  worker supplies ``display``/``get_ipython`` (ARCHITECTURE.md, "Names that
  resolve as builtins"). Module dunders (``__name__``, ``__file__``, …) are
  never captured; they refer to the artifact module's own attributes.
* Captured values: modules → ``import m as n``; a class/function importable
  from a real module (not ``__main__``, plain qualname, the module in
  ``sys.modules`` gives back the very same object) → ``from m import q as n``;
  literals — ``None``/bool/int/str/bytes/finite float and dict/list/tuple/
  set/frozenset of literals, dicts in insertion order, sets sorted — →
  ``n = <source>``, at most ``LITERAL_CAP_BYTES``. Anything else (a
  DataFrame, lambda, closure, a function or kernel from another cell, …) is
  refused with a :class:`PackagingError` that names the variable (or the
  path inside a container) and says to define it in the cell.
* Dynamic namespace access (``globals``, ``locals``, ``vars``, ``eval``,
  ``exec``, ``compile``, ``__import__``) and the namespace modules ``sys``,
  ``builtins``, ``importlib``, ``inspect``, ``gc``, ``ctypes``, ``types`` are
  refused: the artifact's namespace holds only what was packaged.
* Entry function (``package_cell``): ``entry`` if it names a top-level
  ``def`` of the cell (otherwise ``entry`` is ignored, because a Function
  name such as ``scores.v2`` need not be a Python identifier), else the only
  public top-level ``def``, else the last top-level ``def``.
* ``package_function`` snapshots one function the way LanceDB does, but
  functions and numba CUDA kernels it references that live in the same
  non-importable module (``__main__`` of a notebook) are included as
  definitions before the entry, in dependency order, decorators kept (so
  ``@cuda.jit`` is re-applied); the entry's own ``@gpu_function`` decorator
  is stripped and any other decorator on the entry is refused.
* ``line_map`` maps each artifact line that begins an AST node to the line of
  that node in the user's text: for ``package_cell`` lines of ``cell`` (1 =
  first line of the string passed in), for ``package_function`` lines of the
  function's source file (``co_firstlineno``-based). Header lines map to
  nothing.

Size: over 600 lines in four sections (capture of free names, cell packaging, function
packaging, signature inference) that share the AST helpers; the next split is a package along
those sections.
"""

from __future__ import annotations

import ast
import base64
import builtins
import hashlib
import inspect
import math
import re
import symtable
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from . import dataplane
from .local_modules import prelude_line
from .models import (
    FunctionArtifactContent,
    FunctionArtifactRequest,
    FunctionOutput,
    FunctionParameter,
    FunctionSignature,
    PythonAdapterSpec,
)

__all__ = [
    "PackagedFunction",
    "PackagingError",
    "entry_name",
    "infer_signature",
    "package_cell",
    "package_function",
]

_HEADER = "from __future__ import annotations"

_DYNAMIC_NAMESPACE_ACCESS = frozenset(
    {"globals", "locals", "vars", "eval", "exec", "compile", "__import__"}
)
_NAMESPACE_MODULES = frozenset(
    {"sys", "builtins", "importlib", "inspect", "gc", "ctypes", "types"}
)
# Names IPython injects into `builtins` while a cell runs that do not exist in
# the worker, so they are not treated as builtins.
_IPYTHON_INJECTED = frozenset({"__IPYTHON__", "__IPYTHON__active", "dreload"})
# IPython's stand-ins for builtins (user namespace: `open`, `exit`, `quit`,
# `get_ipython`; builtins: `display`). They resolve as builtins in the
# artifact; the worker provides `display` and `get_ipython` (ARCHITECTURE.md
# "Names that resolve as builtins").
_IPYTHON_STAND_INS = frozenset({"open", "exit", "quit", "display", "get_ipython"})
# While a cell runs IPython hides `exit`/`quit` from builtins, and this module may be imported then.
_BUILTIN_NAMES = (frozenset(dir(builtins)) - _IPYTHON_INJECTED) | _IPYTHON_STAND_INS
# `!cmd` and `%magic` lines become these calls on get_ipython() (transform_cell).
_SHELL_CALLS = frozenset({"system", "getoutput", "run_line_magic", "run_cell_magic"})
# Captured literals larger than this are refused: they would bloat every version.
LITERAL_CAP_BYTES = 64 * 1024
_LITERAL_DEPTH = 100
# Module attributes every module has; they mean the artifact module's own.
_MODULE_DUNDERS = frozenset(
    {
        "__name__",
        "__doc__",
        "__file__",
        "__spec__",
        "__loader__",
        "__package__",
        "__builtins__",
        "__cached__",
        "__annotations__",
        "__dict__",
    }
)
_SUPPORTED_TYPES = (
    "int, float, str, bool, bytes, list[T] (nested lists allowed), "
    + dataplane.SUPPORTED_ANNOTATIONS
    + ", and Optional[T] / T | None for nullable parameters"
)
_DEFINE_IT = "define it in the cell (or import it from an installed module)"
_MISSING = object()


class PackagingError(ValueError):
    """The cell or function cannot be packaged; the message says how to fix it."""


@dataclass(frozen=True)
class PackagedFunction:
    """An immutable artifact: source bytes, digest, entry point and signature."""

    source: bytes
    digest: str
    entrypoint: str
    signature: FunctionSignature
    line_map: Mapping[int, int] = field(compare=False, repr=False)
    captured: tuple[str, ...] = ()
    local_modules: tuple[str, ...] = ()  # module names shipped inside the artifact (local_modules.py)

    @property
    def source_text(self) -> str:
        return self.source.decode("utf-8")

    def user_line(self, artifact_line: int) -> Optional[int]:
        """The user's line for a line of the artifact (e.g. from a traceback)."""
        return self.line_map.get(artifact_line)

    def artifact_request(self) -> FunctionArtifactRequest:
        return FunctionArtifactRequest(
            kind="python_callable",
            digest=self.digest,
            entrypoint=self.entrypoint,
            content=FunctionArtifactContent(
                encoding="base64", data=base64.b64encode(self.source).decode("ascii")
            ),
            adapter=PythonAdapterSpec(kind="scalar_to_arrow_batch", version=1),
        )


# --------------------------------------------------------------------------
# shared helpers


def _assemble(header_lines: list[str], code: str) -> tuple[str, int]:
    """The artifact text and the artifact line on which `code` starts."""
    parts = [_HEADER]
    if header_lines:
        parts.extend(["", *header_lines])
    parts.extend(["", code, ""])
    first_code_line = 3 + (len(header_lines) + 1 if header_lines else 0)
    return "\n".join(parts), first_code_line


def _scope_names(code: str) -> tuple[set[str], set[str]]:
    """(names loaded from module scope anywhere, names bound at module scope).

    Runs symtable on the text exactly as it ships (after the header), so
    postponed annotations are not counted as loads."""
    try:
        table = symtable.symtable(f"{_HEADER}\n\n{code}\n", "<gpu_function>", "exec")
    except SyntaxError as error:
        raise PackagingError(
            f"the code cannot be compiled as a module: {error.msg}; fix it so the cell "
            "runs as a plain Python file"
        ) from None
    loaded: set[str] = set()
    bound: set[str] = set()
    for symbol in table.get_symbols():
        if symbol.is_referenced() or symbol.is_declared_global():
            loaded.add(symbol.get_name())
        if symbol.is_assigned() or symbol.is_imported():
            bound.add(symbol.get_name())
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        for symbol in child.get_symbols():
            if symbol.is_global() and (
                symbol.is_referenced() or symbol.is_declared_global()
            ):
                loaded.add(symbol.get_name())
        stack.extend(child.get_children())
    return loaded, bound


def _first_use(nodes: list[ast.AST], name: str) -> Optional[int]:
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and node.id == name:
                return node.lineno
            if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                return node.lineno
    return None


def _at(line: Optional[int]) -> str:
    return f" (line {line})" if line is not None else ""


_NAMESPACE_IMPORT_HINT = re.compile(
    r"^[ \t]*(?:import|from)[ \t][^\n]*\b(?:" + "|".join(sorted(_NAMESPACE_MODULES)) + r")\b",
    re.MULTILINE,
)


def _namespace_imports(nodes: list[ast.AST], code: str) -> list[tuple[str, int]]:
    if not _NAMESPACE_IMPORT_HINT.search(code):  # cheap pre-filter on the unparsed text
        return []
    found = []  # type: ignore[var-annotated]
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                found.extend(
                    (alias.name, node.lineno)
                    for alias in node.names
                    if alias.name.split(".")[0] in _NAMESPACE_MODULES
                )
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] in _NAMESPACE_MODULES:
                    found.append((node.module, node.lineno))
    return found


def _refuse_dynamic(
    free: set[str],
    nodes: list[ast.AST],
    code: str,
    line_of: Callable[[Optional[int]], Optional[int]],
) -> None:
    dynamic = sorted(free & _DYNAMIC_NAMESPACE_ACCESS)
    if dynamic:
        name = dynamic[0]
        raise PackagingError(
            f"{name}(){_at(line_of(_first_use(nodes, name)))} is dynamic namespace access, "
            "which cannot be packaged: the function version only contains the names it "
            f"was packaged with. Remove {name}() and refer to variables directly "
            "(define them in the cell or pass them as parameters)."
        )
    imports = _namespace_imports(nodes, code)
    if imports:
        module, line = imports[0]
        raise PackagingError(
            f"'import {module}'{_at(line_of(line))} gives dynamic access to namespaces "
            "(modules, frames, objects), which cannot be packaged into a function version. "
            f"Remove the import of {module!r} and import the modules you need directly."
        )


class _NotLiteral(Exception):
    """`path` (e.g. ``['model'][0]``) inside a container is not a literal."""

    def __init__(self, path: str, value: Any, why: str = ""):
        super().__init__(path)
        self.path, self.value, self.why = path, value, why


def _literal_text(value: Any, path: str, depth: int) -> str:
    """Python source that evaluates to `value`; containers recursively, sets sorted by
    their elements' source and dicts in insertion order, so equal values give equal text."""
    if depth > _LITERAL_DEPTH:
        raise _NotLiteral(path, value, f"nested more than {_LITERAL_DEPTH} levels deep (or contains itself)")
    kind = type(value)
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is float:
        if not math.isfinite(value):
            raise _NotLiteral(path, value)
        return repr(value)
    if kind is tuple or kind is list:
        items = [_literal_text(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        if kind is list:
            return f"[{', '.join(items)}]"
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if kind is dict:
        pairs = [
            f"{_literal_text(k, f'{path}.keys()', depth + 1)}: {_literal_text(v, f'{path}[{k!r}]', depth + 1)}"
            for k, v in value.items()
        ]
        return f"{{{', '.join(pairs)}}}"
    if kind is set or kind is frozenset:
        items = sorted(_literal_text(v, f"{path}{{…}}", depth + 1) for v in value)
        if kind is set:
            return f"{{{', '.join(items)}}}" if items else "set()"
        return f"frozenset({{{', '.join(items)}}})" if items else "frozenset()"
    raise _NotLiteral(path, value)


def _literal_source(value: Any) -> Optional[str]:
    try:
        return _literal_text(value, "", 0)
    except _NotLiteral:
        return None


def _importable_qualname(value: Any) -> Optional[str]:
    """`from m import q` if `value` can be re-imported as exactly itself."""
    module_name = getattr(value, "__module__", None)
    try:
        qualname = getattr(value, "__qualname__", None)
    except Exception:  # pragma: no cover - exotic descriptors
        return None
    if (
        not isinstance(module_name, str)
        or not isinstance(qualname, str)
        or module_name == "__main__"
        or "." in qualname
        or "<" in qualname
    ):
        return None
    module = sys.modules.get(module_name)
    if module is None or getattr(module, qualname, _MISSING) is not value:
        return None
    return f"from {module_name} import {qualname}"


def _kernel_function(value: Any) -> Optional[types.FunctionType]:
    """The Python function behind a numba (CUDA) dispatcher, if `value` is one."""
    if inspect.isfunction(value):
        return None
    try:
        py_func = getattr(value, "py_func", None)
    except Exception:  # pragma: no cover
        return None
    return py_func if inspect.isfunction(py_func) else None


def _describe(value: Any) -> str:
    if inspect.isfunction(value):
        if value.__name__ == "<lambda>":
            return "a lambda"
        if value.__code__.co_freevars or "<locals>" in value.__qualname__:
            return "a closure (a function defined inside another function)"
        if value.__module__ == "__main__":
            return "a function defined in another cell"
        return f"a function of module {value.__module__!r} that cannot be re-imported"
    if _kernel_function(value) is not None:
        return "a numba CUDA kernel defined outside the cell"
    if isinstance(value, type):
        if value.__module__ == "__main__":
            return "a class defined in another cell"
        return f"a class of module {value.__module__!r} that cannot be re-imported"
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__!r}, which is not importable under that name"
    if type(value) is float:
        return f"a non-finite float ({value!r})"
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _capture_line(name: str, value: Any, where: Callable[[], str]) -> str:
    """One header line that rebinds `name` to `value` in the artifact."""
    if isinstance(value, types.ModuleType):
        if value.__name__.split(".")[0] in _NAMESPACE_MODULES:
            raise PackagingError(
                f"{name!r}{where()} is the module {value.__name__!r}, which gives dynamic "
                "access to namespaces and cannot be packaged into a function version; "
                "import the modules you need directly instead"
            )
        if sys.modules.get(value.__name__) is value:
            return f"import {value.__name__} as {name}"
    else:
        imported = _importable_qualname(value)
        if imported is not None:
            return f"{imported} as {name}"
        try:
            literal = _literal_text(value, "", 0)
        except _NotLiteral as error:
            if error.path:
                what = f"'{name}{error.path}'"
                raise PackagingError(
                    f"the function uses {name!r}{where()} from the notebook, but {what} is "
                    f"{error.why or _describe(error.value)}, which cannot be packaged into a "
                    f"function version; {_DEFINE_IT}. {_CAPTURED_KINDS}"
                ) from None
        else:
            line = f"{name} = {literal}"
            size = len(line.encode("utf-8"))
            if size > LITERAL_CAP_BYTES:
                raise PackagingError(
                    f"{name!r}{where()} is a literal of {size / 1024:.1f} KiB; captured literals "
                    f"are capped at {LITERAL_CAP_BYTES // 1024} KiB to keep function versions "
                    "small: read the data inside the function (e.g. from a file) or pass it "
                    "as a parameter"
                )
            return line
    raise PackagingError(
        f"the function uses {name!r}{where()} from the notebook, but {name!r} is "
        f"{_describe(value)}, which cannot be packaged into a function version; "
        f"{_DEFINE_IT}. {_CAPTURED_KINDS}"
    )


_CAPTURED_KINDS = (
    "Only modules, importable classes/functions and literals (None/bool/int/float/str/"
    "bytes, and dict/list/set/frozenset/tuple of literals) are captured."
)


def _resolves_as_builtin(name: str, value: Any) -> bool:
    """Whether free `name` (bound to `value` in the namespace, or `_MISSING`) is the
    builtin of that name, or IPython's stand-in for it, rather than a notebook value."""
    if name not in _BUILTIN_NAMES:
        return False
    if value is _MISSING or value is getattr(builtins, name, _MISSING):
        return True
    if name not in _IPYTHON_STAND_INS:
        return False
    if getattr(value, "__wrapped__", None) is getattr(builtins, name, _MISSING):
        return True  # IPython's `open` wraps io.open
    owner = getattr(value, "__self__", value)  # get_ipython is a bound method of the shell
    module = getattr(owner, "__module__", None) or type(owner).__module__
    return isinstance(module, str) and module.split(".")[0] in ("IPython", "ipykernel")


def _refuse_shell_syntax(nodes: list[ast.AST], line_of: Callable[[Optional[int]], Optional[int]]) -> None:
    for top in nodes:
        for node in ast.walk(top):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _SHELL_CALLS
                and isinstance(node.func.value, ast.Call)
                and isinstance(node.func.value.func, ast.Name)
                and node.func.value.func.id == "get_ipython"
            ):
                raise PackagingError(
                    f"shell and magic syntax (`!cmd`, `%magic`){_at(line_of(node.lineno))} "
                    "needs IPython, which the worker does not have; use subprocess.run([...]) "
                    "or plain Python instead"
                )


_NESTED_FIELDS = ("decorator_list", "body", "handlers", "orelse", "finalbody", "cases")


def _line_starts(node: ast.AST) -> list[ast.AST]:
    """The children of `node` that can begin a line of ``ast.unparse`` output:
    decorators, statements, ``except`` handlers and ``case`` clauses
    (unparse writes every other expression on its statement's line)."""
    children: list[ast.AST] = []
    for name in _NESTED_FIELDS:
        value = getattr(node, name, None)
        if value:
            children.extend(value)
    return children


def _line_map(
    code: str,
    originals: list[ast.stmt],
    offsets: list[int],
    first_code_line: int,
) -> dict[int, int]:
    """Re-parse the emitted code and walk it in parallel with the original
    statements (``ast.unparse`` round-trips the structure), mapping each
    artifact line that begins a node to the node's line in the user's text."""
    emitted = ast.parse(code).body
    result: dict[int, int] = {}
    if len(emitted) != len(originals):  # pragma: no cover - unparse round-trips
        return result
    shift = first_code_line - 1
    stack = list(zip(reversed(emitted), reversed(originals), reversed(offsets), strict=False))
    while stack:
        new, old, offset = stack.pop()
        new_line = getattr(new, "lineno", None)
        old_line = getattr(old, "lineno", None)
        if new_line is not None and old_line is not None:
            result.setdefault(new_line + shift, old_line + offset)
        new_children = _line_starts(new)
        old_children = _line_starts(old)
        if len(new_children) != len(old_children):  # pragma: no cover
            continue
        for new_child, old_child in zip(reversed(new_children), reversed(old_children), strict=True):
            if type(new_child) is type(old_child):
                stack.append((new_child, old_child, offset))  # type: ignore[arg-type]
    return result


def _finish(
    header: dict[str, str],
    body: list[ast.stmt],
    offsets: list[int],
    entrypoint: str,
    signature: FunctionSignature,
    captured: tuple[str, ...],
    code: Optional[str] = None,
    modules: Optional[Mapping[str, tuple[str, bytes]]] = None,
) -> PackagedFunction:
    if code is None:
        code = ast.unparse(ast.Module(body=body, type_ignores=[]))
    header_lines = [header[name] for name in sorted(header)]
    if modules:  # first, so the captured imports below already find them; absent otherwise (same bytes)
        header_lines.insert(0, prelude_line(modules))
    text, first_code_line = _assemble(header_lines, code)
    source = text.encode("utf-8")
    return PackagedFunction(
        source=source,
        digest=f"sha256:{hashlib.sha256(source).hexdigest()}",
        entrypoint=entrypoint,
        signature=signature,
        line_map=types.MappingProxyType(_line_map(code, body, offsets, first_code_line)),
        captured=captured,
        local_modules=tuple(sorted(modules or ())),
    )


# --------------------------------------------------------------------------
# package_cell


def _choose_entry(defs: list[ast.stmt], entry: Optional[str]) -> ast.stmt:
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


def entry_name(cell: str, entry: Optional[str] = None) -> Optional[str]:
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
    value = namespace.get(name, _MISSING)
    if value is _MISSING:
        raise PackagingError(
            f"the entry function {name!r} (line {node.lineno}) is not defined in the "
            "notebook yet; run the cell first, then package it"
        )
    if _kernel_function(value) is not None:
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
                f"the entry {name!r} (line {node.lineno}) is bound to {_describe(value)} "
                "in the notebook, not to the function the cell defines; run the cell again"
            )
    arguments = node.args  # type: ignore[attr-defined]
    cell_params = [
        a.arg
        for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)
    ]
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
    entry: Optional[str] = None,
    modules: Optional[Mapping[str, tuple[str, bytes]]] = None,
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
        if not isinstance(node, ast.Expr)
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
    ]
    defs = [node for node in kept if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    entry_node = _choose_entry(defs, entry)  # type: ignore[arg-type]
    if isinstance(entry_node, ast.AsyncFunctionDef):
        raise PackagingError(
            f"the entry function {entry_node.name!r} (line {entry_node.lineno}) is "
            "`async def`; a GPU function entry must be a plain synchronous `def`"
        )

    code = ast.unparse(ast.Module(body=kept, type_ignores=[]))
    loaded, bound = _scope_names(code)
    free = loaded - bound

    def same(line: Optional[int]) -> Optional[int]:
        return line

    _refuse_dynamic(free, kept, code, same)  # type: ignore[arg-type]
    if "get_ipython" in free:
        _refuse_shell_syntax(kept, same)  # type: ignore[arg-type]

    header: dict[str, str] = {}
    for name in sorted(free):
        if name in _MODULE_DUNDERS:
            continue
        value = namespace.get(name, _MISSING)
        if _resolves_as_builtin(name, value):
            continue
        if value is _MISSING or name in _IPYTHON_INJECTED:
            raise _undefined(name, _first_use(kept, name), "the cell, the notebook")  # type: ignore[arg-type]
        header[name] = _capture_line(
            name, value, lambda name=name: _at(_first_use(kept, name))  # type: ignore[arg-type, misc]
        )

    function = _entry_object(namespace, entry_node)
    signature = infer_signature(function)
    return _finish(
        header, kept, [0] * len(kept), entry_node.name, signature, tuple(sorted(header)), code, modules  # type: ignore[attr-defined]
    )


def _undefined(name: str, line: Optional[int], scopes: str) -> PackagingError:
    if name in _IPYTHON_INJECTED:
        return PackagingError(
            f"name {name!r}{_at(line)} is provided by IPython and does not exist where "
            "the function runs; remove it"
        )
    return PackagingError(
        f"name {name!r}{_at(line)} is not defined: it is not defined in {scopes}, "
        f"or as a Python builtin; {_DEFINE_IT}"
    )


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
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name == function.__name__
    ]
    if len(matches) != 1:
        raise PackagingError(
            f"the source of {label} {function.__qualname__!r} must contain exactly one "
            f"`def {function.__name__}`; define it with a plain top-level `def`"
        )
    return matches[0]


class _FunctionPackager:
    def __init__(self, entry: types.FunctionType):
        self.entry = entry
        self.module_globals = entry.__globals__
        self.header: dict[str, str] = {}
        self.body: list[ast.stmt] = []
        self.offsets: list[int] = []
        self.helpers: list[str] = []
        self.visiting: set[str] = set()

    def add(self, function: types.FunctionType, node: ast.stmt, label: str) -> None:
        name = function.__name__
        self.visiting.add(name)
        offset = function.__code__.co_firstlineno - 1

        def file_line(line: Optional[int]) -> Optional[int]:
            return None if line is None else line + offset

        code = ast.unparse(node)
        loaded, bound = _scope_names(code)
        free = loaded - bound
        _refuse_dynamic(free, [node], code, file_line)
        if "get_ipython" in free:
            _refuse_shell_syntax([node], file_line)
        for ref in sorted(free):
            if ref in _MODULE_DUNDERS or ref in self.header or ref in self.visiting:
                continue

            def where(ref: str = ref) -> str:
                return _at(file_line(_first_use([node], ref)))

            value = self.module_globals.get(ref, _MISSING)
            if _resolves_as_builtin(ref, value):
                continue
            if value is _MISSING or ref in _IPYTHON_INJECTED:
                raise _undefined(
                    ref, file_line(_first_use([node], ref)), f"{label} {name!r}'s module"
                )
            helper = self._local_helper(ref, value, where)
            if helper is not None:
                helper_function, helper_label = helper
                helper_node = _definition(helper_function, helper_label)
                if isinstance(helper_node, ast.AsyncFunctionDef):
                    raise PackagingError(
                        f"{helper_label} {ref!r}{where()} is `async def`, which cannot run "
                        "in a GPU function; make it a plain `def`"
                    )
                self.add(helper_function, helper_node, helper_label)
                self.helpers.append(ref)
            else:
                self.header[ref] = _capture_line(ref, value, where)
        self.body.append(node)
        self.offsets.append(offset)

    def _local_helper(
        self, name: str, value: Any, where: Callable[[], str]
    ) -> Optional[tuple[types.FunctionType, str]]:
        """A function/kernel of the same non-importable module, to include."""
        kernel = _kernel_function(value)
        if kernel is not None:
            function, label = kernel, "kernel"
        elif inspect.isfunction(value):
            function, label = inspect.unwrap(value), "helper function"
        else:
            return None
        if _importable_qualname(value) is not None:
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


def package_function(fn: Callable[..., Any]) -> PackagedFunction:
    """Snapshot one function (the ``gpu_function`` decorator's packaging).

    A plain module-level function without helpers gives exactly LanceDB's
    ``udf`` artifact. Functions and numba CUDA kernels it references that are
    defined in the same non-importable module (a notebook's ``__main__``) are
    included as definitions before it, recursively, in dependency order.
    """
    if not inspect.isfunction(fn):
        if _kernel_function(fn) is not None:
            raise PackagingError(
                f"{getattr(fn, '__name__', fn)!r} is a numba CUDA kernel; decorate a "
                "plain Python function that launches it instead"
            )
        raise PackagingError(
            f"gpu_function needs a plain Python function defined with `def`, got "
            f"{_describe(fn)}"
        )
    name = fn.__name__
    if name == "<lambda>":
        raise PackagingError(
            "gpu_function cannot package a lambda; define the function with `def` "
            "and annotate its parameters and return type"
        )
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise PackagingError(
            f"{name!r} is `async def`; a GPU function must be a plain synchronous `def`"
        )
    if fn.__code__.co_freevars:
        captured = ", ".join(repr(v) for v in fn.__code__.co_freevars)
        raise PackagingError(
            f"{name!r} is a closure over {captured} (it is defined inside another "
            "function); define it at the top level of the cell or module, and define "
            f"{captured} there too"
        )
    signature = infer_signature(fn)
    node = _definition(fn, "function")
    if isinstance(node, ast.AsyncFunctionDef):  # pragma: no cover - caught above
        raise PackagingError(f"{name!r} is `async def`; use a plain `def`")
    for decorator in node.decorator_list:  # type: ignore[attr-defined]
        if not _is_gpu_function_decorator(decorator):
            raise PackagingError(
                f"the decorator @{ast.unparse(decorator)} on {name!r} "
                f"(line {fn.__code__.co_firstlineno + decorator.lineno - 1}) cannot be "
                "packaged; remove it (only @gpu_function is allowed on the entry "
                "function) and apply it inside the function body instead"
            )
    node.decorator_list = []  # type: ignore[attr-defined]
    packager = _FunctionPackager(fn)
    packager.add(fn, node, "function")
    return _finish(
        packager.header,
        packager.body,
        packager.offsets,
        name,
        signature,
        tuple(sorted({*packager.header, *packager.helpers})),
    )


# --------------------------------------------------------------------------
# signature inference


class _Unsupported(Exception):
    pass


def _arrow_type(annotation: Any) -> tuple[str, bool]:
    origin = typing.get_origin(annotation)
    union_type = getattr(types, "UnionType", None)
    if origin is typing.Union or (union_type is not None and origin is union_type):
        arguments = typing.get_args(annotation)
        non_none = [a for a in arguments if a is not type(None)]
        if len(non_none) != 1 or len(non_none) == len(arguments):
            raise _Unsupported(f"the union {_type_text(annotation)}")
        inner, _ = _arrow_type(non_none[0])
        return inner, True
    if annotation is bool:
        return "bool", False
    if annotation is int:
        return "int64", False
    if annotation is float:
        return "float64", False
    if annotation is str:
        return "utf8", False
    if annotation is bytes:
        return "binary", False
    if annotation is list or origin is list:
        arguments = typing.get_args(annotation)
        if len(arguments) != 1:
            raise _Unsupported("a list without its element type (write e.g. list[float])")
        item, item_nullable = _arrow_type(arguments[0])
        if item_nullable:
            raise _Unsupported("a list with nullable elements")
        if dataplane.is_data_type(item):
            raise _Unsupported(f"a list of {_type_text(arguments[0])} (use map() for one array per call)")
        return f"list<{item}>", False
    try:  # numpy / pyarrow annotations: the Arrow data plane's types
        data_type = dataplane.annotation_type(annotation)
    except dataplane.UnsupportedAnnotation as error:
        raise _Unsupported(str(error)) from None
    if data_type is not None:
        return data_type, False
    raise _Unsupported(_type_text(annotation))


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _type_hints(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    module_globals = getattr(fn, "__globals__", {})
    for key, annotation in getattr(fn, "__annotations__", {}).items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(module_globals))  # noqa: S307
            except Exception as error:
                what = "the return type" if key == "return" else f"parameter {key!r}"
                raise PackagingError(
                    f"the annotation {annotation!r} of {what} of {name} cannot be "
                    f"resolved ({error}); use one of the supported types: {_SUPPORTED_TYPES}"
                ) from None
        hints[key] = annotation
    return hints


def infer_signature(fn: Callable[..., Any]) -> FunctionSignature:
    """The Function signature from `fn`'s annotations (docs/ARCHITECTURE.md, "Function versions")."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise PackagingError(f"cannot read the signature of {name}; define it with `def`") from None
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            raise PackagingError(
                f"parameter '*{parameter.name}' of {name}: a GPU function takes one value "
                "per named parameter; replace *args with named, annotated parameters "
                f"(supported types: {_SUPPORTED_TYPES})"
            )
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            raise PackagingError(
                f"parameter '**{parameter.name}' of {name}: a GPU function takes one value "
                "per named parameter; replace **kwargs with named, annotated parameters "
                f"(supported types: {_SUPPORTED_TYPES})"
            )
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise PackagingError(
                f"parameter {parameter.name!r} of {name} is positional-only; rows are "
                "passed by parameter name, so remove the `/` from the signature"
            )
        if parameter.default is not inspect.Parameter.empty and (
            _literal_source(parameter.default) is None
        ):
            raise PackagingError(
                f"parameter {parameter.name!r} of {name} has a default that is not a literal "
                f"({_describe(parameter.default)}); a default must be a literal such as None, "
                "a number, a string or a tuple/list/dict of them: use `= None` and compute "
                "the value inside the function"
            )
    hints = _type_hints(fn, name)
    missing = [p.name for p in parameters if p.name not in hints]
    if missing or "return" not in hints:
        parts = []
        if missing:
            noun = "parameter" if len(missing) == 1 else "parameters"
            listed = ", ".join(repr(m) for m in missing)
            parts.append(f"annotate {noun} {listed} of {name}, e.g. `{missing[0]}: float`")
        if "return" not in hints:
            parts.append(
                ("and its" if parts else "annotate the") + " return type"
                + ("" if parts else f" of {name}")
                + " (e.g. `-> float`)"
            )
        raise PackagingError(
            "a GPU function needs type annotations to infer its signature: "
            + ", ".join(parts)
            + f". Supported types: {_SUPPORTED_TYPES}."
        )
    inputs = []
    for parameter in parameters:
        try:
            arrow_type, nullable = _arrow_type(hints[parameter.name])
        except _Unsupported as error:
            raise PackagingError(
                f"parameter {parameter.name!r} of {name} has an unsupported type ({error}); "
                f"supported types: {_SUPPORTED_TYPES}"
            ) from None
        default = None
        if parameter.default is not inspect.Parameter.empty:
            default = _literal_source(parameter.default)  # an optional input (models.py)
        inputs.append(
            FunctionParameter(
                name=parameter.name, arrow_type=arrow_type, nullable=nullable, default=default
            )
        )
    try:
        output_type, output_nullable = _arrow_type(hints["return"])
    except _Unsupported as error:
        raise PackagingError(
            f"the return type of {name} is unsupported ({error}); supported types: "
            f"{_SUPPORTED_TYPES} (the return value cannot be None)"
        ) from None
    if output_nullable:
        raise PackagingError(
            f"the return type of {name} is nullable ({_type_text(hints['return'])}); "
            "a GPU function must always return a value: remove Optional / `| None` "
            "from the return annotation"
        )
    return FunctionSignature(
        inputs=tuple(inputs),
        output=FunctionOutput(kind="scalar", arrow_type=output_type, nullable=False),
    )
