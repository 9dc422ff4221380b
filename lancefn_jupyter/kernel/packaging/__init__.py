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
  the entry, classes, ``if``/``for`` blocks, calls such as
  ``np.random.seed(0)`` or ``print("loading")`` …) **except two kinds of
  expression statement**, which run in the kernel but not when the worker
  executes the module: the cell's trailing expression (the last top-level
  statement, if it is an expression: its display value, e.g. ``df.head()``)
  and trial calls of the entry (a call whose callee is rooted at the entry's
  name: ``double_all([1.0])``, ``double_all.local([1.0])``, ``Scaler()(3)``).
  ``PackagedFunction.left_out`` lists them as (cell line, source text) and the
  function card names them, so no statement is dropped unseen. ``from
  __future__`` imports of the cell are dropped (the header already enables
  postponed annotations).
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
* Entry (``package_cell``): the candidates are top-level ``def``s and
  top-level classes whose body defines ``__call__`` (a class entry,
  ARCHITECTURE.md "Warm state"); ``entry`` if it names a candidate
  (otherwise ``entry`` is ignored, because a Function name such as
  ``scores.v2`` need not be a Python identifier), else the only public
  candidate, else the last. A class entry's signature is ``__call__``'s
  without ``self``; it is refused if ``__init__`` needs arguments, if
  ``__call__`` is ``async def``, or if ``setup``/``teardown`` take
  parameters besides ``self``.
* ``package_function`` snapshots one function the way LanceDB does, but
  functions and numba CUDA kernels it references that live in the same
  non-importable module (``__main__`` of a notebook) are included as
  definitions before the entry, in dependency order, decorators kept (so
  ``@cuda.jit`` is re-applied); the entry's own ``@gpu_function`` decorator
  is stripped and any other decorator on the entry is refused. A decorated
  class entry is packaged the same way from its source
  (``inspect.getsourcelines``), so only from a file: a class typed in a
  notebook cell has no source there and is refused (use ``%%gpu_function``).
* ``line_map`` maps each artifact line that begins an AST node to the line of
  that node in the user's text: for ``package_cell`` lines of ``cell`` (1 =
  first line of the string passed in), for ``package_function`` lines of the
  function's source file (``co_firstlineno``-based). Header lines map to
  nothing.

Modules: ``capture`` (the artifact value, errors, free-name capture, line map), ``cell``
(``package_cell``, ``entry_name``), ``function`` (``package_function``), ``signature``
(``infer_signature``).
"""

from lancefn_jupyter.kernel.packaging.capture import PackagedFunction, PackagingError
from lancefn_jupyter.kernel.packaging.cell import entry_name, package_cell
from lancefn_jupyter.kernel.packaging.function import package_function
from lancefn_jupyter.kernel.packaging.signature import infer_signature

__all__ = [
    "PackagedFunction",
    "PackagingError",
    "entry_name",
    "infer_signature",
    "package_cell",
    "package_function",
]

# The public names keep the module path they always had, the path users import them from: an artifact
# that captures one of them (``from lancefn_jupyter.packaging import infer_signature``) must not change its
# bytes or digest.
for _public in (PackagedFunction, PackagingError, entry_name, infer_signature, package_cell, package_function):
    _public.__module__ = "lancefn_jupyter.packaging"
del _public
