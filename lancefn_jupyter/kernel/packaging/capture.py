"""Shared by the packagers: the artifact value (`PackagedFunction`), `PackagingError`, and the capture of
free names (namespace lookups turned into import or literal lines, refusals that name the variable), the
refusal of dynamic namespace access and shell syntax, and the artifact-to-user line map (pure)."""

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
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from lancefn_jupyter.kernel.local_modules import prelude_line
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import (
    FunctionArtifactContent,
    FunctionArtifactRequest,
    FunctionSignature,
    PythonAdapterSpec,
)

_HEADER = "from __future__ import annotations"

_DYNAMIC_NAMESPACE_ACCESS = frozenset({"globals", "locals", "vars", "eval", "exec", "compile", "__import__"})
_NAMESPACE_MODULES = frozenset({"sys", "builtins", "importlib", "inspect", "gc", "ctypes", "types"})
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
SUPPORTED_TYPES = (
    "int, float, str, bool, bytes, list[T] (nested lists allowed), "
    + dataplane.SUPPORTED_ANNOTATIONS
    + ", and Optional[T] / T | None for nullable parameters"
)
_DEFINE_IT = "define it in the cell (or import it from an installed module)"
MISSING = object()  # "not in the namespace" (None is a value a name can have)


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
    # The cell's statements not in the artifact, as (user line, source text): its trailing expression and
    # trial calls of the entry (package_cell); they do not change the artifact, so not its identity either.
    left_out: tuple[tuple[int, str], ...] = field(default=(), compare=False)

    @property
    def source_text(self) -> str:
        return self.source.decode("utf-8")

    @cached_property
    def _entry_node(self) -> ast.stmt | None:
        # Read from the artifact, so a version looked up from the control plane knows its entry's form too.
        tree = ast.parse(self.source_text)
        named = [
            node
            for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == self.entrypoint
        ]
        return named[-1] if named else None

    @property
    def entry_is_class(self) -> bool:
        """The entry is a class (docs/ARCHITECTURE.md, "Warm state": instantiated, ``setup()``, ``__call__``)."""
        return isinstance(self._entry_node, ast.ClassDef)

    @property
    def entry_has_setup(self) -> bool:
        """A class entry that defines ``setup`` in its body."""
        node = self._entry_node
        return isinstance(node, ast.ClassDef) and any(
            isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "setup" for item in node.body
        )

    def user_line(self, artifact_line: int) -> int | None:
        """The user's line for a line of the artifact (e.g. from a traceback)."""
        return self.line_map.get(artifact_line)

    def artifact_request(self) -> FunctionArtifactRequest:
        return FunctionArtifactRequest(
            kind="python_callable",
            digest=self.digest,
            entrypoint=self.entrypoint,
            content=FunctionArtifactContent(encoding="base64", data=base64.b64encode(self.source).decode("ascii")),
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
            f"the code cannot be compiled as a module: {error.msg}; fix it so the cell runs as a plain Python file"
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
            if symbol.is_global() and (symbol.is_referenced() or symbol.is_declared_global()):
                loaded.add(symbol.get_name())
        stack.extend(child.get_children())
    return loaded, bound


def _first_use(nodes: list[ast.AST], name: str) -> int | None:
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name) and node.id == name:
                return node.lineno
            if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                return node.lineno
    return None


def _at(line: int | None) -> str:
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
                    (alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] in _NAMESPACE_MODULES
                )
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.level == 0
                and node.module.split(".")[0] in _NAMESPACE_MODULES
            ):
                found.append((node.module, node.lineno))
    return found


