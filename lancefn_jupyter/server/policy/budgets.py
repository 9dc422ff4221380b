"""A namespace's daily budget (docs/ARCHITECTURE.md, "Budgets"): ``max_gpu_hours_per_day`` and ``max_cost_per_day``
in the API-key file; what it spent today (UTC), from its ended jobs' usage ("Cost"); past it, its new jobs wait.
Pure bookkeeping: the plane adds each ended job and asks which namespaces are over."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Budget", "Spend", "utc_day"]

_DAY_MS = 86_400_000


def utc_day(ms: float) -> int:
    """The UTC day (days since the epoch) of epoch ms ``ms``."""
    return int(ms // _DAY_MS)


@dataclass(frozen=True)
class Budget:
    gpu_hours: float | None = None  # max_gpu_hours_per_day
    cost: float | None = None  # max_cost_per_day (in the classes' currency)


@dataclass
class Spend:
    """Each namespace's GPU-seconds and cost today (UTC)."""

    budgets: Mapping[str, Budget]
    day: int = field(default_factory=lambda: utc_day(time.time() * 1000))
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def add(self, namespace: str, usage: Mapping[str, Any], finished_ms: float) -> None:
        """An ended job's usage, counted on the day it ended (only today's count)."""
        if namespace not in self.budgets or utc_day(finished_ms) != self.day:
            return
        self.gpu_seconds[namespace] = self.gpu_seconds.get(namespace, 0.0) + float(usage.get("gpu_seconds", 0.0))
        self.cost[namespace] = self.cost.get(namespace, 0.0) + float(usage.get("cost", 0.0))

    def roll(self, now_ms: float) -> bool:
        """A new UTC day: every count starts at 0 (True when it did)."""
        day = utc_day(now_ms)
        if day == self.day:
            return False
        self.day, self.gpu_seconds, self.cost = day, {}, {}
        return True

    def over(self, namespace: str, now_ms: float) -> str | None:
        """Why the namespace's new jobs wait (the budget it used up and when it resets), or None."""
        budget = self.budgets.get(namespace)
        if budget is None:
            return None
        hours, cost = self.gpu_seconds.get(namespace, 0.0) / 3600, self.cost.get(namespace, 0.0)
        if budget.gpu_hours is not None and hours >= budget.gpu_hours:
            used = f"{hours:.3g} of its {budget.gpu_hours:g} GPU-hours today (max_gpu_hours_per_day)"
        elif budget.cost is not None and cost >= budget.cost:
            used = f"{cost:.3g} of its {budget.cost:g} cost today (max_cost_per_day)"
        else:
            return None
        left_min = max(1, round(((self.day + 1) * _DAY_MS - now_ms) / 60_000))
        return (
            f"over budget: namespace {namespace!r} used {used}; new jobs wait until it resets at 00:00 UTC "
            f"(in {left_min // 60} h {left_min % 60} min)"
        )
