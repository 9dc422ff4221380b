"""The batch widget: what `f.map(..., parallel=…)` and a `Batch` handle display.

    [running] batch 3f2a…  embed@5c1e…
    [██████░░░░] 640/1000 rows (64%) · 12 finished, 2 running, 6 pending of 20 chunks · 210 rows/s · 2s left
    ▮▮▮▮▮▮▮▮▮▮▮▮▮▮▯▯▯▯▯▯   (one cell per chunk, coloured by state)
    backfill of 'embedding': 998/1,000 rows written · 2 rows skipped      (a backfill only)
    skipped row 17 (fragment 0, offset 17): ValueError: empty text
    chunk 7 (rows 350–399) failed in phase run: ValueError …
    [Cancel] [Retry failed]

Child widgets are public attributes (`badge`, `title`, `progress`, `progress_label`, `strip`,
`backfill`, `error`, `cancel_button`, `retry_button`). A backfill's first skipped rows are read from
`/v1/backfills/errors` when its skipped count grows (docs/ARCHITECTURE.md, "Backfills"). State comes from REST once, then from the kernel's event
listener (`batch` events); the ticker re-reads it while the stream is down.
"""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from lancefn_jupyter.kernel.client.errors import LancefnError
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.display.batch import (
    SKIPPED_SHOWN,
    STRIP_COLOURS,
    backfill_line,
    batch_card,
    batch_state_text,
    batch_summary,
    skipped_lines,
    strip_cells,
)
from lancefn_jupyter.kernel.widgets._job import BAR_STYLE
from lancefn_jupyter.kernel.widgets._support import FallbackReprMixin, bind, start_listening
from lancefn_jupyter.wire.batch_models import STRIP_STATES
from lancefn_jupyter.wire.models import TERMINAL_STATES

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client
    from lancefn_jupyter.wire.batch_models import BackfillError, Batch

__all__ = ["BatchWidget"]


