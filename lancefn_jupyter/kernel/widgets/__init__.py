"""Live notebook widgets: GPU classes, a job, the jobs dashboard, the function card.

All are standard ipywidgets (no custom JavaScript), fed by ONE background event listener per
kernel (`client.listener.EventListener`, the control plane's SSE stream, owned by the session), and
each carries `text/plain` and `text/html` fallbacks. They take records, a client and a listener,
never a handle's internals. Importing this package is cheap: ipywidgets loads with the first widget.
Runs in the kernel (docs/ARCHITECTURE.md, "Client and API (kernel side)").

    from lancefn_jupyter.kernel.widgets import JobWidget, JobsDashboard, GpuClassesWidget, FunctionCardWidget
    from lancefn_jupyter.kernel.widgets import get_listener, start_listener, stop_listener
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from lancefn_jupyter.kernel.client.listener import EventListener, running_threads
from lancefn_jupyter.kernel.session import listener as get_listener
from lancefn_jupyter.kernel.session import start_listener, stop_listener
from lancefn_jupyter.kernel.widgets._support import (
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
        raise AttributeError(f"module 'lancefn_jupyter.kernel.widgets' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module, __name__), name)


# The widget each handle shows, kept while the handle lives (one widget per handle, re-shown on
# every display); a closed widget (no comm) is replaced.
_shown: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _cached(handle: Any, make: Callable[[], Any]) -> Any:
    widget = _shown.get(handle)
    if widget is None or getattr(widget, "comm", None) is None:
        widget = _shown[handle] = make()
    return widget


def job_widget(job: Any) -> Any:
    """The (one, cached) widget of a `Job` handle."""

    def make() -> Any:
        from lancefn_jupyter.kernel.widgets._job import JobWidget

        return JobWidget(job.job_id, client=job.client, function=job.function)

    return _cached(job, make)


def job_bundle(job: Any) -> dict:
    """A `Job`'s display: its live widget where widgets work, else the text/HTML card."""
    from lancefn_jupyter.kernel.display.jobs import job_card

    return rich_bundle(lambda: job_widget(job), lambda: job_card(job.snapshot))


def batch_bundle(batch: Any) -> dict:
    """A `Batch`'s display: its live widget where widgets work, else the text/HTML card."""
    from lancefn_jupyter.kernel.display.batch import batch_card

    def make() -> Any:
        from lancefn_jupyter.kernel.widgets._batch import BatchWidget

        return BatchWidget(batch.batch_id, client=batch.client, function=batch.function)

    return rich_bundle(lambda: _cached(batch, make), lambda: batch_card(batch.snapshot))


def function_card_bundle(handle: Any) -> dict:
    """A `GpuFunction`'s display: the card widget (with live class usage) or its text/HTML."""

    def make() -> Any:
        from lancefn_jupyter.kernel.widgets._card import FunctionCardWidget

        return FunctionCardWidget(handle)

    return rich_bundle(lambda: _cached(handle, make), handle.card)
