"""The local executor's plug-in (``--executor local``, the default): its flags, the worker user or uid per namespace
it runs workers as (docs/ARCHITECTURE.md, "Isolation"), and how it is built (``local.LocalExecutor``)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.server.executors.plugins import Built, ExecutorContext, ExecutorPlugin, ExecutorRefused
from lancefn_jupyter.server.executors.shipping import in_place

if TYPE_CHECKING:
    from lancefn_jupyter.server.executors.base import Executor

__all__ = ["PLUGIN", "PREWARM_DELAY_S", "LocalPlugin"]

log = logging.getLogger("lancefn.server")

# Spare workers (numpy and numba imported ahead of a job) start this long after the server, so a
# notebook's first registration does not share the CPU with them (docs/ARCHITECTURE.md, "REST details").
PREWARM_DELAY_S = 0.3
# How long an idle warm worker waits for its version's next job before it retires (docs/ARCHITECTURE.md, "Warm state"):
# a notebook's next cell usually comes within minutes; a session that ended should not hold a GPU's models for hours.
DEFAULT_WORKER_IDLE_S = 600.0
MAX_WORKER_IDLE_S = 7 * 86400.0
# What ``create`` passes on to ``LocalExecutor`` when given (its tuning; the rest are its defaults).
_TUNING = (
    "max_idle_workers",
    "max_idle_per_device_set",
    "idle_timeout_s",
    "prewarm_delay_s",
    "worker_max_rss_mb",
    "worker_uids",
    "worker_max_procs",
)


class LocalPlugin:
    name = "local"
    needs_devices = True  # jobs are placed on the devices each class lists
    ship = staticmethod(in_place)  # workers on this machine read and write the home's files

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("local executor (--executor local)")
        group.add_argument(
            "--worker-uids",
            default=os.environ.get("LANCEFN_WORKER_UIDS") or None,
            metavar="FIRST-LAST",
            help="a root server runs each namespace's workers as a uid of its own from this range, recorded in the "
            "home (e.g. 61000-61999; no passwd entries; instead of --worker-user; env LANCEFN_WORKER_UIDS; default for "
            "a root server whose keys name several namespaces: 60600-60855, or 60856-61111 when a user or group holds "
            "one of those)",
        )
        group.add_argument(
            "--worker-max-procs",
            type=int,
            default=None,
            help="RLIMIT_NPROC of workers run as another user: processes and threads of that uid at once (default 512 "
            "per namespace with --worker-uids; with --worker-user no limit, since every namespace shares that user)",
        )
        group.add_argument(
            "--max-idle-workers",
            type=int,
            default=16,
            help="local executor: idle warm workers kept in all (default 16)",
        )
        group.add_argument(
            "--worker-idle-s",
            type=float,
            default=DEFAULT_WORKER_IDLE_S,
            help="local executor: an idle warm worker retires (its teardown runs, its GPU memory and models are freed) "
            f"after this many seconds unused (default {DEFAULT_WORKER_IDLE_S:g}: 10 minutes)",
        )
        group.add_argument(
            "--max-idle-per-device-set",
            type=int,
            default=4,
            help="local executor: idle workers of distinct function versions kept per device set, least recently used "
            "retired first (default 4)",
        )

    def refuse(self, options: argparse.Namespace, chosen: str) -> str | None:
        if options.max_idle_workers < 0 or options.max_idle_per_device_set < 0:
            return "--max-idle-workers and --max-idle-per-device-set must be >= 0"
        if not 0 < options.worker_idle_s <= MAX_WORKER_IDLE_S:
            return (
                f"--worker-idle-s must be a number of seconds > 0 and at most {MAX_WORKER_IDLE_S:g} "
                f"(got {options.worker_idle_s:g}); leave it out for {DEFAULT_WORKER_IDLE_S:g}"
            )
        max_procs = options.worker_max_procs
        if max_procs is not None and max_procs < 1:
            return f"--worker-max-procs must be a whole number >= 1 (got {max_procs}); leave it out for the default"
        if chosen == self.name:
            return None
        if options.worker_uids:  # says why it applies to the local executor only
            from lancefn_jupyter.server.executors.isolation import WorkerUserError
            from lancefn_jupyter.server.executors.uids import resolve_worker_uids

            try:
                resolve_worker_uids(
                    options.worker_uids, worker_user=options.worker_user, executor=chosen, euid=os.geteuid()
                )
            except WorkerUserError as error:
                return str(error)
        if max_procs is not None:
            return f"--worker-max-procs applies to the local executor only (the {chosen} executor starts its own workers); drop it"
        return None

    def build(self, options: argparse.Namespace, context: ExecutorContext) -> Built:
        """Checks the worker user first; with ``--worker-uids``, or by default on a root server whose keys name
        several namespaces (``context.shared``), the namespace → uid record (``WorkerUids``) is kept in the store."""
        from lancefn_jupyter.server.executors.isolation import WorkerUserError, check_worker_user, resolve_worker_user
        from lancefn_jupyter.server.executors.local import worker_base_env
        from lancefn_jupyter.server.executors.uids import (
            DEFAULT_WORKER_MAX_PROCS,
            WorkerUids,
            resolve_worker_uids,
            system_groups,
            system_passwd,
            uid_user,
        )

        max_procs = options.worker_max_procs
        try:
            uids = resolve_worker_uids(
                options.worker_uids,
                worker_user=options.worker_user,
                executor=self.name,
                euid=os.geteuid(),
                passwd=system_passwd(),
                groups=system_groups() if context.shared and not options.worker_uids else (),
                shared=context.shared,
            )
            worker_user = uid_user(uids.first) if uids is not None else resolve_worker_user(options.worker_user)
        except WorkerUserError as error:
            raise ExecutorRefused(str(error)) from None
        if uids is None and context.shared and os.geteuid() == 0:
            log.warning(
                "--worker-user %s: every namespace's workers run as that one user, so one team's job can signal "
                "(SIGKILL, SIGSTOP) another team's; drop --worker-user (and LANCEFN_WORKER_USER) for a uid per "
                "namespace, or pass --worker-uids FIRST-LAST",
                options.worker_user,
            )
        # With a uid per namespace, the range's first uid stands for all of them (same access, no groups).
        problem = check_worker_user(worker_user, worker_base_env(worker_user)) if worker_user else None
        if problem:
            raise ExecutorRefused(problem)
        worker_uids = None
        if uids is not None:
            worker_uids = WorkerUids(uids)
            max_procs = max_procs or DEFAULT_WORKER_MAX_PROCS
        elif max_procs is not None and worker_user is None:
            raise ExecutorRefused(
                "--worker-max-procs limits workers run as another user, and this server runs them as itself "
                "(it is not root, or --worker-user names its own user); drop the flag"
            )
        environments = context.environments(worker_user)
        executor = self.create(
            classes=context.classes,
            home=context.home,
            worker_user=None if worker_uids is not None else worker_user,
            worker_uids=worker_uids,
            worker_max_procs=max_procs,
            max_idle_workers=options.max_idle_workers,
            max_idle_per_device_set=options.max_idle_per_device_set,
            idle_timeout_s=options.worker_idle_s,
            worker_max_rss_mb=options.worker_max_rss_mb,
            prewarm_delay_s=PREWARM_DELAY_S,
            environments=environments,
        )
        return Built(executor, environments, on_store=worker_uids.attach if worker_uids is not None else None)

    def create(self, **opts: Any) -> Executor:
        """``classes=`` (the loaded GPU class config), ``home=``, ``worker_user=``, ``environments=`` (the plane's
        ``EnvironmentCache``, "Environments") and the tuning: ``max_idle_workers=``, ``max_idle_per_device_set=``,
        ``prewarm_delay_s=``, ``worker_max_rss_mb=`` ("Warm state"), ``worker_uids=`` (a ``uids.WorkerUids``: a uid
        per namespace) and ``worker_max_procs=`` (switched workers' RLIMIT_NPROC, "Isolation")."""
        from lancefn_jupyter.server.executors.local import LocalExecutor

        tuning = {k: opts[k] for k in _TUNING if opts.get(k) is not None}
        return LocalExecutor(
            classes=opts.get("classes"),
            home=opts.get("home"),
            worker_user=opts.get("worker_user"),
            environments=opts.get("environments"),
            **tuning,
        )


PLUGIN: ExecutorPlugin = LocalPlugin()
