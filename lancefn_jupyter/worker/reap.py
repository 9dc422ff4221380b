"""Nothing a job starts outlives it (docs/ARCHITECTURE.md, "Job processes").

A task process (the local worker, a Ray job actor) makes itself a *child subreaper*
(``PR_SET_CHILD_SUBREAPER``): a process its job starts that detaches (``setsid`` and a double fork) is
reparented to the task process instead of to init, so it is still found by walking ``/proc`` for the
task process's descendants. After each task, :func:`sweep` SIGKILLs every descendant (but those it was
told to keep) and reaps them, until none is left. The parent (``WorkerProcess.kill``) sweeps a worker's
descendants the same way before it SIGKILLs a worker that would not end by itself.

Where the machine has cgroup v2 and this process may create cgroups under its own (a root server, or one given
a delegated cgroup), the parent also puts each worker in a cgroup of its own (:func:`worker_cgroup`). A process a
job starts is in it however it was started (membership is inherited from the forking process, so also a child
made with ``CLONE_PARENT``, whose parent is the worker's parent and which no sweep of the worker sees): after each
task the parent reads the cgroup's process list (:func:`others_in`) and, when more than the worker is there, moves
the worker to a fresh cgroup and kills the old one whole (:func:`rehouse`). Once the worker is gone it kills what is
left in its cgroup (:func:`end_cgroup`): that also ends what a worker that died by itself (a crash) had detached.
Such processes may be the parent's own children (``CLONE_PARENT``): :func:`reap_strays` reaps them, and only them.

Linux only (``/proc``, ``prctl``, cgroup v2); elsewhere these are no-ops. Standard library only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

__all__ = [
    "become_subreaper",
    "child_halted",
    "children",
    "close_procs",
    "descendants",
    "end_cgroup",
    "has_children",
    "kill_descendants",
    "open_procs",
    "others_in",
    "proc_state",
    "reap_strays",
    "rehouse",
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
# [(this process's cgroup for its workers, its path as /proc/<pid>/cgroup names it), or None] once decided
_cgroups: list[tuple[Path, str] | None] = []


def _own_cgroup() -> Path | None:
    """A cgroup v2 directory of this process's own for its workers' cgroups (created once), or None."""
    with _CGROUP_LOCK:
        if not _cgroups:
            _cgroups.append(_make_own_cgroup())
        return _cgroups[0][0] if _cgroups[0] is not None else None


def _make_own_cgroup() -> tuple[Path, str] | None:
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
    return path, "/" + str(path.relative_to(mount))


def worker_cgroup(pid: int) -> Path | None:
    """Move the worker ``pid`` into a new cgroup of its own (before it runs any job: just started, or idle when
    :func:`rehouse` moves it); None where none can be made (then the subreaper's sweep alone ends its jobs'
    processes)."""
    own = _own_cgroup()
    if own is None:
        return None
    return new_cgroup(own / f"w{pid}-{next(_numbers)}", pid)  # numbered: a reused pid never meets its predecessor's


def new_cgroup(path: Path, pid: int, settings: Mapping[str, str] | None = None) -> Path | None:
    """Make the cgroup ``path`` (v2, or in a v1 hierarchy), write ``settings`` (file → value; a file the cgroup lacks
    is skipped, e.g. v1's ``memory.memsw.limit_in_bytes`` where swap is not counted), then move ``pid`` into it; None,
    with nothing left behind, where that fails."""
    try:
        path.mkdir(mode=0o755)
        for name, value in (settings or {}).items():
            if (path / name).exists():
                (path / name).write_text(value)
        (path / "cgroup.procs").write_text(str(pid))
    except OSError:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def open_procs(path: Path | None) -> int | None:
    """A descriptor of the cgroup's process list, kept open so that each look is one read (:func:`others_in`)."""
    if path is None:
        return None
    try:
        return os.open(path / "cgroup.procs", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def close_procs(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def others_in(procs: int, pid: int) -> bool:
    """Whether the cgroup whose process list ``procs`` is (:func:`open_procs`) holds a process besides ``pid``: one
    ``pread`` (a list of one pid reads as exactly it)."""
    try:
        return os.pread(procs, 64, 0) != b"%d\n" % pid
    except OSError:  # gone with its worker: nothing to find
        return False


def rehouse(path: Path, pid: int) -> Path | None:
    """Move the idle worker ``pid`` out of ``path`` into a fresh cgroup of its own, kill everything left in ``path``
    (what its job left there, however started: ``cgroup.kill`` takes it whole, forks included) and remove it. The
    fresh cgroup; None when the move failed or something in ``path`` would not die (the caller kills the worker)."""
    fresh = worker_cgroup(pid)
    if fresh is None:
        return None
    return fresh if end_cgroup(path) else None


def end_cgroup(path: Path | None) -> bool:
    """Kill every process left in a worker's cgroup (its worker gone, or moved out), reap those that were ours to
    reap (children of this process: ``CLONE_PARENT``), and remove it. False when something would not die within
    ``SWEEP_LIMIT_S`` (a process stuck in the kernel: the cgroup is left in place)."""
    if path is None:
        return True
    deadline = time.monotonic() + SWEEP_LIMIT_S
    killed: set[int] = set()
    while True:
        try:
            pids = [int(pid) for pid in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return True
        if not pids:
            break
        killed.update(pids)
        try:
            (path / "cgroup.kill").write_text("1")  # Linux 5.14+: the whole cgroup at once
        except OSError:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False  # left in place: a process stuck in the kernel
        time.sleep(0.01)
    _reap_ours(killed, path)
    with contextlib.suppress(OSError):
        path.rmdir()
    return True


def _reap_ours(pids: Collection[int], path: Path) -> None:
    """Reap those of ``pids`` (killed, out of the cgroup ``path`` now) that are this process's children: each is on
    its way to being a zombie of ours, which no ``Popen`` of ours waits for (none of them is a worker)."""
    for pid in pids:
        if _is_stray(pid, path):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)


def _is_stray(pid: int, path: Path | None = None) -> bool:
    """Whether ``pid`` is a child of this process that was in a worker's cgroup (``w<worker pid>-<n>``; ``path``: that
    one) and is not that worker: a job's process, ours to reap."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as groups:
            group = next((line.strip()[3:] for line in groups if line.startswith("0::")), "")
    except (OSError, IndexError, ValueError):
        return False
    with _CGROUP_LOCK:
        own = _cgroups[0] if _cgroups else None
    if parent != os.getpid() or own is None:
        return False
    group = group.removesuffix(" (deleted)")  # a zombie names the cgroup it left, removed or not
    name = group.rsplit("/", 1)[-1]
    inside = group.startswith(own[1] + "/w") and group.count("/") == own[1].count("/") + 1
    worker = name[1:].split("-", 1)[0]
    return inside and worker != str(pid) and (path is None or name == path.name)


def reap_strays() -> int:
    """Reap the zombies of this process's children that a job left (a ``CLONE_PARENT`` child of a worker is the
    worker's parent's child): those that were in a worker's cgroup and are not that worker. No other child is
    touched, so each ``subprocess.Popen`` of ours still reaps its own. Costs one system call when no child of ours
    is a zombie; a scan of ``/proc`` otherwise. Returns how many were reaped."""
    with _CGROUP_LOCK:
        if not _cgroups or _cgroups[0] is None:  # no worker cgroups: no child of ours is known to be a job's
            return 0
    try:
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return 0
    except ChildProcessError:
        return 0
    reaped = 0
    me = os.getpid()
    for pid, (parent, state) in _processes().items():
        if parent == me and state == "Z" and _is_stray(pid):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
                reaped += 1
    return reaped


def remove_cgroups() -> None:
    """At the parent's end: remove its (then empty) cgroup of workers' cgroups."""
    with _CGROUP_LOCK:
        own = _cgroups[0] if _cgroups else None
    if own is not None:
        with contextlib.suppress(OSError):
            own[0].rmdir()
