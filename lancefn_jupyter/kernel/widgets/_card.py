"""The function card (what `%%gpu_function` displays), with its GPU class's live usage.

Name, version id, short digest, runtime kind, resources, environment and the class's hardware come
from `display.function_card` (the same text/HTML as the fallback); a second line follows the class's
busy/free GPUs and running/pending jobs from the listener's usage events.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Sequence
from typing import Any

import ipywidgets as w

from lancefn_jupyter.kernel import session
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.widgets._support import FallbackReprMixin, LiveUsageMixin

__all__ = ["FunctionCardWidget"]


class FunctionCardWidget(FallbackReprMixin, LiveUsageMixin, w.VBox):
    """`card` (HTML) is the static card; `usage_label` (HTML) the class's live use."""

    def __init__(self, handle: Any, *, listener: EventListener | None = None, start: bool = True):
        self._listener = listener or session.listener()
        self._lock = threading.RLock()
        try:
            # Registers (lazily, decorator handles; the magic already did) unless register=no.
            registered = handle.version is not None
        except Exception:  # the card still shows the request; the error surfaces on submit
            registered = False
        text, markup = handle.card()
        self._text, self._markup = text, markup
        resources = handle.registration_request.runtime.resources
        self.gpu_class: str | None = (resources.gpu_class or "default") if resources is not None else None
        self.card = w.HTML(markup)
        self.usage_label = w.HTML()
        self.usage: Any = None
        children = [self.card]
        if self.gpu_class is not None and registered:
            children.append(self.usage_label)
        super().__init__(children=children, layout=w.Layout(width="auto"))
        self.add_class("lancefn-function-card")
        if self.gpu_class is None or not registered:
            return
        self._follow_usage(listener is not None, start, _read_usage)

    def _apply(self, usage: Sequence[Any]) -> None:
        assert self.gpu_class is not None  # only a card with a class follows usage
        self.usage = next((u for u in usage if u.name == self.gpu_class), None)
        line = display.usage_line(self.gpu_class, self.usage)
        self.usage_label.value = f"<span class='lancefn-card-usage' style='color:#555'>{html.escape(line)}</span>"

    def _fallback(self) -> tuple[str, str]:
        return self._text, self._markup

    def close(self) -> None:
        self._listener.unsubscribe(self)
        self.card.close()
        self.usage_label.close()
        super().close()


def _read_usage() -> list:
    try:
        return session.current_client().gpu.usage()
    except Exception:  # usage needs the system-usage privilege; the card stands without it
        return []
