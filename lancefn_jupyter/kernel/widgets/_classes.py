"""The GPU classes widget (`%gpu_classes`, `list_gpu_classes()`): hardware plus live busy/free.

One row per class: GPU model (marked simulated), memory in binary units, max GPUs per worker,
resource name, node selector, GPUs busy/free and jobs running/pending. Hardware is read once over
REST; usage follows the listener's `usage` events (sent after every placement change).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.widgets._support import FallbackReprMixin, LiveUsageMixin, bind

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client

__all__ = ["GpuClassesWidget"]


class GpuClassesWidget(FallbackReprMixin, LiveUsageMixin, w.VBox):
    """`table` (an HTML widget) holds the classes table; `usage` maps class name → GpuUsage."""

    def __init__(
        self,
        classes: Sequence[Any] | None = None,
        usage: Sequence[Any] | None = None,
        *,
        client: Client | None = None,
        listener: EventListener | None = None,
        start: bool = True,
    ):
        self._client, self._listener = bind(client, listener)
        self._lock = threading.RLock()
        self.gpu_classes = list(classes) if classes is not None else self._client.gpu.classes()
        self.usage: dict[str, Any] = {}
        self.table = w.HTML()
        super().__init__(children=[self.table], layout=w.Layout(width="auto"))
        self.add_class("lancefn-gpu-classes-widget")

        read = self._client.gpu.usage if usage is None else (lambda: list(usage))
        self._follow_usage(listener is not None, start, read)

    def _apply(self, usage: Sequence[Any]) -> None:
        self.usage = {u.name: u for u in usage}
        self.table.value = self._fallback()[1]

    def _fallback(self) -> tuple[str, str]:
        return display.gpu_classes_table(self.gpu_classes, list(self.usage.values()))

    def close(self) -> None:
        self._listener.unsubscribe(self)
        self.table.close()
        super().close()
