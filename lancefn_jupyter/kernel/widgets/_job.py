"""The job widget: what `submit`, `map`, `remote` and a `Job` handle display.

    [pending] job 3f2a…  double_all@5c1e…
    pending: waiting for GPU capacity in class default, position 1
    [██████░░░░] 2/3 rows (67%)
    cold start 1.2 s, setup 1.0 s, ran 12 ms      (once it ended on a worker: cold or warm)
    line 0                                        (what the job prints, live while it runs)
    [Cancel] [Logs]

Child widgets are public attributes (`badge`, `status`, `progress`, `progress_label`, `timings`,
`output`, `cancel_button`, `logs_button`, `logs_view`, `error`) so tests and users can read them. State comes
from REST once, then from the kernel's event listener (never polled per widget). A job still running when the
widget is made has its prints shown in `output` as they come, read on the listener's tick
(docs/ARCHITECTURE.md, "Live output").
"""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from lancefn_jupyter.kernel.client.errors import LancefnError
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.display.jobs import job_card, remote_locals_text
from lancefn_jupyter.kernel.display.live_logs import LiveLog
from lancefn_jupyter.kernel.display.timings import job_timings_text, timings_breakdown
from lancefn_jupyter.kernel.widgets._support import FallbackReprMixin, bind, start_listening
from lancefn_jupyter.wire.models import TERMINAL_STATES, JobState, display_state

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client
    from lancefn_jupyter.wire.models import Job

__all__ = ["JobWidget"]

BAR_STYLE = {  # progress bar colour by job (or batch) state
    JobState.PENDING: "",
    JobState.IN_PROGRESS: "info",
    JobState.DONE: "success",
    JobState.FAILED: "danger",
    JobState.CANCELLED: "warning",
    JobState.TIMED_OUT: "danger",
}


