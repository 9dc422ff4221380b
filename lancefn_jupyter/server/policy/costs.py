"""What a job held and what it cost (docs/ARCHITECTURE.md, "Cost"), and sums of it. Pure.

A job holds its worker from the worker's start (``timings.start_ms``: a process started for it; 0 when one was
idle) through its run, setup included, to its end (``started_ms`` → ``finished_ms``): ``held_s``. Its GPU-seconds are
``held_s × num_gpus``, its CPU-seconds ``held_s × `` the cores it asked for (a CPU function: its cores, else 1); its cost
those hours times its class's ``price_per_gpu_hour`` and ``price_per_cpu_hour`` (a CPU function: the default
class's), in the class's ``currency``."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.wire.models import GpuClass

__all__ = ["BY", "GPU_STATS", "held_seconds", "job_usage", "since_ms", "sum_usage", "usage_key"]

BY = ("namespace", "version", "class", "day", "batch")
GPU_STATS = ("gpu_memory_peak_bytes", "gpu_util_mean_pct")  # a job's real GPUs' use, with its timings and usage


def held_seconds(
    started_ms: float | None, finished_ms: float | None, timings: Mapping[str, Any] | None
) -> float | None:
    """Seconds a job held its worker, worker start included; None for a job that never ran on one."""
    if started_ms is None or finished_ms is None:
        return None
    start_ms = (timings or {}).get("start_ms") or 0.0
    return max(0.0, (finished_ms - started_ms + float(start_ms)) / 1000.0)


def job_usage(held_s: float, num_gpus: int, cpu: float, prices: GpuClass | None) -> dict[str, Any]:
    """A job's ``usage`` wire form: ``held_s``, ``gpu_seconds``, ``cpu_seconds``, and ``cost`` / ``currency`` when its
    class has prices."""
    gpu_s, cpu_s = held_s * num_gpus, held_s * cpu
    usage: dict[str, Any] = {"held_s": round(held_s, 3), "gpu_seconds": round(gpu_s, 3), "cpu_seconds": round(cpu_s, 3)}
    if prices is not None and (prices.price_per_gpu_hour is not None or prices.price_per_cpu_hour is not None):
        cost = gpu_s / 3600 * (prices.price_per_gpu_hour or 0.0) + cpu_s / 3600 * (prices.price_per_cpu_hour or 0.0)
        usage["cost"] = round(cost, 6)
        usage["currency"] = prices.currency
    return usage


def usage_key(by: str, *, namespace: str, spec: Mapping[str, Any], gpu_class: str | None, finished_ms: int) -> str:
    """The group a job's usage sums into for ``by`` (one of :data:`BY`)."""
    if by == "namespace":
        return namespace
    if by == "version":
        return f"{namespace}/{spec.get('name', '')}@{spec.get('version', '')}"
    if by == "class":
        return gpu_class or "cpu"
    if by == "batch":
        return str(spec.get("batch_id") or "-")
    return time.strftime("%Y-%m-%d", time.gmtime(finished_ms / 1000))


_SPANS = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}


def since_ms(text: str, now_ms: int) -> int:
    """``7d``, ``24h``, ``30m`` back from ``now_ms``, or a UTC date ``2026-12-01``: epoch ms; ValueError saying how."""
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in _SPANS:
        return now_ms - int(text[:-1]) * _SPANS[text[-1]]
    try:
        return int(calendar.timegm(time.strptime(text, "%Y-%m-%d")) * 1000)
    except ValueError:
        raise ValueError(
            f"since={text!r} is not a span or a date; write since=7d, since=24h or since=2026-12-01"
        ) from None


# Summed per group: what the jobs held, of which their worker starts, and their GPU- and CPU-seconds.
_SUMMED = ("held_s", "start_s", "gpu_seconds", "cpu_seconds")


def sum_usage(items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """``(key, usage)`` pairs summed per key, largest cost (then GPU-seconds) first."""
    sums: dict[str, dict[str, Any]] = {}
    for key, usage in items:
        row = sums.setdefault(key, {"key": key, "jobs": 0, "rows": 0} | dict.fromkeys(_SUMMED, 0.0))
        row["jobs"] += 1
        row["rows"] += int(usage.get("rows", 0))
        for field in _SUMMED:
            row[field] = round(row[field] + usage.get(field, 0.0), 3)
        if "cost" in usage:
            row["cost"] = round(row.get("cost", 0.0) + usage["cost"], 6)
            row["currency"] = usage["currency"]
    return sorted(sums.values(), key=lambda row: (-row.get("cost", 0.0), -row["gpu_seconds"], row["key"]))
