"""Text and HTML of a batch (pure; runs in the kernel): progress over all rows, rows/s, time left, the chunk strip,
the failed chunk, and for a backfill the rows written and skipped with the first skipped rows' messages
(docs/ARCHITECTURE.md, "Backfills").  The widget (widgets/_batch.py) and `%gpu_jobs` use the same pieces."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from lancefn_jupyter.kernel.display.cards import duration_text, state_badge_html
from lancefn_jupyter.kernel.display.timings import format_money
from lancefn_jupyter.wire.batch_models import STRIP_STATES, BackfillError, Batch
from lancefn_jupyter.wire.models import TERMINAL_STATES, display_state

__all__ = [
    "SKIPPED_SHOWN",
    "STRIP_COLOURS",
    "STRIP_WIDTH",
    "backfill_line",
    "batch_card",
    "batch_cost_text",
    "batch_rate",
    "batch_summary",
    "skipped_lines",
    "strip_cells",
]

STRIP_WIDTH = 64  # cells; longer strips are folded, each cell then standing for several chunks
STRIP_COLOURS = {"p": "#c8c8c8", "r": "#2f7ed8", "d": "#3c9a3c", "f": "#d9534f", "c": "#8a6d3b"}
# Which state a folded cell shows: the one that most needs attention.
_PRIORITY = "fcrpd"
# The order chunk counts are said in: finished first, the failures last (chunks never time out).
_CHUNK_ORDER = ("DONE", "IN_PROGRESS", "PENDING", "FAILED", "CANCELLED")
SKIPPED_SHOWN = 3  # skipped rows a card lists (all of them: `backfill.errors()`)


def strip_cells(strip: str, width: int = STRIP_WIDTH) -> str:
    """The strip, folded to at most ``width`` cells (a cell shows its chunks' most urgent state)."""
    if len(strip) <= width:
        return strip
    size = -(-len(strip) // width)
    cells = []
    for start in range(0, len(strip), size):
        part = strip[start : start + size]
        cells.append(next(letter for letter in _PRIORITY if letter in part))
    return "".join(cells)


def batch_rate(batch: Batch, now_ms: float | None = None) -> tuple[float | None, float | None]:
    """(rows per second since the first chunk started, seconds left at that rate) — None when unknown."""
    if batch.started_ms is None or not batch.rows_done:
        return None, None
    end = batch.finished_ms if batch.finished_ms is not None else (now_ms if now_ms is not None else time.time() * 1000)
    elapsed = max((end - batch.started_ms) / 1000, 1e-3)
    rate = batch.rows_done / elapsed
    left = None if batch.batch_state in TERMINAL_STATES else (batch.rows_total - batch.rows_done) / rate
    return rate, left


def batch_cost_text(batch: Batch, left_s: float | None) -> str:
    """What is left and what was spent: "about 6 min and $0.42 left · $0.12 spent" — time left from the rows' rate so
    far, cost left from the cost per row of the chunks that ended (where the class has prices); either part alone
    when the other is unknown, "" when both are."""
    usage = batch.usage
    cost = usage.cost if usage is not None else None
    currency = (usage.currency if usage is not None else None) or "USD"
    parts = []
    if left_s is not None:
        rows_left = batch.rows_total - batch.rows_done
        if cost is not None and usage is not None and usage.rows:
            parts.append(
                f"about {duration_text(left_s)} and {format_money(cost / usage.rows * rows_left, currency)} left"
            )
        else:
            parts.append(f"about {duration_text(left_s)} left")
    if cost is not None:
        parts.append(f"{format_money(cost, currency)} spent")
    return " · ".join(parts)


def batch_summary(batch: Batch, now_ms: float | None = None) -> str:
    """`3 finished, 2 running, 4 pending of 9 chunks · 120 rows/s · about 5 s and $0.02 left · $0.04 spent`."""
    counts = batch.chunk_counts
    parts = [f"{counts[state]} {display_state(state)}" for state in _CHUNK_ORDER if counts.get(state)]
    text = f"{', '.join(parts)} of {batch.chunks_total} chunks"
    rate, left = batch_rate(batch, now_ms)
    if rate is not None:
        text += f" · {rate:,.1f} rows/s"
    cost = batch_cost_text(batch, left)
    if cost:
        text += f" · {cost}"
    if batch.reused_chunks:
        text += f" · {batch.reused_chunks} reused"
    return text


def _failure_text(batch: Batch) -> str:
    failure = batch.failure
    if failure is None:
        return ""
    return f"chunk {failure.chunk} (rows {failure.row_start}–{failure.row_end - 1}) failed in phase {failure.phase}: {failure.message}"


def _rows(n: int) -> str:
    return f"{n:,} row{'' if n == 1 else 's'}"


def backfill_line(batch: Batch) -> str:
    """`backfill of 'embedding': 998/1,000 rows written · 2 rows skipped` ("" for a batch that is no backfill)."""
    backfill = batch.backfill
    if backfill is None:
        return ""
    text = f"backfill of {backfill.into!r}: {backfill.rows_written:,}/{batch.rows_total:,} rows written"
    if backfill.on_error == "skip" or backfill.rows_skipped:
        text += f" · {_rows(backfill.rows_skipped)} skipped"
    if backfill.commit_failure:
        text += f" · commit failed: {backfill.commit_failure}"
    return text


def skipped_lines(batch: Batch, skipped: Sequence[BackfillError]) -> list[str]:
    """The first skipped rows, one line each (`row 17 (fragment 0, offset 17): ValueError: empty text`),
    and how to read the rest."""
    lines = [
        f"skipped row {e.row_id} (fragment {e.fragment}, offset {e.offset}): {e.message}"
        for e in skipped[:SKIPPED_SHOWN]
    ]
    total = batch.backfill.rows_skipped if batch.backfill is not None else len(skipped)
    if lines and total > len(lines):
        lines.append(f"… {_rows(total - len(lines))} more: backfill.errors() lists every one")
    return lines


def batch_state_text(batch: Batch) -> str:
    """The batch's state in words: ``paused`` while paused, else its job state's (pending, running, finished, …)."""
    return "paused" if batch.paused and batch.batch_state not in TERMINAL_STATES else display_state(batch.batch_state)


def batch_card(batch: Batch, now_ms: float | None = None, skipped: Sequence[BackfillError] = ()) -> tuple[str, str]:
    """Text and HTML of a batch; ``skipped``: a backfill's first skipped rows, to list under it."""
    state = batch_state_text(batch)
    pct = 100 * batch.rows_done / batch.rows_total if batch.rows_total else 0
    cells = strip_cells(batch.strip)
    ref = f"{batch.name}@{batch.version}"
    text = (
        f"Batch {batch.batch_id} {ref}: {state} — {batch.rows_done}/{batch.rows_total} rows ({pct:.0f}%)\n"
        f"  {batch_summary(batch, now_ms)}\n"
        f"  chunks [{cells}]  ({', '.join(f'{k}={v}' for k, v in STRIP_STATES.items())})"
    )
    extra = [line for line in (backfill_line(batch), *skipped_lines(batch, skipped)) if line]
    for line in extra:
        text += f"\n  {line}"
    failure = _failure_text(batch)
    if failure:
        text += f"\n  {failure}"
    strip_html = "".join(
        f"<span title='{STRIP_STATES[c]}' style='display:inline-block;width:8px;height:12px;margin-right:1px;background:{STRIP_COLOURS[c]}'></span>"
        for c in cells
    )
    markup = (
        f"<div class='lancefn lancefn-batch'>{state_badge_html(state)} batch <code>{html.escape(batch.batch_id)}</code> "
        f"{html.escape(ref)} <progress value='{batch.rows_done}' max='{max(batch.rows_total, 1)}'></progress> "
        f"{batch.rows_done}/{batch.rows_total} rows ({pct:.0f}%)<br>{html.escape(batch_summary(batch, now_ms))}"
        f"<div class='lancefn-batch-strip'>{strip_html}</div>"
        + "".join(f"<div class='lancefn-backfill'>{html.escape(line)}</div>" for line in extra)
        + (f"<div class='lancefn-error' style='color:#a94442'>{html.escape(failure)}</div>" if failure else "")
        + "</div>"
    )
    return text, markup


def batches_table(batches: list[Batch], now_ms: float | None = None) -> tuple[str, str]:
    """The batch rows `%gpu_jobs` shows above its jobs (text and HTML)."""
    from lancefn_jupyter.kernel.display.cards import render_table

    rows = []
    for batch in batches:
        rate, left = batch_rate(batch, now_ms)
        failure = batch.failure
        rows.append(
            [
                batch.batch_id,
                f"{batch.name}@{batch.version}",
                batch_state_text(batch),
                f"{batch.rows_done}/{batch.rows_total}"
                + (
                    f" · {batch.backfill.rows_skipped} skipped"
                    if batch.backfill and batch.backfill.rows_skipped
                    else ""
                ),
                f"[{strip_cells(batch.strip, 32)}]",
                f"{rate:,.1f}" if rate is not None else "",
                batch_cost_text(batch, left),
                f"chunk {failure.chunk} (rows {failure.row_start}–{failure.row_end - 1}): {failure.message}"
                if failure
                else "",
            ]
        )
    return render_table(
        ["batch", "function", "state", "rows", "chunks", "rows/s", "left, spent", "error"], rows, title="GPU batches"
    )
