"""Nothing a job starts outlives it (docs/ARCHITECTURE.md, "Job processes").

A task process (the local worker, a Ray job actor) makes itself a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``): a process its job starts that detaches (``setsid`` and a double fork) is
reparented to the task process instead of to init, so it is still found by walking ``/proc`` for the
task process's descendants. After each task, :func:`sweep` SIGKILLs every descendant (but those it was
told to keep) and reaps them, until none is left. The parent (``WorkerProcess.kill``) sweeps a worker's
descendants the same way before it SIGKILLs a worker that would not end by itself.

Linux only (``/proc``, ``prctl``); elsewhere these are no-ops. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Collection

__all__ = ["become_subreaper", "children", "descendants", "has_children", "kill_descendants", "proc_state", "sweep"]

_PR_SET_CHILD_SUBREAPER = 36
SWEEP_LIMIT_S = 5.0  # a descendant stuck in the kernel (state D) is given up on after this, and logged by the caller
_subreaper = False


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (once per process); False where it cannot."""
    global _subreaper
    if not _subreaper:
        try:
            import ctypes

            _subreaper = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):  # not Linux
            return False
    return _subreaper


def has_children() -> bool:
    """Whether this process has a child (alive or not yet reaped): one system call, nothing reaped."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except (AttributeError, OSError):  # no waitid: assume there may be some
        return True
    return True


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie, …), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode("ascii", "replace") if fields else None


def _processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state) of every process in ``/proc``."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return table


def children(pid: int | None = None) -> set[int]:
    """The direct children of ``pid`` (default: this process)."""
    root = os.getpid() if pid is None else pid
    return {child for child, (parent, _) in _processes().items() if parent == root}


def descendants(root: int, keep: Collection[int] = ()) -> dict[int, str]:
    """pid → state of every descendant of ``root``, except ``keep`` and the descendants of those."""
    table = _processes()
    by_parent: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        by_parent.setdefault(parent, []).append(pid)
    found: dict[int, str] = {}
    todo = [pid for pid in by_parent.get(root, ()) if pid not in keep]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found[pid] = table[pid][1]
        todo.extend(by_parent.get(pid, ()))
    return found


def kill_descendants(root: int, keep: Collection[int] = (), *, reap: bool = False) -> int:
    """SIGKILL ``root``'s descendants (not ``keep`` nor theirs) until none is left alive; ``reap``: also
    reap those that are this process's children (``root`` is this process). Returns how many were killed;
    stops trying after ``SWEEP_LIMIT_S`` (a process in uninterruptible sleep)."""
    killed: set[int] = set()
    deadline = time.monotonic() + SWEEP_LIMIT_S
    while True:
        found = descendants(root, keep)
        alive = [pid for pid, state in found.items() if state != "Z"]
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        if reap:
            for pid in found:  # our children among them (the rest are reaped by their own parents, or come to us)
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
        if not alive or time.monotonic() > deadline:
            return len(killed)
        time.sleep(0.005)  # let the signals land (and orphans be reparented to us) before looking again


def sweep(keep: Collection[int] = ()) -> int:
    """After a task: end every process this one's job started (not ``keep``, which existed before it) and
    reap them. Costs one system call when there is none (the usual case)."""
    if not has_children():
        return 0
    return kill_descendants(os.getpid(), keep, reap=True)
