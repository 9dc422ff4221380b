"""Pure text and HTML renderings of classes, jobs, versions and function cards (runs in the kernel).

These are the `text/plain` and `text/html` parts of every rich repr and widget fallback, so a
notebook reads well in nbconvert, GitHub and VS Code too. No I/O, no ipywidgets.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lancefn_jupyter.wire.models import (
    FunctionVersion,
    GpuClass,
    GpuUsage,
    Job,
    JobPlacement,
    JobState,
    display_state,
)
from lancefn_jupyter.wire.setup_part import setup_part

__all__ = [
    "STATE_COLORS",
    "duration_text",
    "expected_start_text",
    "format_bytes",
    "format_elapsed",
    "function_card",
    "gpu_classes_table",
    "gpu_memory",
    "job_card",
    "job_elapsed_s",
    "job_summary",
    "model_text",
    "one_line",
    "progress_text",
    "queue_text",
    "render_table",
    "result_text",
    "setup_text",
    "state_badge_html",
    "usage_line",
    "usage_table",
    "versions_table",
]

STATE_COLORS = {  # by the word shown (`display_state`)
    display_state(state): colour
    for state, colour in (
        (JobState.PENDING, "#b26b00"),
        (JobState.IN_PROGRESS, "#1565c0"),
        (JobState.DONE, "#2e7d32"),
        (JobState.FAILED, "#c62828"),
        (JobState.CANCELLED, "#616161"),
        (JobState.TIMED_OUT, "#ad1457"),
    )
}


def format_bytes(n: int) -> str:
    """Binary units, as GPU memory is sold: 85899345920 → '80 GiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def gpu_memory(n: int) -> str:
    """A class's GPU memory for display; 0 means the config (e.g. a simulated class) did not say."""
    return format_bytes(n) if n > 0 else "memory not reported"


def model_text(gpu: GpuClass) -> str:
    """A class's GPU model, marked "(simulated)" unless its name already says so ("Simulated GPU (numba …)")."""
    said = "simulat" in gpu.gpu_model.lower()
    return gpu.gpu_model + (" (simulated)" if gpu.simulated and not said else "")


