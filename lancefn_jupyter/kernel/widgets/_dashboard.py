"""The jobs dashboard (`%gpu_jobs`): a live table of recent jobs with filters and per-row Cancel.

Columns: job, function, state, Cancel (beside the state it changes), placement (class, GPUs, devices, or
queue position), progress, detail (rows, elapsed time, result, cold or warm: "cold start 1.2 s, setup 1.0 s"
or "warm", with every phase in its tooltip; or the error). Filters: state (dropdown) and function (combobox; a
substring of the name). Recent jobs come from REST when the dashboard is built (and again when a
filter changes or the listener reconnects afresh, e.g. after a kernel restart); every change after
that comes from the kernel's event listener. Standard ipywidgets only: a `GridBox` of small widgets,
so each row's cells update in place.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as w
from ipywidgets.widgets.widget_int import ProgressStyle
from ipywidgets.widgets.widget_string import HTMLStyle

from lancefn_jupyter.kernel.client.errors import LancefnError
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.display.cards import function_ref
from lancefn_jupyter.kernel.display.jobs import jobs_table
from lancefn_jupyter.kernel.display.timings import job_timings_text, timings_breakdown
from lancefn_jupyter.kernel.widgets._job import BAR_STYLE
from lancefn_jupyter.kernel.widgets._support import FallbackReprMixin, bind, start_listening
from lancefn_jupyter.wire.models import TERMINAL_STATES, JobState, display_state

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client

__all__ = ["JobsDashboard"]

STATE_OPTIONS = [("all states", ""), *((display_state(state), state.value) for state in JobState)]
# The summary's order: what is live first, then how jobs ended.
_SUMMARY_ORDER = [
    display_state(state)
    for state in (
        JobState.IN_PROGRESS,
        JobState.PENDING,
        JobState.DONE,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMED_OUT,
    )
]
COLUMNS = ["job", "function", "state", "", "placement", "progress", "detail"]
# Each column's width, fixed or bounded, so columns stay put as rows come and go. Cancel sits beside the job's
# state, where the eye is when deciding to stop it, whatever the page's width (last, it went to the far edge).
_WIDTHS = ["110px", "minmax(120px, 240px)", "90px", "90px", "minmax(140px, 220px)", "120px", "minmax(160px, 300px)"]
_NAMESPACE_WIDTH = "minmax(80px, 140px)"
# A name longer than its column: cut with an ellipsis, the whole of it on hover.
_ONE_LINE = "display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"
# Shown after "function" once jobs of more than one namespace are visible (an admin on a shared server).
NAMESPACE_COLUMN = "namespace"
_KEEP_JOBS = 500  # jobs remembered (newest first) for filtering; older terminal ones are forgotten


def _placement_text(job: Any) -> str:
    p = job.placement
    where = p.gpu_class or "cpu"
    if job.job_state == JobState.PENDING:
        if p.waiting_on_capacity or p.queue_position is not None:
            queue = display.queue_text(p)
            return f"waiting for {where}, {queue}" if queue else f"waiting for {where}"
        return f"queued ({where})"
    gpus = f"{p.num_gpus} GPU{'s' if p.num_gpus != 1 else ''}" if p.num_gpus else "no GPU"
    devices = f" [{','.join(p.devices)}]" if p.devices else ""
    return f"{where} · {gpus}{devices}"


def _detail_text(job: Any) -> str:
    if job.failure is not None:
        return f"{job.failure.phase}: {job.failure.message}"
    elapsed = display.job_elapsed_s(job)
    rows = display.progress_text(job)
    result = display.result_text(job)
    timings = job_timings_text(job)
    return (
        rows
        + (f" · {display.format_elapsed(elapsed)}" if elapsed is not None else "")
        + (f" · {result}" if result else "")
        + (f" · {timings}" if timings else "")
    )


class _Row:
    """One job's cells in the grid; `cancel(job_id)` is what its button does."""

    def __init__(self, job: Any, shared: dict[str, Any], cancel: Callable[[str], Any]):
        self.job_id = job.job_id
        self.job = job
        # Rows share their Layout/Style models (`shared`, the dashboard's): a row is 7 models instead
        # of 21 (widget creation is what a new job costs on the listener thread).
        cell = {"layout": shared["cell"], "style": shared["html"]}
        self.id_cell = w.HTML(f"<code title='{html.escape(job.job_id)}'>{html.escape(job.job_id[:12])}</code>", **cell)
        self.function_cell = w.HTML(**cell)
        self.state_cell = w.HTML(**cell)
        self.placement_cell = w.HTML(**cell)
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=shared["bar"], style=shared["bar_style"])
        self.detail_cell = w.HTML(**cell)
        self.namespace_cell = w.HTML(**cell)
        self.cancel_button = w.Button(
            description="Cancel",
            icon="stop",
            tooltip=f"Cancel job {job.job_id}",
            layout=shared["button"],
            style=shared["button_style"],
        )
        self.cancel_button.on_click(lambda _b, job_id=job.job_id: cancel(job_id))
        self.cells = [
            self.id_cell,
            self.function_cell,
            self.state_cell,
            self.cancel_button,
            self.placement_cell,
            self.progress,
            self.detail_cell,
        ]
        self.apply(job)

    def grid_cells(self, with_namespace: bool) -> list:
        return [*self.cells[:2], self.namespace_cell, *self.cells[2:]] if with_namespace else self.cells

    def apply(self, job: Any) -> None:
        self.job = job
        state = display_state(job.job_state)
        ref = html.escape(function_ref(job), quote=True)
        self.function_cell.value = f"<b title='{ref}' style='{_ONE_LINE}'>{ref}</b>"
        self.namespace_cell.value = (
            f"<span class='lancefn-namespace'>{html.escape(getattr(job, 'namespace', None) or '')}</span>"
        )
        self.state_cell.value = display.state_badge_html(state)
        self.placement_cell.value = f"<span class='lancefn-placement'>{html.escape(_placement_text(job))}</span>"
        total, done = job.progress.rows_total, job.progress.rows_done
        if job.job_state == JobState.DONE and total:
            done = total
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max) if total else (1 if job.job_state == JobState.DONE else 0)
        self.progress.bar_style = BAR_STYLE.get(job.job_state, "")
        self.tick()
        self.cancel_button.disabled = job.job_state in TERMINAL_STATES

    def tick(self) -> None:
        color = "#c62828" if self.job.failure is not None else "inherit"
        tip = html.escape(timings_breakdown(getattr(self.job, "timings", None)), quote=True)
        title = f" title='{tip}'" if tip else ""
        self.detail_cell.value = (
            f"<span class='lancefn-detail' style='color:{color}'{title}>{html.escape(_detail_text(self.job))}</span>"
        )

    def close(self) -> None:
        for cell in (*self.cells, self.namespace_cell):
            cell.close()  # shared layouts/styles stay open: the dashboard closes them


