"""Live notebook widgets: GPU classes, a job, the jobs dashboard, the function card.

All are standard ipywidgets (no custom JavaScript), fed by ONE background event listener per
kernel (`_listener.EventListener`, the control plane's SSE stream), and each carries `text/plain`
and `text/html` fallbacks. Importing this package is cheap: ipywidgets loads with the first widget.

    from lancefn_jupyter.widgets import JobWidget, JobsDashboard, GpuClassesWidget, FunctionCardWidget
    from lancefn_jupyter.widgets import get_listener, start_listener, stop_listener
"""

from __future__ import annotations

from typing import Any

from lancefn_jupyter.client.listener import EventListener, get_listener, running_threads, start_listener, stop_listener
from lancefn_jupyter.widgets._support import (
    WIDGET_VIEW_MIME,
    in_frontend_kernel,
    rich_bundle,
    set_widgets,
    use_widgets,
    widgets_available,
)

__all__ = [
    "WIDGET_VIEW_MIME",
    "BatchWidget",
    "EventListener",
    "FunctionCardWidget",
    "GpuClassesWidget",
    "JobWidget",
    "JobsDashboard",
    "batch_bundle",
    "function_card_bundle",
    "get_listener",
    "in_frontend_kernel",
    "job_bundle",
    "job_widget",
    "rich_bundle",
    "running_threads",
    "set_widgets",
    "start_listener",
    "stop_listener",
    "use_widgets",
    "widgets_available",
]

_LAZY = {
    "JobWidget": "._job",
    "JobsDashboard": "._dashboard",
    "GpuClassesWidget": "._classes",
    "FunctionCardWidget": "._card",
    "BatchWidget": "._batch",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lancefn_jupyter.widgets' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module, __name__), name)


def job_widget(job: Any) -> Any:
    """The (one, cached) widget of a `Job` handle."""
    widget = getattr(job, "_widget", None)
    if widget is None or getattr(widget, "comm", None) is None:
        from lancefn_jupyter.widgets._job import JobWidget

        widget = JobWidget(job.job_id, client=job.client, function=job.function)
        job._widget = widget
    return widget


def job_bundle(job: Any) -> dict:
    """A `Job`'s display: its live widget where widgets work, else the text/HTML card."""
    from lancefn_jupyter.display import cards as display

    return rich_bundle(lambda: job_widget(job), lambda: display.job_card(job.snapshot))


def batch_bundle(batch: Any) -> dict:
    """A `Batch`'s display: its live widget where widgets work, else the text/HTML card."""
    from lancefn_jupyter.display.batch import batch_card

    def make() -> Any:
        widget = getattr(batch, "_widget", None)
        if widget is None or getattr(widget, "comm", None) is None:
            from lancefn_jupyter.widgets._batch import BatchWidget

            widget = BatchWidget(batch.batch_id, client=batch.client, function=batch.function)
            batch._widget = widget
        return widget

    return rich_bundle(make, lambda: batch_card(batch.snapshot))


def function_card_bundle(handle: Any) -> dict:
    """A `GpuFunction`'s display: the card widget (with live class usage) or its text/HTML."""

    def make() -> Any:
        widget = getattr(handle, "_widget", None)
        if widget is None or getattr(widget, "comm", None) is None:
            from lancefn_jupyter.widgets._card import FunctionCardWidget

            widget = FunctionCardWidget(handle)
            handle._widget = widget
        return widget

    return rich_bundle(make, handle._card)