def format_elapsed(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def job_elapsed_s(job: Job, now_ms: float | None = None) -> float | None:
    """Run time so far (running) or in total (ended); None while pending."""
    if job.started_ms is None:
        return None
    end = job.finished_ms if job.finished_ms is not None else (now_ms if now_ms is not None else time.time() * 1000)
    return (end - job.started_ms) / 1000


def _half_up(x: float) -> int:
    """Rounds .5 up, as JavaScript's Math.round: the panel's mirror (format.ts) words the same wait alike."""
    return math.floor(x + 0.5)


def duration_text(seconds: float) -> str:
    """A time to come in the front ends' one wording: "40 s", "8 min", "1.5 h" (the panel's `durationText`)."""
    if seconds < 90:
        return f"{max(_half_up(seconds), 0)} s"
    if seconds < 90 * 60:
        return f"{_half_up(seconds / 60)} min"
    return f"{_half_up(seconds / 360) / 10:.1f} h"


def expected_start_text(expected_start_ms: int | None, now_ms: float | None = None, uncertain: bool = False) -> str:
    """ "starts in about 40 s" from a placement's `expected_start_ms` ("start time unknown" when None;
    "start time uncertain (best guess 40 s)" when `expected_start_uncertain`)."""
    if expected_start_ms is None:
        return "start time unknown"
    wait_s = (expected_start_ms - (now_ms if now_ms is not None else time.time() * 1000)) / 1000
    after = duration_text(wait_s)
    if uncertain:
        return f"start time uncertain (best guess {after})"
    return "starts any moment" if wait_s < 1.5 else f"starts in about {after}"


def queue_text(placement: JobPlacement, now_ms: float | None = None) -> str:
    """A pending job's place and estimate, the one wording of every front end (the panel's `queueText` in
    format.ts mirrors it, tested on the same cases): "position 2, starts in about 40 s"; "position 2" when the
    control plane offers no estimate (CPU jobs, Ray); "" without a queue position."""
    if placement.queue_position is None:
        return ""
    text = f"position {placement.queue_position}"
    if placement.num_gpus and "expected_start_ms" in placement.model_fields_set:
        uncertain = placement.expected_start_uncertain
        text += f", {expected_start_text(placement.expected_start_ms, now_ms, uncertain=uncertain)}"
    return text


def job_summary(job: Job) -> str:
    """One line saying what the job is doing, in the user's words."""
    state = display_state(job.job_state)
    placement = job.placement
    if job.job_state == JobState.PENDING:
        where = placement.gpu_class or "default"
        queue = queue_text(placement)
        position = f", {queue}" if queue else ""
        if placement.waiting_on_capacity:
            return f"pending: waiting for GPU capacity in class {where}{position}"
        return f"pending{position}"
    if job.job_state == JobState.IN_PROGRESS:
        devices = ",".join(placement.devices) or "no GPU"
        elapsed = job_elapsed_s(job)
        return f"running on {placement.gpu_class or 'cpu'} [{devices}]" + (
            f" for {format_elapsed(elapsed)}" if elapsed is not None else ""
        )
    if job.failure is not None:
        return f"{state} ({job.failure.phase}): {job.failure.message}"
    elapsed = job_elapsed_s(job)
    summary = state + (f" in {format_elapsed(elapsed)}" if elapsed is not None else "")
    if job.job_state == JobState.DONE and job.result is not None:
        from lancefn_jupyter.wire.versions import nonfinite_text

        nonfinite = nonfinite_text(job.result)  # a function that silently produced NaNs shows at a glance
        if nonfinite:
            summary += f"; results hold {nonfinite}"
    result = result_text(job) if job.result_format == "arrow" else ""  # small JSON values: the result column
    return f"{summary} → {result}" if result else summary


def _describe_summary(summary: dict) -> str:
    kind = summary.get("type", "?")
    if kind == "list" and "item" in summary:
        # The rows' own summary, then their bytes in all (an older item's nbytes was its first row's only).
        item = {key: value for key, value in summary["item"].items() if key != "nbytes"}
        text = f"list of {summary.get('shape', ['?'])[0]} × {_describe_summary(item)}"
        return text + (f", {format_bytes(summary['items_nbytes'])} in all" if summary.get("items_nbytes") else "")
    parts = [kind]
    if summary.get("dtype"):
        dtype = str(summary["dtype"])
        parts.append(dtype if len(dtype) <= 40 else dtype[:39] + "…")
    if summary.get("shape") is not None:
        parts.append(
            "(" + ", ".join(str(n) for n in summary["shape"]) + ("," if len(summary["shape"]) == 1 else "") + ")"
        )
    elif summary.get("shape_varies"):
        parts.append("of varying shapes")
    text = " ".join(parts)
    if summary.get("nbytes"):
        text += f", {format_bytes(summary['nbytes'])}"
    counts = summary.get("nonfinite")
    if isinstance(counts, dict):  # the same words as versions.nonfinite_text for JSON results
        found = [
            f"{counts.get(k)} {label}"
            for k, label in (("nan", "NaN"), ("inf", "+Inf"), ("-inf", "-Inf"))
            if counts.get(k)
        ]
        text += f"; holds {', '.join(found)} of {counts.get('floats')} floats"
    return text


def result_text(job: Job) -> str:
    """A finished job's result in a few words (type, dtype, shape, bytes): never the data itself."""
    if job.job_state != JobState.DONE or job.job_type != "run_function":
        return ""
    if job.result_format == "arrow" and isinstance(job.result_summary, dict):
        text = _describe_summary(job.result_summary)
        if job.result_summary.get("committed"):
            return text + " (committed into its table)"  # a backfill's chunk: its rows are in the table
        return text + (" (removed by retention)" if job.result_summary.get("expired") else "")
    results = job.result
    if not isinstance(results, list):
        return ""
    if len(results) == 1:
        value = results[0]
        if isinstance(value, (list, dict, str)) and len(value) > 40:  # never repr a big value
            return f"{type(value).__name__} of {len(value)}"
        text = repr(value)
        return (
            text
            if len(text) <= 40
            else f"{type(value).__name__} of {len(value)}"
            if hasattr(value, "__len__")
            else text[:39] + "…"
        )
    return f"list of {len(results)}"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str = "") -> tuple[str, str]:
    """(text, html) of a simple table; cells are plain strings (escaped for HTML here)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = [title] if title else []
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if not rows:
        lines.append("(none)")
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td style='padding:2px 8px'>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    caption = f"<b>{html.escape(title)}</b>" if title else ""
    empty = "<i>none</i>" if not rows else ""
    markup = (
        f"<div class='lancefn'>{caption}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{empty}</div>"
    )
    return "\n".join(lines), markup


def host_resources(gpu: GpuClass) -> str:
    """A class's host CPU and memory ("Compute resources"): one GPU's share and the node's totals, as configured."""
    parts = []
    if gpu.cpu_per_gpu is not None or gpu.memory_bytes_per_gpu is not None:
        share = [f"{gpu.cpu_per_gpu:g} CPU" if gpu.cpu_per_gpu is not None else ""]
        share.append(format_bytes(gpu.memory_bytes_per_gpu) if gpu.memory_bytes_per_gpu is not None else "")
        parts.append(" + ".join(part for part in share if part) + " per GPU")
    if gpu.node_cpu is not None or gpu.node_memory_bytes is not None:
        node = [f"{gpu.node_cpu:g} CPUs" if gpu.node_cpu is not None else ""]
        node.append(format_bytes(gpu.node_memory_bytes) if gpu.node_memory_bytes is not None else "")
        parts.append("node " + ", ".join(part for part in node if part))
    return "; ".join(parts) or "-"


