"""Executors, found through their plug-ins (``plugins.py``: the entry-point group ``lancefn.executors``); each
plug-in imports its implementation only when asked to build it, so ``ray`` is only needed for ``ray``."""

from __future__ import annotations

from typing import Any

from lancefn_jupyter.server.executors.base import Executor, ExecutorCallbacks, TaskSpec

__all__ = ["EXECUTOR_NAMES", "Executor", "ExecutorCallbacks", "TaskSpec", "get_executor"]


def __getattr__(name: str) -> Any:
    if name == "EXECUTOR_NAMES":  # the registered names, read when asked (the plug-ins are found then)
        from lancefn_jupyter.server.executors.plugins import registered

        return tuple(registered())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_executor(name: str, **opts: Any) -> Executor:
    """Build the executor registered as ``name`` from keyword options (its plug-in's ``create`` says which it
    takes: ``local_plugin.py``, ``ray_plugin.py``). Options an implementation does not take are dropped, so a caller
    can pass everything it knows."""
    from lancefn_jupyter.server.executors.plugins import registered

    plugins = registered()
    if name not in plugins:
        raise ValueError(f"unknown executor {name!r}; choose one of: {', '.join(plugins)}")
    return plugins[name].create(**opts)
