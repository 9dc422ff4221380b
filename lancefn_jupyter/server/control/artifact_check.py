"""Static checks of an uploaded artifact: UTF-8 Python source that defines its entrypoint.

Large artifacts are parsed in a child process.  ``ast.parse`` holds the GIL for the whole
parse — seconds and gigabytes for a few MiB of literals like ``x=[0,0,…]`` — so even from a
worker thread it would stall every other request (health, SSE, other clients).  Small ones,
the usual case, are parsed in-process where it costs well under a millisecond.

    python -m lancefn_jupyter.server.control.artifact_check ENTRYPOINT < artifact   → problem or nothing
"""

from __future__ import annotations

import ast
import subprocess
import sys
import threading

__all__ = ["IN_PROCESS_MAX_BYTES", "artifact_problem"]

IN_PROCESS_MAX_BYTES = 16 * 1024  # parses in a few ms at worst
CHILD_TIMEOUT_S = 60.0
# A worst-case 4 MiB artifact takes GBs to parse: a few at a time, not one per request thread.
_CHILDREN = threading.BoundedSemaphore(2)


def artifact_problem(artifact: bytes, entrypoint: str) -> str | None:
    """What is wrong with ``artifact`` (a message saying how to fix it), or None."""
    if len(artifact) <= IN_PROCESS_MAX_BYTES:
        return _problem(artifact, entrypoint)
    try:
        with _CHILDREN:
            done = subprocess.run(
                # -P, cwd /: it runs as the server's user (root), so never from a directory another user can write
                [sys.executable, "-P", "-m", __name__, entrypoint],
                input=artifact,
                cwd="/",
                capture_output=True,
                timeout=CHILD_TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        return (
            f"artifact content could not be checked within {CHILD_TIMEOUT_S:.0f}s and the checker's memory "
            "(too large or too deeply nested); keep data out of the source and package the function with "
            "lancefn_jupyter.packaging"
        )
    return done.stdout.decode("utf-8", "replace").strip() or None


def _problem(artifact: bytes, entrypoint: str) -> str | None:
    # Cheap early checks so a broken upload fails at registration, not at the first run.
    try:
        tree = ast.parse(artifact.decode("utf-8"), filename="<artifact>")
    except UnicodeDecodeError:
        return "artifact content is not UTF-8 Python source; package the function with lancefn_jupyter.packaging"
    except (SyntaxError, ValueError) as error:
        return f"artifact content is not valid Python ({error}); package the function with lancefn_jupyter.packaging"
    except (MemoryError, RecursionError):  # the parser's own stack (e.g. 100 000 nested unary minus signs)
        return (
            "artifact content is nested too deeply for the Python parser; simplify the expression or keep data "
            "out of the source, and package the function with lancefn_jupyter.packaging"
        )
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    if entrypoint not in defined:
        return f"artifact.entrypoint {entrypoint!r} is not defined at the top level of the artifact; name the entry function"
    return None


if __name__ == "__main__":
    sys.stdout.write(_problem(sys.stdin.buffer.read(), sys.argv[1]) or "")
