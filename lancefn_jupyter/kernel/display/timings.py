"""Where a job's time went, in words (pure; runs in the kernel): cold or warm (docs/ARCHITECTURE.md, "Warm state").

    cold start 1.2 s, setup 1.0 s        a job that started a worker and executed the version's module
    setup 350 ms                         a worker was idle but fresh for this version: only setup was paid
    setup reused from @1a2b3c, 2 ms      the idle worker of an earlier version with the same setup part ran it
                                         ("Setup reuse"): only the rebinding of the changed code was paid
    warm                                 an idle worker already held the version (``run=True``: "warm, ran 12 ms")
    ""                                   no timings (the job has not ended on a worker)

The job widget, the `%gpu_jobs` table and dashboard use these; the JupyterLab panel has the same rules in
labextension/src/timings.ts (keep the two in step).
"""

from __future__ import annotations

import math
from typing import Any

from lancefn_jupyter.wire.models import JobTimings

__all__ = ["format_money", "format_ms", "job_timings_text", "timings_breakdown", "timings_text"]

_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}


# (unit, milliseconds per tenth of it): a duration is said in the first unit it is under 60.0 of.
_UNITS = (("s", 100), ("min", 6000))


def format_ms(ms: float) -> str:
    """A duration in milliseconds: "<1 ms", "12 ms" under a second, "1.2 s" under a minute, "2.5 min", "1.1 h".

    Rounded half up (as the panel's timings.ts does), so 999.5 ms is "1.0 s" and 59.96 s is "1.0 min".
    """
    ms = max(0.0, float(ms)) if math.isfinite(ms) else 0.0
    if ms == 0:
        return "0 ms"
    whole = math.floor(ms + 0.5)
    if whole < 1:
        return "<1 ms"
    if whole < 1000:
        return f"{whole} ms"
    for unit, tenth in _UNITS:
        tenths = math.floor(ms / tenth + 0.5)
        if tenths < 600:
            return f"{tenths // 10}.{tenths % 10} {unit}"
    tenths = math.floor(ms / 360_000 + 0.5)
    return f"{tenths // 10}.{tenths % 10} h"


def timings_text(timings: JobTimings | None, *, run: bool = False) -> str:
    """Cold or warm in a few words: the start/environment/setup a job paid (only the non-zero parts), else "warm".

    ``run=True`` adds the run time ("warm, ran 12 ms"; nothing when the entry never ran). None → "".
    """
    if timings is None:
        return ""
    parts = [
        f"{label} {format_ms(value)}"
        for label, value in (
            ("cold start", timings.start_ms),
            ("environment", timings.environment_ms),
            ("setup", timings.setup_ms),
        )
        if value > 0
    ]
    if timings.setup_reused_from:
        parts.append(f"setup reused from @{timings.setup_reused_from[:6]}, {format_ms(timings.rebind_ms)}")
    if not parts:
        parts = ["cold start" if timings.cold else "warm"]
    if run and timings.run_ms > 0:
        parts.append(f"ran {format_ms(timings.run_ms)}")
    return ", ".join(parts)


def timings_breakdown(timings: JobTimings | None) -> str:
    """Every phase, for a tooltip: "queued 2.0 s · start 1.2 s · environment 0 ms · setup 1.0 s · run 12 ms"."""
    if timings is None:
        return ""
    return " · ".join(
        f"{label} {format_ms(value)}"
        for label, value in (
            ("queued", timings.queued_ms),
            ("start", timings.start_ms),
            ("environment", timings.environment_ms),
            ("setup", timings.setup_ms),
            ("run", timings.run_ms),
        )
    )


def format_money(amount: float, currency: str = "USD") -> str:
    """``0.0213, "USD"`` → ``"$0.021"``, ``12.5, "EUR"`` → ``"€12.50"``, ``3, "CHF"`` → ``"3.00 CHF"``."""
    text = f"{amount:.2f}" if amount >= 1 or amount == 0 else f"{amount:.2g}" if amount >= 0.01 else f"{amount:.1g}"
    symbol = _SYMBOLS.get(currency)
    return f"{symbol}{text}" if symbol else f"{text} {currency}"


def job_timings_text(job: Any, *, run: bool = False) -> str:
    """`timings_text` of a job's `timings` ("" for a job without, or a model from before timings), and its cost where
    its class has prices ("warm, ran 41 s · $0.02": docs/ARCHITECTURE.md, "Cost")."""
    text = timings_text(getattr(job, "timings", None), run=run)
    usage = getattr(job, "usage", None)
    if usage is None:
        return text
    parts = [text] if text else []
    if usage.cost is not None:
        parts.append(format_money(usage.cost, usage.currency or "USD"))
    if usage.gpu_memory_peak_bytes is not None:  # a real GPU's, sampled through NVML
        peak = usage.gpu_memory_peak_bytes / 2**30
        parts.append(f"GPU peak {peak:.1f} GiB, {usage.gpu_util_mean_pct or 0:.0f} % busy")
    return " · ".join(parts)
