"""The team dashboard widget: every GPU class's busy/free and queue, recent batches, running, pending and
recent jobs (namespace column for an admin key, expected starts, cold or warm, Cancel), recent failures.

Built only from `lancefn_jupyter.kernel.widgets` (each section is the widget `%gpu_classes` / `%gpu_jobs` shows),
fed by the kernel's one event listener, so every section updates live. A batch that starts after the page
opened is added at the top of the batches. What the key may see is what the control plane answers: an
admin key sees every namespace's jobs and batches, another key only its own namespace's (docs/ARCHITECTURE.md,
"A shared control plane"); capacity and queues are everyone's.
"""

from __future__ import annotations

import html
import threading
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from lancefn_jupyter.kernel.client import LancefnError
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.session import connection_info, current_client
from lancefn_jupyter.kernel.widgets import BatchWidget, GpuClassesWidget, JobsDashboard, get_listener

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client

__all__ = ["TeamDashboard", "heading_text"]


def heading_text(url: str | None, embedded: bool) -> str:
    """The dashboard's first line: which control plane it shows (never the key)."""
    if url is None:
        return "GPU functions: team dashboard"
    kind = "embedded control plane" if embedded else "control plane"
    return f"GPU functions: team dashboard · {kind} {url}"


class TeamDashboard(w.VBox):
    """Sections: ``classes`` (GpuClassesWidget), ``batches`` (a VBox of BatchWidget, newest first, at most
    ``batches_limit``; ``no_batches`` says so until the first), ``jobs`` (JobsDashboard of the last ``jobs_limit`` jobs, every state) and ``failures``
    (JobsDashboard filtered to failed jobs, the last ``failures_limit``)."""

    def __init__(
        self,
        *,
        jobs_limit: int = 50,
        batches_limit: int = 5,
        failures_limit: int = 10,
        client: Client | None = None,
        listener: EventListener | None = None,
        start: bool = True,
    ):
        self._client = client if client is not None else current_client()
        self._listener = listener or get_listener()
        self._lock = threading.RLock()
        self.batches_limit = batches_limit
        options = {"client": self._client, "listener": listener, "start": start}
        info = connection_info()
        where = heading_text(info.url if info else None, bool(info and info.embedded))
        self.heading = w.HTML(f"<h3>{html.escape(where)}</h3>")
        self.classes = GpuClassesWidget(**options)
        self.batches = w.VBox(layout=w.Layout(width="auto"))
        self.no_batches = w.HTML("<i class='lancefn-no-batches'>no batches yet</i>")
        self.batch_rows: dict[str, BatchWidget] = {}
        # Every batch ever shown: a late event of one pushed off the bottom must not bring it back on top.
        self._shown: set[str] = set()
        self._created: dict[str, int] = {}
        self.jobs = JobsDashboard(limit=jobs_limit, **options)
        self.failures = JobsDashboard(state="FAILED", limit=failures_limit, **options)
        super().__init__(
            children=[
                self.heading,
                self.classes,  # titled "GPU classes" itself
                _section("Batches"),
                self.no_batches,
                self.batches,
                _section("Jobs: running, pending and recent"),
                self.jobs,
                _section("Recent failures"),
                self.failures,
            ],
            layout=w.Layout(width="auto"),
        )
        self.add_class("lancefn-team-dashboard")
        try:
            recent = self._client.batches.list(limit=batches_limit)
        except LancefnError:  # a server without batches, or a key without the privilege
            recent = []
        for batch in reversed(recent):  # oldest first: each new one goes on top
            self._add_batch(batch)
        self._listener.subscribe_batch(None, self._on_batch)

    def _on_batch(self, batch: Any) -> None:
        if getattr(batch, "batch_id", None) is not None and batch.batch_id not in self._shown:
            self._add_batch(batch)

    def _add_batch(self, batch: Any) -> None:
        with self._lock:
            if batch.batch_id in self._shown:
                return
            self._shown.add(batch.batch_id)
            self._created[batch.batch_id] = created = getattr(batch, "creation_ms", 0)
            shown = list(self.batches.children)
            # Newest first by creation, whatever order the events came in; one older than every row of a
            # full section stays out.
            at = next((i for i, row in enumerate(shown) if self._created[row.batch_id] < created), len(shown))
            if at >= self.batches_limit:
                return
            # The sections above started the listener; the batch rows only subscribe to it.
            row = BatchWidget(batch.batch_id, client=self._client, listener=self._listener, start=False)
            self.batch_rows[batch.batch_id] = row
            rows = [*shown[:at], row, *shown[at:]]
            for old in rows[self.batches_limit :]:
                self.batch_rows.pop(old.batch_id, None)
                old.close()
            self.batches.children = rows[: self.batches_limit]
            self.no_batches.layout.display = "none"

    def close(self) -> None:
        self._listener.unsubscribe(self)
        for part in (self.classes, self.jobs, self.failures, self.no_batches, *self.batch_rows.values()):
            part.close()
        super().close()


def _section(title: str) -> w.HTML:
    return w.HTML(f"<h4 style='margin:10px 0 2px'>{html.escape(title)}</h4>")
