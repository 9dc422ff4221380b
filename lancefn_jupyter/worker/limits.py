"""A worker held to its version's CPU and memory (docs/ARCHITECTURE.md, "Compute resources"), the parent's side.

Where the worker's cgroup (v2, "Job processes") may enable the ``memory`` and ``cpu`` controllers, the kernel holds it:
``memory.max`` (past it the kernel kills the worker: ``memory.events`` counts an ``oom_kill``) and ``cpu.max`` (a
quota of ``cpu`` cores per period). Elsewhere (no cgroup, or controllers not offered to ours, as in most containers)
the nearest fallback: the worker's threads are pinned to ``ceil(cpu)`` CPUs (``sched_setaffinity``; threads it starts
later inherit it), and its memory is watched: the parent reads its resident memory (with that of the processes in its
cgroup) about once a second while a job runs and kills it past ``memory``, and the worker reports its peak (RSS high
water mark) with each outcome, so a quick job that went over between two looks still fails. Standard library only.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

__all__ = ["Held", "hold", "memory_used", "oom_killed", "peak_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CPU_PERIOD_US = 100_000
_next_cpu = itertools.count()  # spreads pinned workers over the CPUs


class Held:
    """How a worker is held: by its cgroup's controllers (``kernel``) or the fallback; what it was given."""

    __slots__ = ("cpu", "kernel_cpu", "kernel_memory", "memory")

    def __init__(self, cpu: float | None, memory: int | None, kernel_cpu: bool, kernel_memory: bool) -> None:
        self.cpu, self.memory = cpu, memory
        self.kernel_cpu, self.kernel_memory = kernel_cpu, kernel_memory


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


def hold(pid: int, cgroup: Path | None, cpu: float | None, memory: int | None) -> Held:
    """Hold the worker ``pid`` (idle: before it runs the task) to ``cpu`` cores and ``memory`` bytes."""
    kernel_cpu = kernel_memory = False
    if cgroup is not None and memory is not None and _enable(cgroup, "memory"):
        try:
            (cgroup / "memory.max").write_text(str(memory))
            if (cgroup / "memory.swap.max").exists():  # held in memory, not moved to swap
                (cgroup / "memory.swap.max").write_text("0")
            kernel_memory = True
        except OSError:
            pass
    if cgroup is not None and cpu is not None and _enable(cgroup, "cpu"):
        try:
            (cgroup / "cpu.max").write_text(f"{max(1000, round(cpu * _CPU_PERIOD_US))} {_CPU_PERIOD_US}")
            kernel_cpu = True
        except OSError:
            pass
    if cpu is not None and not kernel_cpu:
        _pin(pid, cpu)
    return Held(cpu, memory, kernel_cpu, kernel_memory)


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


def oom_killed(cgroup: Path | None) -> bool:
    """Whether the kernel killed a process of the cgroup for passing its ``memory.max``."""
    if cgroup is None:
        return False
    try:
        for line in (cgroup / "memory.events").read_text().splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill":
                return int(count) > 0
    except (OSError, ValueError):
        pass
    return False
