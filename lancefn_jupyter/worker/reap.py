"""Nothing a job starts outlives it (docs/ARCHITECTURE.md, "Job processes").

A task process (the local worker, a Ray job actor) makes itself a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``): a process its job starts that detaches (``setsid`` and a double fork) is
reparented to the task process instead of to init, so it is still found by walking ``/proc`` for the
task process's descendants. After each task, :func:`sweep` SIGKILLs every descendant (but those it was
told to keep) and reaps them, until none is left. The parent (``WorkerProcess.kill``) sweeps a worker's
descendants the same way before it SIGKILLs a worker that would not end by itself.

Where the machine has cgroup v2 and this process may create cgroups under its own (a root server, or one given
a delegated cgroup), the parent also puts each worker in a cgroup of its own (:func:`worker_cgroup`) and kills
what is left in it once the worker is gone (:func:`end_cgroup`): that also ends what a worker that died by
itself (a crash) had detached, which no sweep can reach any more.

Linux only (``/proc``, ``prctl``, cgroup v2); elsewhere these are no-ops. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Collection
from pathlib import Path

__all__ = [
    "become_subreaper",
    "child_halted",
    "children",
    "descendants",
    "end_cgroup",
    "has_children",
    "kill_descendants",
    "proc_state",
    "remove_cgroups",
    "sweep",
    "worker_cgroup",
]

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
    try:  # os-level I/O: a file object costs more than the read
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
        finally:
            os.close(fd)
    except (OSError, IndexError):
        return None
    return fields[0].decode("ascii", "replace") if fields else None


def child_halted(pid: int) -> bool:
    """Whether our child ``pid`` has exited or is stopped (SIGSTOP, not a debugger's tracing stop), without reaping it
    or taking its stop report: one light system call, where ``/proc/<pid>/stat`` costs a dozen times more."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


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


# ----------------------------------------------------------------------------- cgroups (the parent's side)

_CGROUP_LOCK = threading.Lock()
_numbers = itertools.count()
_cgroups: list[Path | None] = []  # [this process's cgroup for its workers, or None] once decided


def _own_cgroup() -> Path | None:
    """A cgroup v2 directory of this process's own for its workers' cgroups (created once), or None."""
    with _CGROUP_LOCK:
        if not _cgroups:
            _cgroups.append(_make_own_cgroup())
        return _cgroups[0]


def _make_own_cgroup() -> Path | None:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            mount = next((line.split()[1] for line in mounts if line.split()[2:3] == ["cgroup2"]), None)
        with open("/proc/self/cgroup", encoding="utf-8") as groups:
            own = next((line.strip()[3:] for line in groups if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or own is None:
        return None
    parent = Path(mount) / own.lstrip("/")
    path = parent / f"lancefn-{os.getpid()}"
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except OSError:  # not ours to create (a non-root server without a delegated cgroup): the sweep alone
        return None
    for stale in parent.glob("lancefn-*"):  # left by a server that was killed: removed once empty
        owner = stale.name.removeprefix("lancefn-")
        if stale != path and owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            for group in [*stale.glob("w*"), stale]:
                with contextlib.suppress(OSError):
                    group.rmdir()
    return path


def worker_cgroup(pid: int) -> Path | None:
    """Move the just-started worker ``pid`` (it runs no job yet) into a cgroup of its own; None where none can be
    made (then the subreaper's sweep alone ends its jobs' processes)."""
    own = _own_cgroup()
    if own is None:
        return None
    path = own / f"w{pid}-{next(_numbers)}"  # numbered: a reused pid never meets its predecessor's cgroup
    try:
        path.mkdir(mode=0o755)
        (path / "cgroup.procs").write_text(str(pid))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def end_cgroup(path: Path | None) -> None:
    """Kill every process left in a worker's cgroup (its worker gone) and remove it."""
    if path is None:
        return
    deadline = time.monotonic() + SWEEP_LIMIT_S
    while True:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return
        if not pids:
            break
        try:
            (path / "cgroup.kill").write_text("1")  # Linux 5.14+: the whole cgroup at once
        except OSError:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return  # left in place: a process stuck in the kernel
        time.sleep(0.01)
    with contextlib.suppress(OSError):
        path.rmdir()


def remove_cgroups() -> None:
    """At the parent's end: remove its (then empty) cgroup of workers' cgroups."""
    with _CGROUP_LOCK:
        own = _cgroups[0] if _cgroups else None
    if own is not None:
        with contextlib.suppress(OSError):
            own.rmdir()
