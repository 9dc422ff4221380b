"""When to show a widget, the text/HTML fallbacks every widget carries, and the client and event
listener a widget follows (runs in the kernel).

A widget is shown only where a frontend can render it: ipywidgets >= 8 importable and a Jupyter
kernel (ipykernel) behind IPython. Everywhere else (terminal IPython, scripts, ipywidgets missing or
too old) the same objects display as text and HTML. Widgets themselves always return the widget view
*plus* `text/plain` and `text/html`, so nbconvert, GitHub and VS Code read them without the widget
state (docs/ARCHITECTURE.md, "Client and API (kernel side)"; the Ray pattern).

`LANCEFN_WIDGETS=0` turns widgets off (text/HTML only); `LANCEFN_WIDGETS=1` forces them on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.kernel import session
from lancefn_jupyter.kernel.client.logs import log

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client
    from lancefn_jupyter.kernel.client.listener import EventListener

__all__ = [
    "WIDGET_VIEW_MIME",
    "FallbackReprMixin",
    "LiveUsageMixin",
    "bind",
    "in_frontend_kernel",
    "rich_bundle",
    "set_widgets",
    "start_listening",
    "use_widgets",
    "widgets_available",
]

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"

_forced: bool | None = None
_advised = False


def widgets_available() -> bool:
    """ipywidgets >= 8 is importable."""
    try:
        import ipywidgets
    except ImportError:
        return False
    try:
        return int(str(ipywidgets.__version__).split(".")[0]) >= 8
    except ValueError:
        return False


def in_frontend_kernel() -> bool:
    """Running inside a Jupyter kernel (which is what carries widget comms to a frontend)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def set_widgets(enabled: bool | None) -> None:
    """Force widgets on (True) or off (False), or back to auto-detection (None)."""
    global _forced
    _forced = enabled


def use_widgets() -> bool:
    """Whether displays should be widgets here (else text/HTML)."""
    global _advised
    if _forced is not None:
        return _forced and widgets_available()
    env = os.environ.get("LANCEFN_WIDGETS", "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    available = widgets_available()
    if env in ("1", "true", "yes", "on"):
        return available
    if not in_frontend_kernel():
        return False
    if not available and not _advised:
        # INFO, not WARNING (ray-project/ray#35490): the text/HTML display is a fine answer.
        log.info("lancefn: live widgets need ipywidgets>=8 (pip install -U ipywidgets); showing text instead")
        _advised = True
    return available


def bind(client: Client | None, listener: EventListener | None) -> tuple[Client, EventListener]:
    """The client and listener a widget uses: the ones given, else this kernel's current ones."""
    return (client if client is not None else session.current_client()), listener or session.listener()


def start_listening(listener: EventListener, own: bool) -> None:
    """Start a widget's listener: the one given to it (`own`), else the kernel's (stopped at exit)."""
    if own:
        listener.start()
    else:
        session.start_listener()


def rich_bundle(make_widget: Callable[[], Any], fallback: Callable[[], tuple[str, str]]) -> dict:
    """The widget's bundle (view + text + HTML) where widgets work, else text + HTML only."""
    if use_widgets():
        try:
            bundle = make_widget()._repr_mimebundle_()
            if bundle:
                return bundle
        except Exception as error:  # a display must always answer something readable
            log.info("lancefn: showing text instead of a widget (%s: %s)", type(error).__name__, error)
    text, markup = fallback()
    return {"text/plain": text, "text/html": markup}


class FallbackReprMixin:
    """Widget bundle = the widget view + our `text/plain` + `text/html` (put before the widget base)."""

    def _fallback(self) -> tuple[str, str]:  # pragma: no cover - every widget overrides it
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})  # type: ignore[misc]
        text, markup = self._fallback()
        bundle["text/plain"] = text
        bundle["text/html"] = markup
        return bundle

    def _repr_html_(self) -> str:  # used once a widget is closed (ipywidgets drops its bundle)
        return self._fallback()[1]

    def __repr__(self) -> str:  # cheap: never serializes traits
        try:
            return self._fallback()[0]
        except Exception:
            return object.__repr__(self)


class LiveUsageMixin:
    """A widget showing GPU usage, kept current by the listener's usage events. The first usage
    shown is the listener's (when connected) or `read()`'s, unless an event arrived meanwhile."""

    _lock: Any
    _listener: Any
    _usage_events = 0

    def _follow_usage(self, own_listener: bool, start: bool, read: Callable[[], Sequence[Any]]) -> None:
        """Subscribe (and start the kernel's listener, or `own_listener` given to the widget), then show."""
        self._listener.subscribe_usage(self._on_usage)
        if start:
            start_listening(self._listener, own_listener)
        seen = self._usage_events
        current = self._listener.usage if self._listener.connected else None
        if current is None:
            current = read()
        with self._lock:
            if self._usage_events == seen:
                self._apply(current)

    def _on_usage(self, usage: Sequence[Any]) -> None:
        with self._lock:
            self._usage_events += 1
            self._apply(usage)

    def _apply(self, usage: Sequence[Any]) -> None:  # pragma: no cover - every user overrides it
        raise NotImplementedError