class JobWidget(FallbackReprMixin, w.VBox):
    """Live state of one job: badge, what it waits for or where it runs, progress, Cancel, logs."""

    def __init__(
        self,
        job_id: str,
        *,
        client: Client | None = None,
        snapshot: Job | None = None,
        function: Any = None,
        listener: EventListener | None = None,
        start: bool = True,
    ):
        self.job_id = job_id
        self._client, self._listener = bind(client, listener)
        self._function = function  # a GpuFunction, to map remote tracebacks to its cell
        self._lock = threading.RLock()
        self._snapshot: Job | None = None
        self._events_seen = 0
        self._log_lines: list[str] = []
        self._log_offset = 0
        self._log_stale = False
        self._logs_lock = threading.Lock()
        self._subscribed = False

        self.badge = w.HTML(layout=w.Layout(width="auto"))
        self.title = w.HTML(layout=w.Layout(width="auto"))
        self.status = w.HTML()
        self.progress = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="260px"))
        self.progress_label = w.Label()
        # Where the time went, once the job ended on a worker (docs/ARCHITECTURE.md, "Warm state").
        self.timings = w.HTML(layout=w.Layout(display="none"))
        # The job's prints while it runs: stdout and stderr as the cell shows them (Output's stream entries).
        self.output = w.Output(layout=w.Layout(max_height="240px", overflow="auto"))
        self._live: LiveLog | None = None
        self._live_lines: list[tuple[str, str]] = []
        self.cancel_button = w.Button(
            description="Cancel", icon="stop", tooltip=f"Cancel job {job_id}", layout=w.Layout(width="auto")
        )
        self.logs_button = w.ToggleButton(
            value=False,
            description="Logs",
            icon="align-left",
            tooltip="Show the worker's stdout/stderr",
            layout=w.Layout(width="auto"),
        )
        self.logs_view = w.HTML(layout=w.Layout(display="none", max_height="240px", overflow="auto"))
        self.error = w.HTML(layout=w.Layout(display="none"))
        self.cancel_button.on_click(self._on_cancel_click)
        self.logs_button.observe(self._on_logs_toggle, names="value")
        super().__init__(
            children=[
                w.HBox([self.badge, self.title]),
                self.status,
                w.HBox([self.progress, self.progress_label]),
                self.timings,
                self.output,
                self.error,
                w.HBox([self.cancel_button, self.logs_button]),
                self.logs_view,
            ],
            layout=w.Layout(border="1px solid #ddd", padding="4px", margin="2px 0", width="auto"),
        )
        self.add_class("lancefn-job-widget")

        self._listener.subscribe_job(job_id, self._on_event)
        self._listener.subscribe_tick(self._on_tick)
        self._subscribed = True
        if start:
            start_listening(self._listener, own=listener is not None)
        seen = self._events_seen
        job = snapshot if snapshot is not None else self._client.jobs.describe(job_id)
        job = self._listener.observe_rest(job)
        with self._lock:
            if self._events_seen == seen:  # no fresher event arrived while we read it
                self._apply(job)
            if not self.done:
                self._live = LiveLog(job_id, self._log_entries, emit=self._hold_line)

    # ---------------------------------------------------------------- reading

    @property
    def snapshot(self) -> Job | None:
        return self._snapshot

    @property
    def state(self) -> str:
        """pending, running, finished, failed, cancelled or timed out (as shown)."""
        return display_state(self._snapshot.job_state) if self._snapshot is not None else "unknown"

    @property
    def done(self) -> bool:
        return self._snapshot is not None and self._snapshot.job_state in TERMINAL_STATES

    def _fallback(self) -> tuple[str, str]:
        if self._snapshot is None:
            return f"Job {self.job_id}", f"<code>{html.escape(self.job_id)}</code>"
        return job_card(self._snapshot)

    # ---------------------------------------------------------------- updates

    def _on_event(self, job: Any) -> None:
        with self._lock:
            self._events_seen += 1
            self._apply(job)

    def _on_tick(self) -> None:
        with self._lock:
            job = self._snapshot
            if job is None:
                return
            if job.job_state == JobState.IN_PROGRESS:
                self.status.value = self._status_html(job)  # elapsed time moves on
            refresh_logs = self.logs_button.value and (job.job_state == JobState.IN_PROGRESS or self._log_stale)
        if refresh_logs:
            self._load_logs()
        following = self._follow_output(job)
        if job.job_state in TERMINAL_STATES and not refresh_logs and not following and self._subscribed:
            self._unsubscribe()

    def _follow_output(self, job: Any) -> bool:
        """Show what the job printed since the last tick (its last lines once it ended); True while following."""
        live = self._live
        if live is None or live.closed or job.job_state == JobState.PENDING:
            return live is not None and not live.closed
        try:
            live.close() if job.job_state in TERMINAL_STATES else live.pull()
        except LancefnError:
            pass  # the next tick reads them
        lines, self._live_lines = self._live_lines, []
        start = 0
        for end in range(1, len(lines) + 1):  # one output entry per run of lines of one stream
            if end == len(lines) or lines[end][1] != lines[start][1]:
                text = "".join(line + "\n" for line, _ in lines[start:end])
                (self.output.append_stderr if lines[start][1] == "stderr" else self.output.append_stdout)(text)
                start = end
        return not live.closed

    def _log_entries(self, job_id: str, offset: int) -> tuple[list[str], list[str], int]:
        return self._client.jobs.log_entries(job_id, offset)

    def _hold_line(self, line: str, stream: str) -> None:
        self._live_lines.append((line, stream))

    def _apply(self, job: Any) -> None:
        previous = self._snapshot
        if previous is not None and previous.job_state in TERMINAL_STATES and job.job_state not in TERMINAL_STATES:
            return  # a terminal state is final; late or replayed events never undo it
        state = display_state(job.job_state)
        terminal = job.job_state in TERMINAL_STATES
        self.cancel_button.disabled = terminal  # before the badge, so a terminal badge never shows a live button
        self.badge.value = display.state_badge_html(state)
        self.title.value = (
            f"<span style='margin-left:6px'>job <code title='{html.escape(job.job_id)}'>{html.escape(job.job_id[:12])}</code>"
            f" <b>{html.escape(display.function_ref(job))}</b></span>"
        )
        self.status.value = self._status_html(job)
        total = job.progress.rows_total
        done = job.progress.rows_done
        if job.job_state == JobState.DONE and total:
            done = total
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max) if total else (1 if job.job_state == JobState.DONE else 0)
        self.progress.bar_style = BAR_STYLE.get(job.job_state, "")
        self.progress_label.value = display.progress_text(job)
        self._apply_timings(job)
        failure = job.failure
        if failure is not None:
            self.error.value = self._error_html(job)
            self.error.layout.display = None
        if terminal and self.logs_button.value:
            self._log_stale = True  # the ticker reads the last lines (not this thread: it serves events)
        # Last, so `state` never says what the children do not show yet (a saved widget state would miss it).
        self._snapshot = job

    def _apply_timings(self, job: Any) -> None:
        text = job_timings_text(job, run=True)
        if not text:
            self.timings.layout.display = "none"
            self.timings.value = ""
            return
        tip = html.escape(timings_breakdown(job.timings), quote=True)
        self.timings.value = (
            f"<span class='lancefn-job-timings' title='{tip}' style='color:#616161'>{html.escape(text)}</span>"
        )
        self.timings.layout.display = None

    def _status_html(self, job: Any) -> str:
        summary = display.job_summary(job)
        if job.failure is not None:
            summary = f"{display_state(job.job_state)} in phase {job.failure.phase}"
        return f"<span class='lancefn-job-status'>{html.escape(summary)}</span>"

    def _error_html(self, job: Any) -> str:
        failure = job.failure
        trace, message = failure.traceback or "", failure.message
        function = self._function
        if function is not None:
            message, trace = function.map_failure(message, trace)
        retry = " (retryable: submitting again may succeed)" if failure.retryable else ""
        body = (
            f"<div class='lancefn-job-error' style='color:#c62828'><b>{html.escape(failure.phase)}</b>: "
            f"{html.escape(message)}{html.escape(retry)}</div>"
        )
        if trace:
            body += (
                "<details><summary>remote traceback (your code only)</summary>"
                f"<pre style='font-size:90%'>{html.escape(trace)}</pre></details>"
            )
        local = remote_locals_text(job, function.map_traceback if function is not None else None)
        if local:
            steps = " — job.debug() steps into the failing row here" if failure.rows is not None else ""
            body += (
                f"<details class='lancefn-job-locals'><summary>remote locals{steps}</summary>"
                f"<pre style='font-size:90%'>{html.escape(local)}</pre></details>"
            )
        return body

    def _unsubscribe(self) -> None:
        self._subscribed = False
        self._listener.unsubscribe(self)

    # ---------------------------------------------------------------- actions

    def cancel(self) -> bool:
        """Cancel the job (what the button does); True if this call cancelled it."""
        try:
            cancelled = self._client.jobs.cancel(self.job_id)
            job = self._client.jobs.describe(self.job_id)
        except LancefnError as error:
            self.status.value = f"<span style='color:#c62828'>cancel failed: {html.escape(str(error))}</span>"
            return False
        with self._lock:
            self._apply(job)
        return cancelled

    def _on_cancel_click(self, _button: Any) -> None:
        self.cancel()

    def _on_logs_toggle(self, change: dict) -> None:
        if change["new"]:
            self.logs_view.layout.display = None
            self._load_logs()
        else:
            self.logs_view.layout.display = "none"

    def _load_logs(self) -> None:
        with self._logs_lock:  # the toggle (kernel thread) and the ticker may both ask
            self._load_logs_locked()

    def _load_logs_locked(self) -> None:
        try:
            while True:
                lines, next_offset = self._client.jobs.logs(self.job_id, self._log_offset)
                self._log_lines.extend(lines)
                if not lines or next_offset == self._log_offset:
                    break
                self._log_offset = next_offset
        except LancefnError as error:
            self.logs_view.value = f"<i>logs unavailable: {html.escape(str(error))}</i>"
            return
        self._log_stale = False
        text = "\n".join(self._log_lines[-2000:]) or "(no output yet)"
        self.logs_view.value = f"<pre class='lancefn-job-logs' style='margin:0'>{html.escape(text)}</pre>"

    @property
    def logs(self) -> str:
        """The log lines this widget has loaded."""
        return "\n".join(self._log_lines)

    def close(self) -> None:
        self._listener.unsubscribe(self)
        for child in (
            self.badge,
            self.title,
            self.status,
            self.progress,
            self.progress_label,
            self.timings,
            self.output,
            self.cancel_button,
            self.logs_button,
            self.logs_view,
            self.error,
        ):
            child.close()
        for box in list(self.children):
            box.close()
        super().close()
