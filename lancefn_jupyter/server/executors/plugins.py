"""Executor plug-ins: how an executor joins the control plane (docs/ARCHITECTURE.md, "Executor plug-ins").

An executor registers a plug-in object under the entry-point group ``lancefn.executors`` (its distribution's
``[project.entry-points."lancefn.executors"]``, ``NAME = "module:OBJECT"``), the way ipyparallel finds its
launchers; the local and Ray executors register theirs there too. ``lancefn-server --executor NAME`` builds the one
registered as NAME. A plug-in object is small and cheap to import (every one is loaded for ``--help``); it imports
its executor only when asked to build it, so ``ray`` is only imported for ``--executor ray``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from lancefn_jupyter.environments.cache import EnvironmentCache
    from lancefn_jupyter.server.executors.base import Executor
    from lancefn_jupyter.server.executors.isolation import WorkerUser
    from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig

__all__ = ["GROUP", "Built", "ExecutorContext", "ExecutorPlugin", "ExecutorRefused", "add_options", "registered"]

GROUP = "lancefn.executors"


class ExecutorRefused(Exception):
    """The plug-in cannot build its executor with these options; the message says what to change (the server
    exits 2 with it)."""


@dataclass(frozen=True)
class ExecutorContext:
    """What the control plane hands a plug-in to build its executor with."""

    classes: GpuClassConfig  # the GPU classes, already checked with the plug-in's class rules
    home: Path  # the control plane's home (its state, rows and results)
    shared: bool  # the API keys name several namespaces (teams): the defaults keep them apart ("Isolation")
    # The plane's environment cache ("Environments", ``--env-cache``), made for the worker user given (None: the
    # server's own user), who builds and runs the environments in it. Call it once.
    environments: Callable[[WorkerUser | None], EnvironmentCache]


@dataclass(frozen=True)
class Built:
    """A plug-in's executor and what the control plane keeps beside it."""

    executor: Executor
    environments: EnvironmentCache  # the cache ``ExecutorContext.environments`` made
    # What the executor records in the home's database, handed the store (``storage.store.Store``, a sibling layer
    # of executors) once it is open: the CLI opens it after the executor, so a refused start is quick. None: nothing.
    on_store: Callable[[Any], None] | None = None


class ExecutorPlugin(Protocol):
    """What an executor says to the control plane (an entry point of ``GROUP`` names an object like this)."""

    name: str  # its ``--executor`` name: the entry point's
    # Its GPU-class rule (``policy.gpu_classes.ClassRules``): True when the control plane places jobs on the devices
    # a class lists, so each class must list some (or be simulated); False when the executor's cluster reports each
    # class's capacity (``Executor.capacity``) and a class may list none.
    needs_devices: bool

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Add its own flags, in an argument group of its own (shown by ``lancefn-server --help``)."""

    def refuse(self, options: argparse.Namespace, chosen: str) -> str | None:
        """Why its own flags cannot start a server whose executor is ``chosen`` (itself or another): a bad value, or
        a flag that means nothing to the chosen executor and must not be dropped silently; None when they can."""

    def build(self, options: argparse.Namespace, context: ExecutorContext) -> Built:
        """Its executor from the parsed flags; raises ``ExecutorRefused`` saying what to change (any other
        exception is reported as "cannot create the NAME executor: ...")."""

    def create(self, **opts: Any) -> Executor:
        """Its executor from keyword options, dropping those it does not take (``executors.get_executor``)."""

    def ship(self, data: Mapping[str, object], table_slice: Mapping[str, object] | None) -> Mapping[str, object]:
        """The data-plane fields its workers get for a task's ``TaskSpec.data`` and ``table_slice``: the files they
        name in the control plane's home read in place, or carried as bytes (``executors.shipping``)."""


@functools.cache
def registered() -> dict[str, ExecutorPlugin]:
    """Every plug-in of ``GROUP``, by name; one that cannot be loaded is left out, saying why on stderr (the
    others still start)."""
    from importlib.metadata import entry_points

    plugins: dict[str, ExecutorPlugin] = {}
    for entry in entry_points(group=GROUP):
        try:
            plugin = entry.load()
        except Exception as error:  # a broken third-party plug-in must not stop the others
            print(
                f"lancefn-server: executor plug-in {entry.name!r} ({entry.value}) is left out: {error}", file=sys.stderr
            )
            continue
        if getattr(plugin, "name", None) != entry.name:
            print(
                f"lancefn-server: executor plug-in {entry.name!r} ({entry.value}) is left out: its name is "
                f"{getattr(plugin, 'name', None)!r}; name the entry point as the plug-in",
                file=sys.stderr,
            )
            continue
        plugins.setdefault(entry.name, plugin)
    return dict(sorted(plugins.items()))


def add_options(parser: argparse.ArgumentParser) -> None:
    """Every registered plug-in's flags."""
    for plugin in registered().values():
        plugin.add_options(parser)
