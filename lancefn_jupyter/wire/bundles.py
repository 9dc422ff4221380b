"""LanceDB 0.40's ``python_bundle`` artifacts (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): ``udf(..., code=[module])``
uploads the JSON ``{"files": {path: source, ..., "user_function.py": entry source}}``. The control plane checks a
bundle's paths and bounds at registration; the worker checks them again before it writes the files into the
version's own directory on its ``sys.path``.

A bundle is told from a ``python_callable`` artifact by its content: a JSON document defines no name, so it can
never be a callable artifact (whose entry must be defined at its top level).

Pure: the standard library only (the worker imports it).
"""

from __future__ import annotations

import json
import re
import sys

__all__ = ["ENTRY_FILE", "MAX_FILES", "MAX_FILE_BYTES", "MAX_PATH_CHARS", "bundle_files", "bundle_problem"]

ENTRY_FILE = "user_function.py"  # the entry's module: executed as the version's own module
MAX_FILES = 256  # files in one bundle, the entry's included
MAX_FILE_BYTES = 1024 * 1024  # one file's UTF-8 source
MAX_PATH_CHARS = 255  # one file's path
_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an importable package or module name
# Top-level names a bundle may not ship: they would shadow the worker's own modules on its sys.path.
_RESERVED = frozenset({"lancefn_jupyter", "user_function"})


def bundle_files(artifact: bytes) -> dict[str, str] | None:
    """A bundle artifact's files (path → source), or None when ``artifact`` is not a bundle (Python source)."""
    if artifact.lstrip()[:1] != b"{":
        return None
    try:
        document = json.loads(artifact)
    except (UnicodeDecodeError, ValueError):
        return None
    files = document.get("files") if isinstance(document, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    return files


def bundle_problem(files: dict[str, str] | None) -> str | None:
    """What is wrong with a ``python_bundle`` artifact's ``files`` (``bundle_files``; None: not a bundle) as a message
    naming the path or limit and what to change, or None: ``user_function.py`` present, at most ``MAX_FILES`` files of
    at most ``MAX_FILE_BYTES`` each, every path a relative ``.py`` path of importable names (no absolute path, no
    ``..``)."""
    if files is None:
        return (
            'artifact content of kind \'python_bundle\' must be the JSON {"files": {"<path>.py": "<source>", ...}} '
            "with string sources; build it with lancedb.udf(..., code=[module])"
        )
    if ENTRY_FILE not in files:
        return f"the python_bundle has no {ENTRY_FILE!r}, the entry's module; build it with lancedb.udf(..., code=[module])"
    if len(files) > MAX_FILES:
        return (
            f"the python_bundle has {len(files)} files, over the limit of {MAX_FILES} files per bundle; ship fewer "
            "modules with code= (declare installed packages in pip= instead)"
        )
    for path, source in files.items():
        problem = _path_problem(path)
        if problem:
            return f"python_bundle path {path[:MAX_PATH_CHARS]!r}: {problem}"
        size = len(source.encode("utf-8", "surrogatepass"))
        if size > MAX_FILE_BYTES:
            return (
                f"python_bundle file {path!r} is {size} bytes, over the limit of {MAX_FILE_BYTES} bytes per file; "
                "keep data out of the shipped source (load it at run time)"
            )
    return None


def _path_problem(path: str) -> str | None:
    if len(path) > MAX_PATH_CHARS:
        return f"longer than {MAX_PATH_CHARS} characters; use shorter module paths"
    if path.startswith("/") or "\\" in path or ":" in path:
        return "must be a relative path with '/' separators (no absolute path, drive or backslash)"
    *directories, filename = path.split("/")
    if ".." in directories or "." in directories or "" in directories:
        return "must not contain '..', '.' or empty parts: each file stays inside the bundle"
    stem, dot, suffix = filename.rpartition(".")
    if not dot or suffix != "py" or not all(_PART.fullmatch(part) for part in (*directories, stem)):
        return "must be a .py file whose directories and name are importable Python names"
    top = directories[0] if directories else stem
    if path != ENTRY_FILE and (top in _RESERVED or top in sys.stdlib_module_names):
        return f"its top-level name {top!r} would shadow the worker's own modules; rename the module"
    return None
