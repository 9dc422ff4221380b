"""A worker held to its version's CPU and memory (docs/ARCHITECTURE.md, "Compute resources"), the parent's side.

Where the worker's cgroup (v2, "Job processes") may enable the ``memory`` and ``cpu`` controllers, the kernel holds it:
``memory.max`` (past it the kernel kills the worker: ``memory.events`` counts an ``oom_kill``) and ``cpu.max`` (a
quota of ``cpu`` cores per period). Where v2 offers no memory controller but the v1 ``memory`` hierarchy is mounted
and ours to write (a host on the hybrid layout), the worker joins a v1 memory cgroup of its own whose
``memory.limit_in_bytes`` holds it the same way (``memory.oom_control`` counts the ``oom_kill``);
``LANCEFN_CGROUP_V1=0`` keeps to v2 and the fallback. Elsewhere (no cgroup, or controllers not offered to ours, as in
most containers) the nearest fallback: the worker's threads are pinned to ``ceil(cpu)`` CPUs (``sched_setaffinity``; threads it starts
later inherit it), and its memory is watched: the parent reads its resident memory (with that of the processes in its
cgroup) about once a second while a job runs and kills it past ``memory``, and the worker reports its peak (RSS high
water mark) with each outcome, so a quick job that went over between two looks still fails. Standard library only (and ``reap``).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from pathlib import Path

from lancefn_jupyter.worker import reap

__all__ = ["Held", "hold", "memory_used", "oom_killed", "peak_held", "peak_rss", "release"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CPU_PERIOD_US = 100_000
_next_cpu = itertools.count()  # spreads pinned workers over the CPUs
_next_v1 = itertools.count()  # numbers v1 memory cgroups: a reused pid never meets its predecessor's
_swept: list[bool] = []  # whether the stale v1 memory cgroups were swept (once per process)


class Held:
    """How a worker is held: by its cgroup's controllers (``kernel``) or the fallback; what it was given; ``v1``: the
    v1 memory cgroup of its own that holds its memory, if that is how."""

    __slots__ = ("cpu", "kernel_cpu", "kernel_memory", "memory", "v1")

    def __init__(
        self, cpu: float | None, memory: int | None, kernel_cpu: bool, kernel_memory: bool, v1: Path | None = None
    ) -> None:
        self.cpu, self.memory = cpu, memory
        self.kernel_cpu, self.kernel_memory = kernel_cpu, kernel_memory
        self.v1 = v1


def _v1_memory_root() -> Path | None:
    """This process's own directory in the cgroup v1 ``memory`` hierarchy, where it is mounted; else None."""
    if os.environ.get("LANCEFN_CGROUP_V1", "1") == "0":
        return None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            fields = (line.split() for line in mounts)
            mount = next((f[1] for f in fields if f[2:3] == ["cgroup"] and "memory" in f[3].split(",")), None)
        with open("/proc/self/cgroup", encoding="utf-8") as groups:
            parts = (line.strip().split(":", 2) for line in groups)
            own = next((p[2] for p in parts if len(p) == 3 and "memory" in p[1].split(",")), None)
    except OSError:
        return None
    return Path(mount) / own.lstrip("/") if mount is not None and own is not None else None


def _hold_v1_memory(pid: int, memory: int) -> Path | None:
    """Move ``pid`` into a new v1 memory cgroup limited to ``memory`` bytes (swap included where the kernel counts
    it); None where none can be made (not ours to write)."""
    root = _v1_memory_root()
    if root is None:
        return None
    if not _swept:  # once: the empty cgroups of a server that was killed (``lancefn-w<pid>-<its pid>-<n>``) go
        _swept.append(True)
        for stale in root.glob("lancefn-w*-*-*"):
            owner = stale.name.split("-")[2]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                with contextlib.suppress(OSError):
                    stale.rmdir()
    # memsw (where swap is counted): held in memory, not moved to swap
    limit = {"memory.limit_in_bytes": str(memory), "memory.memsw.limit_in_bytes": str(memory)}
    return reap.new_cgroup(root / f"lancefn-w{pid}-{os.getpid()}-{next(_next_v1)}", pid, limit)


