"""Executor registry; implementations are imported lazily so ``ray`` is only needed for ``ray``."""

from __future__ import annotations

from typing import Any

from lancefn_jupyter.server.executors.base import Executor, ExecutorCallbacks, TaskSpec

__all__ = ["EXECUTOR_NAMES", "Executor", "ExecutorCallbacks", "TaskSpec", "get_executor"]

EXECUTOR_NAMES = ("local", "ray")


def get_executor(name: str, **opts: Any) -> Executor:
    """Build an executor by name.

    ``local`` takes ``classes=`` (the loaded GPU class config), ``home=``, ``worker_user=``,
    ``max_idle_workers=``, ``max_idle_per_device_set=``, ``prewarm_delay_s=``, ``environments=`` (the
    plane's ``EnvironmentCache``, "Environments"), ``worker_uids=`` (a ``uids.WorkerUids``: a uid per namespace)
    and ``worker_max_procs=`` (switched workers' RLIMIT_NPROC, "Isolation");
    ``ray`` takes ``address=`` (``None``: start a private local Ray sized from ``classes=``), ``home=`` (where
    that local Ray keeps its temp dir when the path is short enough), ``environments=`` (whose ``plan``
    resolves a version's packages for Ray's ``uv``) and ``worker_user=`` (whom that resolution runs as).
    Both take ``worker_max_rss_mb=`` (a worker or actor over it after a job is retired, "Warm state").
    Options an implementation does not take are dropped, so the CLI can pass everything it knows.
    """
    if name == "local":
        from lancefn_jupyter.server.executors.local import LocalExecutor

        tuning = {
            k: opts[k]
            for k in (
                "max_idle_workers",
                "max_idle_per_device_set",
                "prewarm_delay_s",
                "worker_max_rss_mb",
                "worker_uids",
                "worker_max_procs",
            )
            if opts.get(k) is not None
        }
        return LocalExecutor(
            classes=opts.get("classes"),
            home=opts.get("home"),
            worker_user=opts.get("worker_user"),
            environments=opts.get("environments"),
            **tuning,
        )
    if name == "ray":
        from lancefn_jupyter.server.executors.ray import RayExecutor

        return RayExecutor(
            address=opts.get("address"),
            classes=opts.get("classes"),
            home=opts.get("home"),
            worker_max_rss_mb=opts.get("worker_max_rss_mb"),
            environments=opts.get("environments"),
            worker_user=opts.get("worker_user"),
        )
    raise ValueError(f"unknown executor {name!r}; choose one of: {', '.join(EXECUTOR_NAMES)}")