def usage_table(rows: Iterable[Mapping[str, Any]], by: str) -> tuple[str, str]:
    """``%gpu_usage``: per group, jobs, GPU- and CPU-hours held and the cost (docs/ARCHITECTURE.md, "Cost")."""
    from lancefn_jupyter.kernel.display.timings import format_money

    table = [
        [
            str(row["key"]),
            str(row["jobs"]),
            f"{row['gpu_seconds'] / 3600:.3g}",
            f"{row['cpu_seconds'] / 3600:.3g}",
            format_money(row["cost"], row.get("currency") or "USD") if "cost" in row else "-",
        ]
        for row in rows
    ]
    return render_table([by, "jobs", "GPU-hours", "CPU-hours", "cost"], table, title=f"GPU usage by {by}")


def gpu_classes_table(classes: Iterable[GpuClass], usage: Iterable[GpuUsage] = ()) -> tuple[str, str]:
    by_name = {u.name: u for u in usage}
    scaled = any(u.nodes_max is not None for u in by_name.values())  # a nodes column where an autoscaler scales
    rows = []
    for gpu in classes:
        u = by_name.get(gpu.name)
        rows.append(
            [
                gpu.name,
                model_text(gpu),
                gpu_memory(gpu.gpu_memory_bytes),
                str(gpu.max_gpu_count_per_worker),
                gpu.resource_name,
                ",".join(f"{k}={v}" for k, v in sorted(gpu.node_selector.items())) or "-",
                str(u.gpus_busy) if u else "?",
                f"{u.gpus_total - u.gpus_busy}/{u.gpus_total}" if u else "?",
                f"{u.jobs_running}/{u.jobs_pending}" if u else "?",
                host_resources(gpu),
                *([(u.nodes_text() or "-") if u else "?"] if scaled else []),
            ]
        )
    return render_table(
        [
            "class",
            "GPU model",
            "memory",
            "max GPUs/worker",
            "resource",
            "node selector",
            "busy",
            "free/total",
            "running/pending",
            "CPU, memory",
            *(["nodes"] if scaled else []),
        ],
        rows,
        title="GPU classes",
    )


def usage_line(gpu_class: str, usage: GpuUsage | None) -> str:
    """One class's live use in words, e.g. 'class default: 1 busy, 1 free of 2 GPUs; 1 running, 0 pending'."""
    if usage is None:
        return f"class {gpu_class}: live usage unknown"
    free = usage.gpus_total - usage.gpus_busy
    nodes = usage.nodes_text()
    return (
        f"class {gpu_class}: {usage.gpus_busy} busy, {free} free of {usage.gpus_total} GPUs; "
        f"{usage.jobs_running} running, {usage.jobs_pending} pending" + (f"; {nodes}" if nodes else "")
    )


def progress_text(job: Job) -> str:
    """'2/3 rows (67%)'."""
    done, total = job.progress.rows_done, job.progress.rows_total
    pct = 100 * done / total if total else (100 if job.job_state == JobState.DONE else 0)
    return f"{done}/{total} rows ({pct:.0f}%)"


def function_ref(job: Job) -> str:
    spec = job.spec
    name, version = spec.get("name", "?"), spec.get("version")
    return f"{name}@{version}" if version else str(name)


def versions_table(listings: Iterable[tuple[str, str, FunctionVersion | None]]) -> tuple[str, str]:
    rows = []
    for name, version, definition in listings:
        if definition is not None:
            runtime = definition.runtime
            resources = runtime.resources
            gpus = str(resources.num_gpus) if resources else "0"
            gpu_class = (resources.gpu_class if resources else None) or ("default" if resources else "cpu")
            rows.append([name, version, definition.artifact.digest[:19], gpus, gpu_class, definition.created_at])
        else:
            rows.append([name, version, "", "", "", ""])
    return render_table(["function", "version", "digest", "GPUs", "class", "created"], rows, title="Function versions")


def one_line(text: str, limit: int = 60) -> str:
    """`text`'s first line, at most `limit` characters (… marks a cut)."""
    stripped = text.strip()
    first = stripped.splitlines()[0] if stripped else ""
    if first == stripped and len(first) <= limit:
        return first
    return first[: limit - 1].rstrip() + "…"