def release(held: Held | None) -> None:
    """The worker left (or moved on from) how ``held`` held it: its v1 memory cgroup goes once empty."""
    if held is not None and held.v1 is not None:
        with contextlib.suppress(OSError):  # still holding a process of its job: the sweep of its v2 cgroup ends it
            held.v1.rmdir()


def _enable(cgroup: Path, controller: str) -> bool:
    """Whether ``controller`` works in ``cgroup`` (enabled for it in its parent's ``cgroup.subtree_control``)."""
    parent = cgroup.parent
    try:
        if controller not in (parent / "cgroup.controllers").read_text().split():
            return False
        if controller not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text(f"+{controller}")
        return (cgroup / f"{controller}.max").exists()
    except OSError:
        return False


def _pin(pid: int, cpu: float) -> None:
    """Every thread of ``pid`` on ``ceil(cpu)`` of the CPUs this process may use (none when that is all of them)."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return
    count = math.ceil(cpu)
    if count >= len(allowed):
        return
    start = next(_next_cpu) * count
    chosen = {allowed[(start + i) % len(allowed)] for i in range(count)}
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, chosen)
        except OSError:  # a thread that ended meanwhile
            pass


def hold(pid: int, cgroup: Path | None, cpu: float | None, memory: int | None, v1: Path | None = None) -> Held:
    """Hold the worker ``pid`` (idle: before it runs the task) to ``cpu`` cores and ``memory`` bytes; ``v1``: the v1
    memory cgroup already holding it (it moved to a fresh v2 cgroup: it stays in that one)."""
    kernel_cpu = kernel_memory = False
    if cgroup is not None and memory is not None and _enable(cgroup, "memory"):
        try:
            (cgroup / "memory.max").write_text(str(memory))
            if (cgroup / "memory.swap.max").exists():  # held in memory, not moved to swap
                (cgroup / "memory.swap.max").write_text("0")
            kernel_memory = True
        except OSError:
            pass
    if memory is not None and not kernel_memory:
        v1 = v1 or _hold_v1_memory(pid, memory)
        kernel_memory = v1 is not None
    else:
        v1 = None
    if cgroup is not None and cpu is not None and _enable(cgroup, "cpu"):
        try:
            (cgroup / "cpu.max").write_text(f"{max(1000, round(cpu * _CPU_PERIOD_US))} {_CPU_PERIOD_US}")
            kernel_cpu = True
        except OSError:
            pass
    if cpu is not None and not kernel_cpu:
        _pin(pid, cpu)
    return Held(cpu, memory, kernel_cpu, kernel_memory, v1)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def memory_used(pid: int, cgroup: Path | None) -> int:
    """Resident bytes of the worker and the processes in its cgroup (its job's children included)."""
    if cgroup is not None:
        try:
            pids = {int(p) for p in (cgroup / "cgroup.procs").read_text().split()} | {pid}
        except (OSError, ValueError):
            pids = {pid}
        return sum(_rss(p) for p in pids)
    return _rss(pid)


def peak_rss(pid: int) -> int:
    """The worker's resident high water mark in bytes (``VmHWM``): what it held at most, between two looks too."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def oom_killed(cgroup: Path | None, held: Held | None = None) -> bool:
    """Whether the kernel killed a process of the worker's cgroup for passing its ``memory.max`` (or of its v1 memory
    cgroup, for passing its ``memory.limit_in_bytes``)."""
    for path, events in ((cgroup, "memory.events"), (held.v1 if held else None, "memory.oom_control")):
        if path is None:
            continue
        try:
            for line in (path / events).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "oom_kill" and int(count) > 0:
                    return True
        except (OSError, ValueError):
            pass
    return False


def peak_held(held: Held | None) -> int:
    """The most bytes the kernel saw the worker's v1 memory cgroup hold (0 without one): what a killed job used."""
    if held is None or held.v1 is None:
        return 0
    try:
        return int((held.v1 / "memory.max_usage_in_bytes").read_text())
    except (OSError, ValueError):
        return 0
