"""What the control plane reports about jobs and GPUs: a job's wire form, GPU usage, and the
``usage`` and ``queue`` events with pending jobs' expected starts (docs/ARCHITECTURE.md,
"REST API (v1)" and "Events").  Runs in the control plane; reads the job table with its lock held."""

from __future__ import annotations

import threading
import time
from typing import Any

from lancefn_jupyter.server.control.events import EventBus
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.placement import Needs, PlacementStrategy
from lancefn_jupyter.server.control.states import PENDING, now_ms
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.policy.budgets import Spend
from lancefn_jupyter.server.policy.costs import GPU_STATS, held_seconds, job_usage
from lancefn_jupyter.server.policy.estimates import QueueEstimator, warm_run_ms
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.namespaces import queue_view
from lancefn_jupyter.server.storage.store import JobRecord

QUEUE_HEAD_EVENT_LEN = 100  # pending job ids per class in each `queue` event
QUEUE_ESTIMATES_INTERVAL_S = 0.25  # `queue` events carry expected starts at most this often (a trailing one follows)


class Reports:
    def __init__(
        self,
        table: JobTable,
        *,
        classes: GpuClassConfig,
        bus: EventBus,
        placement: PlacementStrategy,
        needs: Needs | None = None,
        spend: Spend | None = None,
    ):
        self.table, self.classes, self.bus, self.placement = table, classes, bus, placement
        self.needs = needs  # a version's host (CPU, memory) request ("Compute resources"), for CPU-seconds
        self.spend = spend  # the namespaces' daily budgets and what they spent today ("Budgets"); None: no budgets
        self.estimator = QueueEstimator()  # pending jobs' expected start, from recent run times
        self._estimates_sent = 0.0  # monotonic time of the last `queue` event that carried them
        self._estimates_timer: threading.Timer | None = None

    def close(self) -> None:
        if self._estimates_timer is not None:
            self._estimates_timer.cancel()

    # ------------------------------------------------------------------- jobs

    def job_wire(self, rec: JobRecord) -> dict:
        """The Job wire form, built without pydantic for speed. Placement and progress carry every
        field (docs/ARCHITECTURE.md, "REST API (v1)"; the side panel and other tools read them without defaults)."""
        table = self.table
        placement: dict[str, Any] = {
            "gpu_class": rec.gpu_class,
            "num_gpus": rec.num_gpus or 0,
            "devices": list(rec.devices or ()),
            "waiting_on_capacity": False,
            "queue_position": None,
            "expected_start_ms": None,
            "expected_start_uncertain": False,
        }
        if rec.state == PENDING:
            # Queued (not yet placed): waiting for its class's GPUs, or a CPU slot.
            position = table.scheduler.queue_position(rec.job_id)
            if position is not None:
                placement["waiting_on_capacity"] = True
                placement["queue_position"] = position
                reason = table.scheduler.waiting_for(rec.job_id)  # CPU or memory ("Compute resources")
                if reason is not None:
                    placement["pending_reason"] = reason
                if rec.num_gpus:
                    at, uncertain = self.start_estimate(rec.job_id)
                    placement["expected_start_ms"], placement["expected_start_uncertain"] = at, uncertain
            elif (waiting := table.environment_waits.get(rec.job_id)) is not None:
                placement["pending_reason"] = waiting()  # its environment is building: no queue place yet
            else:
                self.placement.describe_wait(rec, placement)  # queued in the executor (Ray): no positions
        if rec.node is not None:
            placement["node"] = rec.node
        progress = {"rows_done": rec.rows_done or 0, "rows_total": rec.rows_total or 0}
        wire: dict[str, Any] = {
            "job_id": rec.job_id,
            "namespace": rec.namespace,
            "job_type": rec.job_type,
            "job_state": rec.state,
            "creation_ms": rec.creation_ms,
            "placement": placement,
            "progress": progress,
        }
        if rec.started_ms is not None:
            wire["started_ms"] = rec.started_ms
        if rec.finished_ms is not None:
            wire["finished_ms"] = rec.finished_ms
        if rec.spec:
            wire["spec"] = rec.spec
        if isinstance(rec.result, dict) and "arrow" in rec.result:
            # The result is an Arrow IPC file: GET /v1/jobs/result streams it; the job shows a summary.
            arrow = rec.result["arrow"]
            wire["result_format"] = "arrow"
            # expired: removed by retention; committed too: a backfill chunk's, its rows are in the table.
            gone = {key: True for key in ("expired", "committed") if arrow.get(key)}
            wire["result_summary"] = {**arrow.get("summary", {}), **gone}
        elif rec.result is not None:
            wire["result"] = rec.result
        if rec.failure is not None:
            wire["failure"] = rec.failure
        if rec.timings is not None:
            wire["timings"] = rec.timings
        if rec.finished_ms is not None and rec.started_ms is not None:
            usage = self.job_usage(rec)
            if usage is not None:
                wire["usage"] = usage
        return wire

    def note_spend(self, rec: JobRecord) -> None:
        """An ended job counts against its namespace's daily budget; past it, the namespace's queued jobs wait (lock
        held; docs/ARCHITECTURE.md, "Budgets")."""
        spend = self.spend
        if spend is None or rec.namespace not in spend.budgets or rec.finished_ms is None:
            return
        usage = self.job_usage(rec)
        if usage is not None:
            spend.add(rec.namespace, usage, rec.finished_ms)
            reason = spend.over(rec.namespace, now_ms())
            if reason is not None:
                self.table.scheduler.paused[rec.namespace] = reason

    def job_usage(self, rec: JobRecord) -> dict[str, Any] | None:
        """What an ended job held and cost (docs/ARCHITECTURE.md, "Cost"); None for a job that never ran."""
        held = held_seconds(rec.started_ms, rec.finished_ms, rec.timings)
        if held is None or rec.job_type != "run_function":
            return None
        need = None
        if self.needs is not None:
            need = self.needs(rec.namespace, rec.spec.get("name", ""), rec.spec.get("version", ""), rec.gpu_class)
        cpu = need[0] if need is not None else (0.0 if rec.num_gpus else 1.0)  # a CPU function: one core
        spec = self.classes.get(rec.gpu_class)  # a CPU function: the default class's prices
        usage = job_usage(held, rec.num_gpus or 0, cpu, spec.gpu_class if spec is not None else None)
        timings = rec.timings or {}
        for field in GPU_STATS:  # sampled on a real GPU (worker/gpustats.py), kept with its timings
            if field in timings:
                usage[field] = timings[field]
        return usage

    def note_run_time(self, rec: JobRecord) -> None:
        if (
            rec.job_type == "run_function"
            and rec.gpu_class
            and rec.started_ms is not None
            and rec.finished_ms is not None
        ):
            self.estimator.run_times.record(
                rec.spec.get("name", ""),
                rec.spec.get("version", ""),
                rec.gpu_class,
                warm_run_ms(rec.started_ms, rec.finished_ms, rec.timings),
            )

    def expected_start(self, job_id: str) -> int | None:
        """When a queued GPU job should start (epoch ms), or None when unknown (see `estimates`)."""
        return self.start_estimate(job_id)[0]

    def start_estimate(self, job_id: str) -> tuple[int | None, bool]:
        """``(expected start or None, whether it is uncertain)`` of a queued GPU job (see `estimates`)."""
        table = self.table
        with table.lock:
            rec = table.active.get(job_id)
            pool = table.scheduler.pools.get(rec.gpu_class or "") if rec is not None else None
            if pool is None or job_id not in pool.queue:
                return None, False
            now = now_ms()
            at = self.estimator.expected_start(now, pool, job_id, table.active)
            return at, at is not None and self.estimator.is_uncertain(now, pool, job_id, table.active)

    # ------------------------------------------------------------------ usage

    def gpu_classes(self) -> dict:
        """``GET /v1/gpu/classes``: every field, defaults included (docs/ARCHITECTURE.md, "REST API (v1)")."""
        return {"classes": [spec.gpu_class.model_dump(mode="json") for spec in self.classes.classes]}

    def gpu_usage(self) -> dict:
        """``GET /v1/gpu/usage`` and the event stream's opening ``usage`` event."""
        with self.table.lock:
            return {"classes": self.usage()}

    def usage(self) -> list[dict]:
        """GpuUsage per class, as the placement strategy sees it (the scheduler's, or the executor's), with when
        each idle warm worker of the class retires (the executor's)."""
        usage = self.placement.usage()
        executor = self.table.executor
        class_of = {device: spec.name for spec in self.classes.classes for device in spec.devices}
        idle = executor.idle_retire_ms(class_of) if executor is not None else []
        if idle:
            retire: dict[str, list[int]] = {}
            for gpu_class, at in idle:
                retire.setdefault(gpu_class, []).append(at)
            for entry in usage:
                if entry["name"] in retire:
                    entry["warm_retire_ms"] = sorted(retire[entry["name"]])
        return usage

    def publish_usage(self) -> None:
        if not self.bus.listened():  # a new stream starts from snapshots of both
            return
        self.bus.publish("usage", None, dumps({"classes": self.usage()}))
        if self.placement.has_queue:
            # When the queue moves, every job behind moves up without an event of its own (one per
            # job would cost O(queue) writes per start): UIs re-number pending jobs (and re-read
            # their expected start) from this.
            self._publish_queue(self._queue_payload())

    # ------------------------------------------------------------------ queue

    def queue_snapshot(self, scope: str | None = None) -> dict | None:
        """The `queue` event payload now as ``scope`` sees it (None when the executor owns queuing, as Ray does)."""
        if not self.placement.has_queue:
            return None
        with self.table.lock:
            payload = self._queue_payload(estimates=True)
            return queue_view(payload, self._queue_owners(payload), scope)

    def _queue_owners(self, payload: dict) -> dict[str, str]:
        """Namespace of each job a `queue` payload lists (to render it per subscriber's scope)."""
        active = self.table.active
        return {
            job_id: rec.namespace
            for ids in payload["classes"].values()
            for job_id in ids
            if (rec := active.get(job_id))
        }

    def _publish_queue(self, payload: dict) -> None:
        # Each namespace sees the others' queued jobs as null (positions count them; ids don't leak).
        owners = self._queue_owners(payload)
        self.bus.publish("queue", None, lambda scope: dumps(queue_view(payload, owners, scope)))

    def _queue_payload(self, *, estimates: bool = False) -> dict:
        """The `queue` event. Expected starts ride along at most every QUEUE_ESTIMATES_INTERVAL_S (a busy
        queue moves hundreds of times a second); a skipped update is sent by a trailing event."""
        heads = self.table.scheduler.queue_heads(QUEUE_HEAD_EVENT_LEN)
        payload: dict[str, Any] = {"classes": heads}
        now = time.monotonic()
        if estimates or now - self._estimates_sent >= QUEUE_ESTIMATES_INTERVAL_S:
            self._estimates_sent = now
            starts = {job_id: self.start_estimate(job_id) for ids in heads.values() for job_id in ids}
            payload["expected_start_ms"] = {job_id: at for job_id, (at, _) in starts.items()}
            # Keyed by job id like `expected_start_ms`, so each namespace sees only its own (queue_view).
            payload["expected_start_uncertain"] = {job_id: True for job_id, (_, vague) in starts.items() if vague}
        elif self._estimates_timer is None:
            self._estimates_timer = threading.Timer(QUEUE_ESTIMATES_INTERVAL_S, self._publish_estimates)
            self._estimates_timer.daemon = True
            self._estimates_timer.start()
        return payload

    def _publish_estimates(self) -> None:
        with self.table.lock:
            self._estimates_timer = None
            if self.table.started and self.placement.has_queue:
                self._publish_queue(self._queue_payload(estimates=True))
