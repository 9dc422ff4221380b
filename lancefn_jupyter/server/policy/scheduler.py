"""Pure placement decisions: which pending job gets which devices of its GPU class.

Rules (docs/ARCHITECTURE.md, "Scheduling"):
- Each GPU class is an independent pool of device ids with a FIFO queue of pending jobs.
- Strict FIFO within a class: only the head of the queue may start; if it needs more GPUs
  than are free, later (smaller) jobs wait behind it.  This costs some utilisation but means
  a multi-GPU job can never be starved by a stream of 1-GPU jobs.
- A job never fails for lack of capacity; it simply stays queued.  (Requests that could
  *never* fit — more GPUs than the class has — are rejected by the catalog before enqueueing.)
- CPU jobs (``num_gpus == 0``, no class) need no devices and never wait for a GPU; they are
  placed at the next ``schedule`` call, FIFO, up to ``cpu_slots`` at once (default unlimited;
  the server passes the CPU count so a burst of CPU jobs can't fork hundreds of workers).
- Warm devices first (docs/ARCHITECTURE.md, "Warm state"): a head that fits gets a free device set
  whose idle worker already holds its function version (``warm(owner)``, asked only then), else the
  lowest free devices.  Which job starts next never changes, only where.

No I/O, no clocks, no threads: the control plane calls these under its lock.  Every decision is
O(1) (a warm lookup: O(the class's GPUs + the sets it names)), and ``queue_position`` is O(log cancellations) (the reports ask it for every PENDING job
event, so it must not walk a 10,000-job queue); only ``queue_positions`` is O(queue).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

__all__ = ["ClassPool", "Placement", "SchedulerState", "WarmLookup", "queue_positions", "release", "schedule"]

# A job's owner (the plane's ``(namespace, name, version)``) → the device sets whose idle worker holds it.
WarmLookup = Callable[[Hashable], Iterable[Sequence[str]]]


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpu_class: str | None  # None for CPU jobs
    devices: tuple[str, ...]


class _Ranks:
    """1-based positions in a FIFO without walking it.

    Each queued job gets an increasing ticket.  A job's position is its ticket minus the
    removed tickets below it: ``popped`` counts removed tickets below every queued one (jobs
    placed from the head, or cancelled at the head), ``holes`` keeps the other removed tickets
    (cancelled mid-queue) sorted until the head moves past them.
    """

    __slots__ = ("holes", "next", "popped", "tickets")

    def __init__(self) -> None:
        self.tickets: dict[str, int] = {}
        self.next = 0
        self.popped = 0
        self.holes: list[int] = []

    def add(self, job_id: str) -> None:
        self.tickets[job_id] = self.next
        self.next += 1

    def remove(self, job_id: str, queue: OrderedDict[str, Any]) -> None:
        """Forget ``job_id`` (already removed from ``queue``)."""
        ticket = self.tickets.pop(job_id, None)
        if ticket is None:
            return
        if not queue:
            self.tickets.clear()
            self.next = self.popped = 0
            self.holes.clear()
            return
        head = self.tickets[next(iter(queue))]
        if ticket < head:
            self.popped += 1
        else:
            insort(self.holes, ticket)
        while self.holes and self.holes[0] < head:
            self.holes.pop(0)
            self.popped += 1

    def position(self, job_id: str) -> int | None:
        ticket = self.tickets.get(job_id)
        if ticket is None:
            return None
        return ticket - self.popped - bisect_left(self.holes, ticket) + 1


@dataclass
class ClassPool:
    """One GPU class: its devices, who holds them, and who waits."""

    name: str
    devices: tuple[str, ...]
    # Free devices are kept in configured order so placements are deterministic
    # (lowest ids first), which makes logs and tests readable.
    free: list[str] = field(default_factory=list)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job_id -> devices
    queue: OrderedDict[str, int] = field(default_factory=OrderedDict)  # job_id -> num_gpus, FIFO
    ranks: _Ranks = field(default_factory=_Ranks)  # queue positions of ``queue``
    owners: dict[str, Hashable] = field(default_factory=dict)  # queued job_id -> owner, when given

    def __post_init__(self) -> None:
        if not self.free:
            self.free = list(self.devices)

    def take(self, n: int) -> tuple[str, ...]:
        taken = tuple(self.free[:n])
        del self.free[:n]
        return taken

    def take_these(self, devices: Sequence[str]) -> tuple[str, ...]:
        """Take exactly ``devices`` (all free) out of the free list."""
        for device in devices:
            self.free.remove(device)
        return tuple(devices)

    def give_back(self, devices: Iterable[str]) -> None:
        order = {device: i for i, device in enumerate(self.devices)}
        # Devices that are no longer configured (capacity shrank) are simply dropped.
        self.free.extend(d for d in devices if d in order)
        self.free.sort(key=order.__getitem__)


class SchedulerState:
    """Mutable scheduler state; all methods are pure bookkeeping."""

    def __init__(
        self, classes: Mapping[str, Sequence[str]], cpu_slots: int | None = None, warm: WarmLookup | None = None
    ):
        self.cpu_slots = cpu_slots
        self.warm = warm  # None: placements ignore warm workers (lowest free devices)
        self.pools: dict[str, ClassPool] = {
            name: ClassPool(name=name, devices=tuple(devices)) for name, devices in classes.items()
        }
        self.cpu_queue: OrderedDict[str, None] = OrderedDict()
        self._cpu_ranks = _Ranks()
        self.cpu_running: set[str] = set()
        self._class_of: dict[str, str | None] = {}  # every job we know about -> its class (None = CPU)

    # ----------------------------------------------------------------- mutation

    def enqueue(self, job_id: str, gpu_class: str | None, num_gpus: int, owner: Hashable | None = None) -> None:
        """Append a job to its class's queue (or the CPU queue when ``num_gpus == 0``); ``owner``:
        what ``warm`` is asked about when the job is placed (None: lowest free devices)."""
        if job_id in self._class_of:
            raise ValueError(f"job {job_id} is already scheduled")
        if num_gpus <= 0:
            self.cpu_queue[job_id] = None
            self._cpu_ranks.add(job_id)
            self._class_of[job_id] = None
            return
        pool = self.pools.get(gpu_class or "")
        if pool is None:
            raise KeyError(f"unknown GPU class {gpu_class!r}")
        if num_gpus > len(pool.devices):
            # Would wait forever; the catalog validates first, this guards the invariant.
            raise ValueError(f"job {job_id} needs {num_gpus} GPUs but class {gpu_class!r} has {len(pool.devices)}")
        pool.queue[job_id] = num_gpus
        pool.ranks.add(job_id)
        if owner is not None:
            pool.owners[job_id] = owner
        self._class_of[job_id] = gpu_class

    def release(self, job_id: str) -> tuple[str, ...]:
        """Forget a job wherever it is (queued or running); returns the devices it freed."""
        if job_id not in self._class_of:
            return ()
        gpu_class = self._class_of.pop(job_id)
        if gpu_class is None:
            if self.cpu_queue.pop(job_id, 0) is None:
                self._cpu_ranks.remove(job_id, self.cpu_queue)
            self.cpu_running.discard(job_id)
            return ()
        pool = self.pools[gpu_class]
        if pool.queue.pop(job_id, None) is not None:
            pool.ranks.remove(job_id, pool.queue)
            pool.owners.pop(job_id, None)
        devices = pool.held.pop(job_id, ())
        pool.give_back(devices)
        return devices

    def set_devices(self, gpu_class: str, devices: Sequence[str]) -> None:
        """Replace a class's device list (e.g. capacity reported by Ray); held devices stay held."""
        pool = self.pools.get(gpu_class)
        if pool is None:
            self.pools[gpu_class] = ClassPool(name=gpu_class, devices=tuple(devices))
            return
        held = {d for ds in pool.held.values() for d in ds}
        pool.devices = tuple(devices)
        pool.free = [d for d in pool.devices if d not in held]

    def schedule(self) -> list[Placement]:
        """Place every job that can start now, in FIFO order per class."""
        placements: list[Placement] = []
        while self.cpu_queue and (self.cpu_slots is None or len(self.cpu_running) < self.cpu_slots):
            job_id, _ = self.cpu_queue.popitem(last=False)
            self._cpu_ranks.remove(job_id, self.cpu_queue)
            self.cpu_running.add(job_id)
            placements.append(Placement(job_id, None, ()))
        for pool in self.pools.values():
            queue = pool.queue
            while queue:
                job_id, num_gpus = next(iter(queue.items()))
                if num_gpus > len(pool.free):
                    break  # strict FIFO: the head blocks everyone behind it
                queue.popitem(last=False)
                pool.ranks.remove(job_id, queue)
                devices = self._warm_set(pool, job_id, num_gpus) or pool.take(num_gpus)
                pool.held[job_id] = devices
                placements.append(Placement(job_id, pool.name, devices))
        return placements

    def _warm_set(self, pool: ClassPool, job_id: str, num_gpus: int) -> tuple[str, ...] | None:
        """The first device set ``warm`` names for the job's owner that is exactly its size and
        all free, taken; None when there is none (or no owner, or no lookup)."""
        owner = pool.owners.pop(job_id, None)
        if owner is None or self.warm is None:
            return None
        free = set(pool.free)
        for devices in self.warm(owner):
            if len(devices) == num_gpus and len(set(devices)) == num_gpus and free.issuperset(devices):
                return pool.take_these(devices)
        return None

    # ------------------------------------------------------------------ queries

    def is_pending(self, job_id: str) -> bool:
        gpu_class = self._class_of.get(job_id, "")
        if gpu_class is None:
            return job_id in self.cpu_queue
        pool = self.pools.get(gpu_class)
        return pool is not None and job_id in pool.queue

    def queue_positions(self, gpu_class: str | None) -> dict[str, int]:
        """1-based position of each pending job of a class (1 = next to start)."""
        queue = self.cpu_queue if gpu_class is None else self.pools[gpu_class].queue
        return {job_id: i for i, job_id in enumerate(queue, start=1)}

    def queue_position(self, job_id: str) -> int | None:
        if job_id not in self._class_of:
            return None
        gpu_class = self._class_of[job_id]
        ranks = self._cpu_ranks if gpu_class is None else self.pools[gpu_class].ranks
        return ranks.position(job_id)

    def queue_heads(self, limit: int) -> dict[str, list[str]]:
        """Per GPU class, the first `limit` pending job ids in start order (position = index + 1)."""
        return {name: list(islice(pool.queue, limit)) for name, pool in self.pools.items()}

    def usage(self) -> list[dict]:
        """Per class: gpus_total, gpus_busy, jobs_running, jobs_pending (GpuUsage fields)."""
        return [
            {
                "name": pool.name,
                "gpus_total": len(pool.devices),
                "gpus_busy": len(pool.devices) - len(pool.free),
                "jobs_running": len(pool.held),
                "jobs_pending": len(pool.queue),
            }
            for pool in self.pools.values()
        ]


# Function spellings of the core operations, for callers that prefer them.
def schedule(state: SchedulerState) -> list[Placement]:
    return state.schedule()


def release(state: SchedulerState, job_id: str) -> tuple[str, ...]:
    return state.release(job_id)


def queue_positions(state: SchedulerState, gpu_class: str | None) -> dict[str, int]:
    return state.queue_positions(gpu_class)