class BatchWidget(FallbackReprMixin, w.VBox):
    """Live state of one batch: progress over all rows, rows/s, time left, chunk strip, failure, Cancel."""

    def __init__(
        self,
        batch_id: str,
        *,
        client: Client | None = None,
        function: Any = None,
        listener: EventListener | None = None,
        start: bool = True,
    ):
        self.batch_id = batch_id
        self._client, self._listener = bind(client, listener)
        self._function = function
        self._lock = threading.RLock()
        self._snapshot: Batch | None = None
        self._skipped: list[BackfillError] = []  # a backfill's first skipped rows, as last read
        self._skipped_read = 0  # the skipped count they were read at
        self.badge = w.HTML(layout=w.Layout(width="auto"))
        self.title = w.HTML(layout=w.Layout(width="auto"))
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="260px"))
        self.progress_label = w.Label()
        self.strip = w.HTML()
        self.backfill = w.HTML(layout=w.Layout(display="none"))
        self.error = w.HTML(layout=w.Layout(display="none"))
        self.cancel_button = w.Button(
            description="Cancel", icon="stop", tooltip=f"Cancel batch {batch_id}", layout=w.Layout(width="auto")
        )
        self.retry_button = w.Button(
            description="Retry failed",
            icon="redo",
            tooltip="Run again only the chunks that did not finish",
            layout=w.Layout(width="auto", display="none"),
        )
        # Pause, or Resume while paused ("Batches": pause); hidden once the batch ended.
        self.pause_button = w.Button(
            description="Pause", icon="pause", tooltip="No new chunk starts", layout=w.Layout(width="auto")
        )
        self.pause_button.on_click(lambda _b: self.resume() if self._paused() else self.pause())
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.retry_button.on_click(lambda _b: self.retry_failed())
        super().__init__(
            children=[
                w.HBox([self.badge, self.title]),
                w.HBox([self.progress, self.progress_label]),
                self.strip,
                self.backfill,
                self.error,
                w.HBox([self.pause_button, self.cancel_button, self.retry_button]),
            ],
            layout=w.Layout(border="1px solid #ddd", padding="4px", margin="2px 0", width="auto"),
        )
        self.add_class("lancefn-batch-widget")
        self._listener.subscribe_batch(batch_id, self._on_event)
        self._listener.subscribe_tick(self._on_tick)
        if start:
            start_listening(self._listener, own=listener is not None)
        self._apply(self._client.batches.describe(batch_id, include_chunks=False))

    @property
    def snapshot(self) -> Batch | None:
        return self._snapshot

    @property
    def state(self) -> str:
        return batch_state_text(self._snapshot) if self._snapshot is not None else "unknown"

    def _fallback(self) -> tuple[str, str]:
        if self._snapshot is None:
            return f"Batch {self.batch_id}", f"<code>{html.escape(self.batch_id)}</code>"
        return batch_card(self._snapshot, skipped=self._skipped)

    def _read_skipped(self, batch: Batch) -> None:
        """Re-read the first skipped rows when the skipped count grew (not on every progress event)."""
        skipped = batch.backfill.rows_skipped if batch.backfill is not None else 0
        if skipped == self._skipped_read or len(self._skipped) >= SKIPPED_SHOWN:
            return
        try:
            self._skipped = self._client.backfills.errors(self.batch_id, limit=SKIPPED_SHOWN)[0]
        except LancefnError:
            return  # shown on the next change
        self._skipped_read = skipped

    def _on_event(self, batch: Any) -> None:
        self._apply(batch)

    def _on_tick(self) -> None:
        batch = self._snapshot
        if batch is None or batch.batch_state in TERMINAL_STATES:
            return
        if not self._listener.is_live():  # batch events are live only: re-read while the stream is down
            try:
                batch = self._client.batches.describe(self.batch_id, include_chunks=False)
            except LancefnError:
                return
        self._apply(batch)  # rows/s and time left move with the clock

    def _apply(self, batch: Any) -> None:
        with self._lock:
            previous = self._snapshot
            if previous is not None and batch.revision < previous.revision:
                return  # an older event
            terminal = batch.batch_state in TERMINAL_STATES
            self.cancel_button.disabled = terminal
            self.pause_button.layout.display = "none" if terminal else None
            self.pause_button.description, self.pause_button.icon = (
                ("Resume", "play") if batch.paused else ("Pause", "pause")
            )
            self.pause_button.tooltip = "Go on where it stopped" if batch.paused else "No new chunk starts"
            failed = batch.chunk_counts.get("FAILED", 0) + batch.chunk_counts.get("CANCELLED", 0)
            self.retry_button.layout.display = None if terminal and failed else "none"
            self.badge.value = display.state_badge_html(batch_state_text(batch))
            self.title.value = (
                f"<span style='margin-left:6px'>batch <code title='{html.escape(batch.batch_id)}'>{html.escape(batch.batch_id[:12])}</code>"
                f" <b>{html.escape(batch.name)}@{html.escape(batch.version)}</b></span>"
            )
            self.progress.max = max(batch.rows_total, 1)
            self.progress.value = min(batch.rows_done, self.progress.max)
            self.progress.bar_style = BAR_STYLE.get(batch.batch_state, "")
            pct = 100 * batch.rows_done / batch.rows_total if batch.rows_total else 0
            self.progress_label.value = (
                f"{batch.rows_done}/{batch.rows_total} rows ({pct:.0f}%) · {batch_summary(batch)}"
            )
            self.strip.value = "".join(
                f"<span class='lancefn-chunk lancefn-chunk-{STRIP_STATES[c]}' title='{STRIP_STATES[c]}' "
                f"style='display:inline-block;width:8px;height:12px;margin-right:1px;background:{STRIP_COLOURS[c]}'></span>"
                for c in strip_cells(batch.strip)
            )
            if batch.backfill is not None:
                self._read_skipped(batch)
                lines = [backfill_line(batch), *skipped_lines(batch, self._skipped)]
                self.backfill.value = "".join(
                    f"<div class='lancefn-backfill'>{html.escape(line)}</div>" for line in lines
                )
                self.backfill.layout.display = None
            failure = batch.failure
            if failure is not None:
                trace = failure.traceback or ""
                if trace and self._function is not None:
                    trace = self._function.map_traceback(trace)
                self.error.value = (
                    f"<div class='lancefn-job-error' style='color:#c62828'>chunk {failure.chunk} (rows {failure.row_start}–"
                    f"{failure.row_end - 1}) failed in phase <b>{html.escape(failure.phase)}</b>: {html.escape(failure.message)}</div>"
                    + (
                        f"<details><summary>remote traceback (your code only)</summary><pre style='font-size:90%'>{html.escape(trace)}</pre></details>"
                        if trace
                        else ""
                    )
                )
                self.error.layout.display = None
            else:
                self.error.layout.display = "none"
            self._snapshot = batch  # last: `state` never runs ahead of what the children show

    def cancel(self) -> bool:
        try:
            cancelled = self._client.batches.cancel(self.batch_id)
            self._apply(self._client.batches.describe(self.batch_id, include_chunks=False))
        except LancefnError as error:
            self.progress_label.value = f"cancel failed: {error}"
            return False
        return cancelled

    def _paused(self) -> bool:
        return self._snapshot is not None and self._snapshot.paused

    def pause(self) -> bool:
        """No new chunk starts; running ones finish. True if this call paused it."""
        return self._act(self._client.batches.pause, "pause")

    def resume(self) -> bool:
        """A paused batch goes on. True if this call resumed it."""
        return self._act(self._client.batches.resume, "resume")

    def _act(self, call: Any, verb: str) -> bool:
        try:
            done = call(self.batch_id)
            self._apply(self._client.batches.describe(self.batch_id, include_chunks=False))
        except LancefnError as error:
            self.progress_label.value = f"{verb} failed: {error}"
            return False
        return done

    def retry_failed(self) -> None:
        try:
            self._apply(self._client.batches.retry(self.batch_id))
        except LancefnError as error:
            self.progress_label.value = f"retry failed: {error}"

    def close(self) -> None:
        self._listener.unsubscribe(self)
        super().close()
