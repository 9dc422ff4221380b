"""Listings that show as tables (text and HTML) or live widgets in notebooks: `list_gpu_classes`,
`list_versions`, `list_jobs`, `gpu_usage` (what `%gpu_classes`, `%gpu_versions`, `%gpu_jobs` and `%gpu_usage` show).
Runs in the kernel."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lancefn_jupyter.kernel.client import Client, LancefnError
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.display.jobs import jobs_table
from lancefn_jupyter.kernel.session import current_client
from lancefn_jupyter.wire.models import GpuClass

__all__ = ["gpu_usage", "list_gpu_classes", "list_jobs", "list_versions"]


class _Rendered(list):
    """A list of models that shows as a table (text and HTML) in notebooks, or as a live widget."""

    def __init__(
        self,
        items: Iterable[Any],
        render: Callable[[], tuple[str, str]],
        widget: Callable[[], Any] | None = None,
    ):
        super().__init__(items)
        self._render = render
        self._make_widget = widget
        self._widget: Any = None

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        make_widget = self._make_widget
        if make_widget is not None:
            from lancefn_jupyter.kernel.widgets import rich_bundle

            def make() -> Any:
                if self._widget is None or getattr(self._widget, "comm", None) is None:
                    self._widget = make_widget()
                return self._widget

            return rich_bundle(make, self._render)
        text, markup = self._render()
        return {"text/plain": text, "text/html": markup}

    def __repr__(self) -> str:
        return self._render()[0]


def list_gpu_classes() -> list[GpuClass]:
    """The deployment's GPU classes (hardware), shown with live busy/free when displayed."""
    client = current_client()
    classes = client.gpu.classes()
    usage = client.gpu.usage()
    return _Rendered(
        classes,
        lambda: display.gpu_classes_table(classes, usage),
        widget=lambda: _widget("GpuClassesWidget", classes, usage, client=client),
    )


def gpu_usage(*, by: str = "namespace", since: str | None = None) -> list[dict]:
    """What ended jobs held and cost, summed ``by`` namespace, version, class, day or batch (the admin: every
    namespace; docs/ARCHITECTURE.md, "Cost")."""
    reply = current_client().jobs.usage(by, since)
    rows = reply["rows"]
    return _Rendered(rows, lambda: display.usage_table(rows, by))


def list_versions(name: str | None = None) -> list:
    """Registered function versions (with definitions), optionally of one name."""
    listings = list(current_client().functions.list(name, include_definition=True))
    rows = [(item.name, item.version, item.definition) for item in listings]
    return _Rendered(listings, lambda: display.versions_table(rows))


def list_jobs(*, state: str | None = None, name: str | None = None, limit: int = 50) -> list:
    """Recent `run_function` jobs, newest first; the table's "start" column says cold or warm."""
    client = current_client()
    jobs = client.jobs.list(state=state, name=name, job_type="run_function", limit=limit)
    batches = _recent_batches(client, name)
    if batches:  # batch rows above the jobs (their chunk jobs are among the jobs)
        from lancefn_jupyter.kernel.display.batch import batches_table

        def render() -> tuple[str, str]:
            (bt, bh), (jt, jh) = batches_table(batches), jobs_table(jobs)
            return f"{bt}\n\n{jt}", bh + jh

        return _Rendered(jobs, render, widget=lambda: _jobs_with_batches(batches, state, name, limit, client))
    return _Rendered(
        jobs,
        lambda: jobs_table(jobs),
        widget=lambda: _widget("JobsDashboard", state=state, name=name, limit=limit, client=client),
    )


_BATCH_ROWS = 5  # recent batches `%gpu_jobs` shows


def _recent_batches(client: Client, name: str | None) -> list:
    try:
        return client.batches.list(name=name, limit=_BATCH_ROWS)
    except LancefnError:  # a server without batches, or a key without the privilege
        return []


def _jobs_with_batches(batches: list, state: str | None, name: str | None, limit: int, client: Client) -> Any:
    import ipywidgets

    rows = [_widget("BatchWidget", batch.batch_id, client=client) for batch in batches]
    return ipywidgets.VBox([*rows, _widget("JobsDashboard", state=state, name=name, limit=limit, client=client)])


def _widget(kind: str, *args: Any, **kwargs: Any) -> Any:
    from lancefn_jupyter.kernel import widgets

    return getattr(widgets, kind)(*args, **kwargs)