def _refuse_dynamic(
    free: set[str],
    nodes: list[ast.AST],
    code: str,
    line_of: Callable[[int | None], int | None],
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


def literal_source(value: Any) -> str | None:
    try:
        return _literal_text(value, "", 0)
    except _NotLiteral:
        return None


def importable_qualname(value: Any) -> str | None:
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
    if module is None or getattr(module, qualname, MISSING) is not value:
        return None
    return f"from {module_name} import {qualname}"


def kernel_function(value: Any) -> types.FunctionType | None:
    """The Python function behind a numba (CUDA) dispatcher, if `value` is one."""
    if inspect.isfunction(value):
        return None
    try:
        py_func = getattr(value, "py_func", None)
    except Exception:  # pragma: no cover
        return None
    return py_func if inspect.isfunction(py_func) else None


def describe(value: Any) -> str:
    """What `value` is, for a refusal message ("a lambda", "a pandas.core.frame.DataFrame")."""
    if inspect.isfunction(value):
        if value.__name__ == "<lambda>":
            return "a lambda"
        if value.__code__.co_freevars or "<locals>" in value.__qualname__:
            return "a closure (a function defined inside another function)"
        if value.__module__ == "__main__":
            return "a function defined in another cell"
        return f"a function of module {value.__module__!r} that cannot be re-imported"
    if kernel_function(value) is not None:
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


def capture_line(name: str, value: Any, where: Callable[[], str]) -> str:
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
        imported = importable_qualname(value)
        if imported is not None:
            return f"{imported} as {name}"
        try:
            literal = _literal_text(value, "", 0)
        except _NotLiteral as error:
            if error.path:
                what = f"'{name}{error.path}'"
                raise PackagingError(
                    f"the function uses {name!r}{where()} from the notebook, but {what} is "
                    f"{error.why or describe(error.value)}, which cannot be packaged into a "
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
        f"{describe(value)}, which cannot be packaged into a function version; "
        f"{_DEFINE_IT}. {_CAPTURED_KINDS}"
    )


_CAPTURED_KINDS = (
    "Only modules, importable classes/functions and literals (None/bool/int/float/str/"
    "bytes, and dict/list/set/frozenset/tuple of literals) are captured."
)


def _resolves_as_builtin(name: str, value: Any) -> bool:
    """Whether free `name` (bound to `value` in the namespace, or `MISSING`) is the
    builtin of that name, or IPython's stand-in for it, rather than a notebook value."""
    if name not in _BUILTIN_NAMES:
        return False
    if value is MISSING or value is getattr(builtins, name, MISSING):
        return True
    if name not in _IPYTHON_STAND_INS:
        return False
    if getattr(value, "__wrapped__", None) is getattr(builtins, name, MISSING):
        return True  # IPython's `open` wraps io.open
    owner = getattr(value, "__self__", value)  # get_ipython is a bound method of the shell
    module = getattr(owner, "__module__", None) or type(owner).__module__
    return isinstance(module, str) and module.split(".")[0] in ("IPython", "ipykernel")


def _refuse_shell_syntax(nodes: list[ast.AST], line_of: Callable[[int | None], int | None]) -> None:
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


def _undefined(name: str, line: int | None, scopes: str) -> PackagingError:
    if name in _IPYTHON_INJECTED:
        return PackagingError(
            f"name {name!r}{_at(line)} is provided by IPython and does not exist where the function runs; remove it"
        )
    return PackagingError(
        f"name {name!r}{_at(line)} is not defined: it is not defined in {scopes}, or as a Python builtin; {_DEFINE_IT}"
    )


def free_values(
    nodes: Sequence[ast.AST],
    code: str,
    namespace: Mapping[str, Any],
    line_of: Callable[[int | None], int | None],
    scopes: str,
    skip: Callable[[str], bool] = lambda name: False,
) -> Iterator[tuple[str, Any, Callable[[], str]]]:
    """(name, value, where) for each name `code` (the text of `nodes`) loads from module scope, sorted:
    what the artifact must capture or include, with `where()` naming its first use (" (line N)").

    Refuses dynamic namespace access, shell syntax and names defined nowhere (`scopes` says where they
    were looked for); module dunders, builtins and names `skip` (asked as each comes up, so a caller
    may grow what it skips while iterating) are left out. Both packagers resolve names here."""
    loaded, bound = _scope_names(code)
    free = loaded - bound
    _refuse_dynamic(free, list(nodes), code, line_of)
    if "get_ipython" in free:
        _refuse_shell_syntax(list(nodes), line_of)
    for name in sorted(free):
        if name in _MODULE_DUNDERS or skip(name):
            continue
        value = namespace.get(name, MISSING)
        if _resolves_as_builtin(name, value):
            continue

        def where(name: str = name) -> str:
            return _at(line_of(_first_use(list(nodes), name)))

        if value is MISSING or name in _IPYTHON_INJECTED:
            raise _undefined(name, line_of(_first_use(list(nodes), name)), scopes)
        yield name, value, where


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


def build_artifact(
    header: dict[str, str],
    body: list[ast.stmt],
    offsets: list[int],
    entrypoint: str,
    signature: FunctionSignature,
    captured: tuple[str, ...],
    code: str | None = None,
    modules: Mapping[str, tuple[str, bytes]] | None = None,
    left_out: tuple[tuple[int, str], ...] = (),
) -> PackagedFunction:
    """The artifact both packagers return: the sorted ``header`` lines (after the prelude of shipped
    ``modules``, if any) over ``code`` (``body`` re-emitted unless given), its digest and line map."""
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
        left_out=left_out,
    )