class JobsDashboard(FallbackReprMixin, w.VBox):
    """Live table of recent `run_function` jobs. `rows` maps job id → row (cells are widgets)."""

    def __init__(
        self,
        *,
        state: str | None = None,
        name: str | None = None,
        limit: int = 25,
        jobs: Sequence[Any] | None = None,
        client: Client | None = None,
        listener: EventListener | None = None,
        start: bool = True,
    ):
        self._client, self._listener = bind(client, listener)
        self._lock = threading.RLock()
        self.limit = limit
        self.jobs: dict[str, Any] = {}
        self.rows: dict[str, _Row] = {}
        self._touched: set[str] = set()  # ids changed by events since the last REST read began
        self._shown: list[str] = []
        self._multi_namespace = False  # the namespace column is shown
        self._shared = {
            "cell": w.Layout(width="auto", overflow="hidden"),
            "html": HTMLStyle(),
            "bar": w.Layout(width="120px"),
            "bar_style": ProgressStyle(),
            "button": w.Layout(width="auto"),
            "button_style": w.ButtonStyle(),
        }
        states = {value for _, value in STATE_OPTIONS}
        self.state_filter = w.Dropdown(
            options=STATE_OPTIONS,
            value=state if state in states else "",
            description="state",
            layout=w.Layout(width="200px"),
        )
        self.name_filter = w.Combobox(
            value=name or "",
            placeholder="all functions",
            options=[],
            ensure_option=False,
            description="function",
            layout=w.Layout(width="280px"),
        )
        self.summary = w.HTML()
        self.message = w.HTML()
        # Said in place of the table while it has no row (a bare header row reads as broken).
        self.empty = w.HTML()
        header = [w.HTML(f"<b>{html.escape(c)}</b>") for c in COLUMNS]
        self._header = header
        self._namespace_header = w.HTML(f"<b>{NAMESPACE_COLUMN}</b>")
        self.grid = w.GridBox(
            children=header,
            layout=w.Layout(
                grid_template_columns=" ".join(_WIDTHS),
                grid_gap="2px 10px",
                align_items="center",
                width="auto",
            ),
        )
        super().__init__(
            children=[
                w.HBox([self.state_filter, self.name_filter, self.summary]),
                self.message,
                self.empty,
                self.grid,
            ],
            layout=w.Layout(width="auto"),
        )
        self.add_class("lancefn-jobs-dashboard")
        self.state_filter.observe(self._on_filter, names="value")
        self.name_filter.observe(self._on_filter, names="value")

        self._listener.subscribe_jobs(self._on_event, resync=self._resync)
        self._listener.subscribe_tick(self._on_tick)
        if start:
            start_listening(self._listener, own=listener is not None)
        if jobs is not None and not start:
            self._merge(jobs)
        else:
            self._load(self._client)

    # ---------------------------------------------------------------- data

    def _load(self, client: Client) -> None:
        """Recent jobs (and, with filters, recent matching ones) over REST, merged with live state."""
        with self._lock:
            self._touched.clear()
        try:
            found = list(client.jobs.list(job_type="run_function", limit=self.limit))
            state, name = self.state_filter.value or None, (self.name_filter.value or "").strip() or None
            if state or name:
                found += client.jobs.list(job_type="run_function", state=state, name=name, limit=self.limit)
        except LancefnError as error:
            self.message.value = f"<span style='color:#c62828'>could not list jobs: {html.escape(str(error))}</span>"
            return
        self.message.value = ""
        self._merge([self._listener.observe_rest(job) for job in found])

    def _merge(self, jobs: Sequence[Any]) -> None:
        with self._lock:
            for job in jobs:
                if job.job_id in self._touched:
                    continue  # an event newer than this read already updated it
                self._upsert(job)
            self._render()

    def _resync(self, client: Client) -> None:
        self._load(client)

    def _upsert(self, job: Any) -> None:
        previous = self.jobs.get(job.job_id)
        if previous is not None and previous.job_state in TERMINAL_STATES and job.job_state not in TERMINAL_STATES:
            return
        self.jobs[job.job_id] = job
        row = self.rows.get(job.job_id)
        if row is not None:
            row.apply(job)
        if len(self.jobs) > _KEEP_JOBS:
            for old in sorted(self.jobs.values(), key=lambda j: j.creation_ms)[: len(self.jobs) - _KEEP_JOBS]:
                if old.job_state in TERMINAL_STATES:
                    self.jobs.pop(old.job_id, None)
                    stale = self.rows.pop(old.job_id, None)
                    if stale is not None and old.job_id not in self._shown:
                        stale.close()

    def _on_event(self, job: Any) -> None:
        if job.job_type != "run_function":
            return
        with self._lock:
            self._touched.add(job.job_id)
            self._upsert(job)
            self._render()

    def _on_tick(self) -> None:
        with self._lock:
            for job_id in self._shown:
                row = self.rows.get(job_id)
                if row is not None and row.job.job_state == JobState.IN_PROGRESS:
                    row.tick()

    def _on_filter(self, _change: dict) -> None:
        self._load(self._client)

    # ---------------------------------------------------------------- view

    def _matches(self, job: Any) -> bool:
        state = self.state_filter.value
        if state and job.job_state != state:
            return False
        name = (self.name_filter.value or "").strip()
        return not name or name in str(job.spec.get("name", ""))

    def visible_jobs(self) -> list:
        """The jobs the table shows now (filters applied, newest first, at most `limit`)."""
        with self._lock:
            jobs = sorted(self.jobs.values(), key=lambda j: j.creation_ms, reverse=True)
            return [job for job in jobs if self._matches(job)][: self.limit]

    def _render(self) -> None:
        visible = self.visible_jobs()
        ids = [job.job_id for job in visible]
        for job in visible:
            if job.job_id not in self.rows:
                self.rows[job.job_id] = _Row(job, self._shared, self.cancel)
        multi = len({getattr(j, "namespace", None) for j in self.jobs.values()} - {None}) > 1
        if ids != self._shown or multi != self._multi_namespace:
            self._shown, self._multi_namespace = ids, multi
            cells = [*self._header[:2], self._namespace_header, *self._header[2:]] if multi else list(self._header)
            for job_id in ids:
                cells.extend(self.rows[job_id].grid_cells(multi))
            self.grid.children = cells
            widths = [*_WIDTHS[:2], _NAMESPACE_WIDTH, *_WIDTHS[2:]] if multi else _WIDTHS
            self.grid.layout.grid_template_columns = " ".join(widths)
        self.grid.layout.display = "grid" if ids else "none"
        self.empty.value = "" if ids else f"<i class='lancefn-jobs-empty'>{html.escape(self._empty_text())}</i>"
        names = sorted({str(j.spec.get("name", "")) for j in self.jobs.values()} - {""})
        if list(self.name_filter.options) != names:
            self.name_filter.options = names
        counts: dict[str, int] = {}
        for job in visible:  # the rows shown, so the counts add up to the table
            label = display_state(job.job_state)
            counts[label] = counts.get(label, 0) + 1
        parts = ", ".join(f"{counts[s]} {s}" for s in _SUMMARY_ORDER if counts.get(s))
        self.summary.value = (
            f"<span class='lancefn-jobs-summary' style='margin-left:12px'>{len(ids)} shown"
            f"{' · ' + html.escape(parts) if parts else ''}</span>"
        )

    def _empty_text(self) -> str:
        state = self.state_filter.value
        name = (self.name_filter.value or "").strip()
        what = f"{display_state(state)} jobs" if state else "jobs"
        return f"no {what} of {name}" if name else f"no {what} yet"

    def _fallback(self) -> tuple[str, str]:
        return jobs_table(self.visible_jobs())

    # ---------------------------------------------------------------- actions

    def cancel(self, job_id: str) -> bool:
        """Cancel one job (each row's button); True if this call cancelled it."""
        try:
            cancelled = self._client.jobs.cancel(job_id)
            job = self._client.jobs.describe(job_id)
        except LancefnError as error:
            self.message.value = f"<span style='color:#c62828'>cancel failed: {html.escape(str(error))}</span>"
            return False
        with self._lock:
            self._upsert(job)
            self._render()
        return cancelled

    def refresh(self) -> None:
        """Re-read recent jobs over REST (the listener keeps them live without this)."""
        self._load(self._client)

    def close(self) -> None:
        if not hasattr(self, "grid"):  # failed half-way through __init__
            return super().close()
        self._listener.unsubscribe(self)
        with self._lock:
            for row in self.rows.values():
                row.close()
            self.rows.clear()
        for widget in (
            self.state_filter,
            self.name_filter,
            self.summary,
            self.message,
            self.empty,
            self.grid,
            *self._header,
            self._namespace_header,
            *self._shared.values(),
        ):
            widget.close()
        for box in list(self.children):
            box.close()
        super().close()