def function_card(
    *,
    name: str,
    version: str | None,
    digest: str,
    runtime_kind: str,
    num_gpus: int,
    gpu_class: str | None,
    environment: str,
    hardware: GpuClass | None,
    cpu: str | None = None,
    memory: str | None = None,
    note: str = "",
    entry: str = "",
    left_out: str = "",
    batched: bool = False,
    setup: str = "",
    secrets: str = "",
) -> tuple[str, str]:
    """What `%%gpu_function` shows: identity, runtime, resources and the class's hardware; `secrets`: the bound secrets'
    names (never values; docs/ARCHITECTURE.md, "Secrets").

    `entry` describes a class entry (``class Scaler: setup once per worker``); `left_out` names the cell's
    statements the artifact leaves out (docs/ARCHITECTURE.md, "Function versions"), so none is lost unseen.
    `batched`: the entry takes a chunk's rows in one call (docs/ARCHITECTURE.md, "Batched functions").
    `setup`: which part of the cell counts as setup (`setup_text`, docs/ARCHITECTURE.md, "Setup reuse").
    """
    hw = "unknown class"
    if hardware is not None:
        hw = f"{hardware.gpu_model}, {gpu_memory(hardware.gpu_memory_bytes)}, up to {hardware.max_gpu_count_per_worker} GPUs/worker"
        hw += model_text(hardware).removeprefix(hardware.gpu_model)  # " (simulated)" where the model does not say it
    fields = [
        ("version", version or "(not registered)"),
        ("digest", digest[:19]),
        ("runtime", runtime_kind),
        (
            "resources",
            f"{num_gpus} GPU{'s' if num_gpus != 1 else ''} of class {gpu_class or 'default'}"
            + "".join(f", {key}={value}" for key, value in (("cpu", cpu), ("memory", memory)) if value),
        ),
        ("environment", environment),
        ("hardware", hw),
    ]
    if setup:
        fields.append(("setup", setup))
    if secrets:
        fields.insert(5, ("secrets", secrets))
    if batched:
        fields.insert(0, ("calls", "batched: one call per chunk of rows"))
    if entry:
        fields.insert(0, ("entry", entry))
    remarks = [f"left out: {left_out}"] if left_out else []
    if note:
        remarks.append(note)
    text = "\n".join([f"GPU function {name}"] + [f"  {k:<12}{v}" for k, v in fields] + [f"  {r}" for r in remarks])
    rows = "".join(
        f"<tr><td style='padding:1px 8px;color:#666'>{html.escape(k)}</td><td style='padding:1px 8px'><code>{html.escape(v)}</code></td></tr>"
        for k, v in fields
    )
    extra = "".join(f"<div style='color:#666'>{html.escape(remark)}</div>" for remark in remarks)
    markup = (
        "<div class='lancefn lancefn-card' style='border:1px solid #ccc;border-radius:4px;padding:6px;display:inline-block'>"
        f"<b>GPU function <code>{html.escape(name)}</code></b><table>{rows}</table>{extra}</div>"
    )
    return text, markup


def state_badge_html(state: str) -> str:
    color = STATE_COLORS.get(state, "#444")
    return (
        f"<span class='lancefn-state lancefn-state-{state.replace(' ', '-')}' "
        f"style='background:{color};color:white;border-radius:3px;padding:0 6px'>{html.escape(state)}</span>"
    )


def job_card(job: Job) -> tuple[str, str]:
    state = display_state(job.job_state)
    progress = job.progress
    text = f"Job {job.job_id} {function_ref(job)}: {job_summary(job)} — {progress.rows_done}/{progress.rows_total} rows"
    pct = 100 * progress.rows_done / progress.rows_total if progress.rows_total else 0
    markup = (
        f"<div class='lancefn lancefn-job'>{state_badge_html(state)} <code>{html.escape(job.job_id)}</code> "
        f"{html.escape(function_ref(job))} — {html.escape(job_summary(job))} "
        f"<progress value='{progress.rows_done}' max='{max(progress.rows_total, 1)}'></progress> "
        f"{progress.rows_done}/{progress.rows_total} ({pct:.0f}%)</div>"
    )
    return text, markup


def setup_text(source: str, entrypoint: str, state: str | None, reuse_setup: str | None) -> str:
    """Which part of the cell counts as setup (docs/ARCHITECTURE.md, "Setup reuse"): "setup: module statements,
    Model.setup, load (edits elsewhere keep the worker)" (the card's ``setup`` line); "" where no worker is kept across versions."""
    if state == "per_job" or reuse_setup == "no":
        return ""
    part = setup_part(source, entrypoint)
    if part is None:
        return ""
    names = ", ".join(("module statements", *part.setup))
    return f"{names} (edits elsewhere keep the worker)"
