"""Scaling with the queue, the Ray side (docs/ray.md, "Scaling with the queue"): what the bridge asks of Ray's
autoscaler for the classes that scale, and what it reports back to the control plane.

The bridge (a Ray driver) shapes each scaling class's jobs into node-shaped bundles (``policy/demand.py``) and hands
them to ``ray.autoscaler.sdk.request_resources``.  That call keeps one request per *cluster* (each call replaces the
last, whoever made it), so every control plane keeps its own bundles in Ray's internal KV under its own key, with the
time it last wrote them, and requests the sum of the entries that are fresh: two control planes on one cluster add up
instead of cancelling each other, and the entry of one that died stops counting after ``LEASE_S``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from lancefn_jupyter.server.executors.ray.cluster import class_resource
from lancefn_jupyter.server.policy.demand import Ask, Demand, NodeScaling, StartClock

log = logging.getLogger("lancefn.server")

KEY_PREFIX = b"lancefn:demand:"
LEASE_S = 30.0  # an entry not rewritten for this long is a gone control plane's, and dropped
REFRESH_S = 10.0  # each control plane rewrites its entry this often, even unchanged


def scaling_of(config: Mapping[str, Any]) -> dict[str, NodeScaling]:
    """The bridge config's ``scaling`` (class → node shape and range, as ``scaling_config`` writes it)."""
    return {
        name: NodeScaling(
            Ask(int(entry["gpus"]), float(entry.get("cpus", 0)), int(entry.get("memory", 0))),
            int(entry["max_nodes"]),
            int(entry.get("min_nodes", 0)),
        )
        for name, entry in (config.get("scaling") or {}).items()
    }


def scaling_config(classes: Any) -> dict[str, dict[str, float]]:
    """What the bridge needs of each class an autoscaler scales (``GpuClassConfig`` → JSON)."""
    return {
        spec.name: {
            "gpus": spec.scaling.node.gpus,
            "cpus": spec.scaling.node.cpus,
            "memory": spec.scaling.node.memory,
            "max_nodes": spec.scaling.max_nodes,
            "min_nodes": spec.scaling.min_nodes,
        }
        for spec in (classes.classes if classes is not None else ())
        if spec.scaling is not None
    }


def bundles_of(gpu_class: str, demand: Demand) -> list[dict[str, float]]:
    """Ray resource bundles for a class's demand: GPUs and the class resource (so only the class's node type fits),
    and CPUs and memory where the jobs say them."""
    bundles = []
    for ask in demand.bundles:
        bundle: dict[str, float] = {"GPU": ask.gpus, class_resource(gpu_class): ask.gpus}
        if ask.cpus:
            bundle["CPU"] = ask.cpus
        if ask.memory:
            bundle["memory"] = ask.memory
        bundles.append(bundle)
    return bundles


class DemandPublisher:
    """This control plane's bundles into its KV entry, and the sum of every fresh entry to the autoscaler."""

    def __init__(self, owner: str) -> None:
        self.key = KEY_PREFIX + owner.encode()
        self.last: list[dict[str, float]] | None = None
        self.written_at = 0.0

    def due(self, bundles: list[dict[str, float]], now: float) -> bool:
        return bundles != self.last or now - self.written_at >= REFRESH_S

    def publish(self, bundles: list[dict[str, float]], now: float) -> list[dict[str, float]]:
        """Write ours and request everyone's; returns what was requested."""
        from ray.experimental.internal_kv import _internal_kv_put as kv_put

        kv_put(self.key, json.dumps({"at": time.time(), "bundles": bundles}), overwrite=True)
        self.last, self.written_at = bundles, now
        return self._request_all()

    def withdraw(self) -> None:
        """Our entry goes (the bridge stops); the others' stay requested."""
        from ray.experimental.internal_kv import _internal_kv_del as kv_del

        kv_del(self.key)
        self._request_all()

    def _request_all(self) -> list[dict[str, float]]:
        from ray.autoscaler.sdk import request_resources
        from ray.experimental.internal_kv import _internal_kv_del as kv_del
        from ray.experimental.internal_kv import _internal_kv_get as kv_get
        from ray.experimental.internal_kv import _internal_kv_list as kv_list

        wall = time.time()
        merged: list[dict[str, float]] = []
        for key in kv_list(KEY_PREFIX):
            entry = _entry(kv_get(key))
            if entry is None or wall - entry[0] > LEASE_S:
                if key != self.key:
                    kv_del(key)  # a gone control plane's: its jobs went with it
                continue
            merged += entry[1]
        request_resources(bundles=merged)
        return merged


def _entry(raw: Any) -> tuple[float, list[dict[str, float]]] | None:
    try:
        value = json.loads(raw)
        bundles = [
            {str(k): float(v) for k, v in bundle.items()} for bundle in value["bundles"] if isinstance(bundle, dict)
        ]
        return float(value["at"]), bundles
    except Exception:  # not ours to read: ignored
        return None


class ScalingReport:
    """Per scaling class, what the control plane shows: nodes up, starting (asked for and not up yet) and the
    maximum, the nodes wanted, how long starts took recently, and jobs that can never fit a node."""

    def __init__(self, scaling: Mapping[str, NodeScaling]) -> None:
        self.scaling = scaling
        self.clocks = {name: StartClock() for name in scaling}
        self.last: dict[str, dict[str, Any]] | None = None

    def update(self, now: float, demands: Mapping[str, Demand], nodes_up: Mapping[str, int]) -> dict | None:
        """The report, or None when it has not changed since the last one."""
        report: dict[str, dict[str, Any]] = {}
        for name, scaling in self.scaling.items():
            demand = demands.get(name) or Demand()
            up = int(nodes_up.get(name, 0))
            self.clocks[name].update(now, demand.nodes, up)
            recent = self.clocks[name].recent_s()
            next_up = self.clocks[name].next_up(now)
            report[name] = {
                "nodes_up": up,
                "nodes_starting": max(0, min(demand.nodes, scaling.max_nodes) - up),
                "nodes_max": scaling.max_nodes,
                "nodes_wanted": demand.nodes,
                "start_s": round(recent, 1) if recent is not None else None,
                # wall clock, whole seconds (a report changes only when something does)
                "next_up_ms": round(time.time() + next_up - now) * 1000 if next_up is not None else None,
            }
        if report == self.last:
            return None
        self.last = report
        return report
