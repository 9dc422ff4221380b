"""The Ray executor's plug-in (``--executor ray``, docs/ray.md): its flag, and how it is built (``ray.RayExecutor``,
imported only then, so the control plane imports no Ray code for another executor)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.server.executors.plugins import Built, ExecutorContext, ExecutorPlugin, ExecutorRefused
from lancefn_jupyter.server.executors.shipping import as_bytes

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import Executor

__all__ = ["PLUGIN", "RayPlugin"]


class RayPlugin:
    name = "ray"
    needs_devices = False  # the cluster reports each class's GPUs (``RayExecutor.capacity``)
    ship = staticmethod(as_bytes)  # a task may run on another node

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("Ray executor (--executor ray)")
        group.add_argument(
            "--ray-address",
            help="Ray cluster address for --executor ray (default: start a private local Ray; 'auto': the cluster on "
            "this machine or $RAY_ADDRESS; see docs/ray.md)",
        )

    def refuse(self, options: argparse.Namespace, chosen: str) -> str | None:
        return None  # --ray-address means nothing to another executor, and is harmless there

    def build(self, options: argparse.Namespace, context: ExecutorContext) -> Built:
        """The control plane resolves versions' packages (running their build backends) as the worker user."""
        from lancefn_jupyter.server.executors.isolation import WorkerUserError, resolve_worker_user

        try:
            worker_user = resolve_worker_user(options.worker_user)
        except WorkerUserError as error:
            raise ExecutorRefused(str(error)) from None
        environments = context.environments(worker_user)
        executor = self.create(
            address=options.ray_address,
            classes=context.classes,
            home=context.home,
            worker_max_rss_mb=options.worker_max_rss_mb,
            environments=environments,
            worker_user=worker_user,
        )
        return Built(executor, environments)

    def create(self, **opts: Any) -> Executor:
        """``address=`` (``None``: start a private local Ray sized from ``classes=``), ``home=`` (where that local
        Ray keeps its temp dir when the path is short enough), ``environments=`` (whose ``plan`` resolves a version's
        packages for Ray's ``uv``), ``worker_user=`` (whom that resolution runs as) and ``worker_max_rss_mb=`` (an
        actor over it after a job is retired, "Warm state")."""
        from lancefn_jupyter.server.executors.ray import RayExecutor

        return RayExecutor(
            address=opts.get("address"),
            classes=opts.get("classes"),
            home=opts.get("home"),
            worker_max_rss_mb=opts.get("worker_max_rss_mb"),
            environments=opts.get("environments"),
            worker_user=opts.get("worker_user"),
        )


PLUGIN: ExecutorPlugin = RayPlugin()
