"""`/v1/gpu/*`: the deployment's GPU classes (hardware) and their live usage."""

from __future__ import annotations

from lancefn_jupyter.kernel.client._http import Transport
from lancefn_jupyter.wire.models import GpuClass, GpuUsage

__all__ = ["GpuResource"]


class GpuResource:
    def __init__(self, transport: Transport):
        self._t = transport

    def classes(self) -> list[GpuClass]:
        """Operator-configured GPU classes (needs the system-usage privilege). Hardware only."""
        return [GpuClass.from_wire(item) for item in self._t.get("/v1/gpu/classes")["classes"]]

    def usage(self) -> list[GpuUsage]:
        """Per class: GPUs total/busy and running/pending job counts, right now."""
        return [GpuUsage.from_wire(item) for item in self._t.get("/v1/gpu/usage")["classes"]]
