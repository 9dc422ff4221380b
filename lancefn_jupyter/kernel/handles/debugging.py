"""A failed job's row run again in this kernel, stopped in the post-mortem debugger at the failing line
(docs/ARCHITECTURE.md, "Debugging a failure"). The artifact is the version's own, executed afresh here (the worker
runner's loader: the same module, stand-ins and line numbers); nothing is kept loaded afterwards."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.wire.models import FunctionSignature

__all__ = ["post_mortem"]


def _artifact_frames(tb: TracebackType | None, filename: str) -> TracebackType | None:
    """``tb`` from the artifact's first frame to its last one: the debugger opens at the failing line of the user's
    code, not inside the loader before it or a library after it."""
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    last, walk = tb, tb
    while walk is not None:
        if walk.tb_frame.f_code.co_filename == filename:
            last = walk
        walk = walk.tb_next
    if last is not None:
        last.tb_next = None
    return tb


def _debugger() -> Any:
    """IPython's debugger of this shell (the terminal's or the kernel's), else the standard library's."""
    try:
        from IPython import get_ipython
    except ImportError:  # a plain Python process
        shell = None
    else:
        shell = get_ipython()
    if shell is None:
        import pdb

        return pdb.Pdb()
    return shell.debugger_cls()


def post_mortem(
    artifact: bytes,
    entrypoint: str,
    filename: str,
    row: dict[str, Any],
    signature: FunctionSignature,
    commands: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> BaseException | None:
    """Call the entry of ``artifact`` on ``row`` here; when it raises, open the post-mortem debugger at the artifact's
    innermost frame (``commands`` run first, as pdb's rc lines) and return the exception; None when the row ran.
    The function's ``env`` is in ``os.environ`` meanwhile, as in its worker, and taken out after the debugger."""
    from lancefn_jupyter.wire import dataplane
    from lancefn_jupyter.worker.runner import call_here

    task = {
        "artifact_b64": base64.b64encode(artifact).decode("ascii"),
        "entrypoint": entrypoint,
        "filename": filename,
        "rows": [row],
        **dataplane.task_fields(signature.to_wire()),
    }
    from unittest import mock

    # The standard library's set-then-restore of a mapping: os.environ as it was once the debugger ends.
    with mock.patch.dict(os.environ, env or {}):
        try:
            call_here(task)
        except Exception as exc:
            debugger = _debugger()
            debugger.rcLines.extend(commands)
            debugger.reset()
            debugger.interaction(None, _artifact_frames(exc.__traceback__, filename) or exc.__traceback__)
            return exc
    return None
