"""Pure placement decisions: which pending job gets which devices of its GPU class.

Rules (docs/ARCHITECTURE.md, "Scheduling"):
- Each GPU class is an independent pool of device ids with a queue of pending jobs, FIFO per namespace.
- Fair across namespaces: the next job to start is the head of the waiting namespace that holds the fewest
  GPUs of the class (ties: the earlier job), so one team's long queue cannot keep another team's one job
  waiting behind it.  With one namespace waiting this is plain FIFO.
- Strict order otherwise: if the chosen head needs more GPUs than are free, everyone waits behind it.  This
  costs some utilisation but means a multi-GPU job can never be starved by a stream of 1-GPU jobs.
- ``caps`` (namespace → max GPUs it may hold over all classes, ``max_gpus`` in the key file): a namespace at
  its cap is passed over (it blocks no one) until its own jobs end.
- A job never fails for lack of capacity; it simply stays queued.  (Requests that could
  *never* fit — more GPUs than the class has, or than the namespace's cap — are rejected before enqueueing.)
- CPU jobs (``num_gpus == 0``, no class) need no devices and never wait for a GPU; they are
  placed at the next ``schedule`` call, round the namespaces the same way (by CPU jobs running), up to
  ``cpu_slots`` at once (default unlimited; the server passes the CPU count so a burst of CPU jobs can't
  fork hundreds of workers).
- Host CPU and memory (docs/ARCHITECTURE.md, "Compute resources"): where a class has totals (``totals``), a job
  that asks for some (``needs``) also waits until that much is free; the head that waits so blocks those behind it,
  as for GPUs, and ``waiting_for`` names what it waits for.
- Warm devices first (docs/ARCHITECTURE.md, "Warm state"): a head that fits gets a free device set
  whose idle worker already holds its function version (``warm(owner)``, asked only then), else the
  lowest free devices.  Which job starts next never changes, only where.

No I/O, no clocks, no threads: the control plane calls these under its lock.  Placing a job costs
O(log namespaces) (plus a warm lookup: O(the class's GPUs + the sets it names)), and ``queue_position`` is
O(namespaces + log queue) (the reports ask it for every PENDING job event, so it must not walk a 10,000-job
queue); ``queue_positions`` and ``queue_heads`` walk the start order.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heapreplace
from itertools import islice

from lancefn_jupyter.wire.quantities import format_bytes, format_cores

__all__ = ["ClassPool", "Placement", "SchedulerState", "WarmLookup", "queue_positions", "release", "schedule"]

# A job's owner (the plane's ``(namespace, name, version)``) → the device sets whose idle worker holds it.
WarmLookup = Callable[[Hashable], Iterable[Sequence[str]]]


@dataclass(frozen=True)
class Placement:
    job_id: str
    gpu_class: str | None  # None for CPU jobs
    devices: tuple[str, ...]


class FairQueue:
    """Pending jobs, FIFO per namespace, started round the namespaces by what each holds (``levels``).

    Each job gets an increasing ticket; a namespace's queue is the sorted list of its tickets, so its k-th job
    and a job's rank in it are O(1) and O(log n) without walking anything.
    """

    __slots__ = ("_next", "by_ticket", "jobs", "tickets")

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[str, int, int]] = {}  # job_id -> (namespace, units, ticket)
        self.by_ticket: dict[int, str] = {}
        self.tickets: dict[str, list[int]] = {}  # namespace -> its queued tickets, ascending (FIFO)
        self._next = 0

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.jobs

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job_id: str, namespace: str, units: int) -> None:
        ticket = self._next
        self._next += 1
        self.jobs[job_id] = (namespace, units, ticket)
        self.by_ticket[ticket] = job_id
        self.tickets.setdefault(namespace, []).append(ticket)

    def remove(self, job_id: str) -> bool:
        """Forget ``job_id``; False if it was not queued."""
        entry = self.jobs.pop(job_id, None)
        if entry is None:
            return False
        namespace, _, ticket = entry
        del self.by_ticket[ticket]
        queue = self.tickets[namespace]
        del queue[bisect_left(queue, ticket)]
        if not queue:
            del self.tickets[namespace]
        return True

    def head(self, namespace: str) -> tuple[str, int, int]:
        """``(job_id, units, ticket)`` of the namespace's first queued job."""
        ticket = self.tickets[namespace][0]
        job_id = self.by_ticket[ticket]
        return job_id, self.jobs[job_id][1], ticket

    def order(
        self, levels: Mapping[str, int], taken: Mapping[str, tuple[int, int]] | None = None
    ) -> Iterator[tuple[str, int]]:
        """``(job_id, units)`` in start order, were each start to raise its namespace's level by its units.
        ``taken``: namespace → (jobs, units) of its queue's head already walked: the order resumes after them
        in O(namespaces), not by walking them again (the estimates extend their replay so)."""
        taken = taken or {}
        if len(self.tickets) == 1:  # one team waiting: its FIFO
            ((ns, queue),) = self.tickets.items()
            i = taken.get(ns, (0, 0))[0]
            while i < len(queue):  # callers stop iterating before they change the queue
                job_id = self.by_ticket[queue[i]]
                yield job_id, self.jobs[job_id][1]
                i += 1
            return
        heap = []
        for ns, queue in self.tickets.items():
            k, units = taken.get(ns, (0, 0))
            if k < len(queue):
                heap.append((levels.get(ns, 0) + units, queue[k], ns, k))
        heapify(heap)
        while heap:
            level, ticket, ns, k = heap[0]
            job_id = self.by_ticket[ticket]
            units = self.jobs[job_id][1]
            yield job_id, units
            queue = self.tickets[ns]
            if k + 1 < len(queue):
                heapreplace(heap, (level + units, queue[k + 1], ns, k + 1))
            else:
                heappop(heap)

    def position(self, job_id: str, levels: Mapping[str, int]) -> int | None:
        """1-based place of ``job_id`` in :meth:`order`, counting one unit per queued job ahead (exact when each
        job takes one unit, as nearly all do; within one namespace always exact)."""
        entry = self.jobs.get(job_id)
        if entry is None:
            return None
        namespace, _, ticket = entry
        ahead = bisect_left(self.tickets[namespace], ticket)
        if len(self.tickets) == 1:
            return ahead + 1
        level = levels.get(namespace, 0) + ahead
        for other, queue in self.tickets.items():
            if other == namespace:
                continue
            gap = level - levels.get(other, 0)  # how many of its jobs start at a lower level
            if gap < 0:
                continue
            ahead += min(gap, len(queue))
            if gap < len(queue) and queue[gap] < ticket:
                ahead += 1  # the same level: the earlier job first
        return ahead + 1


@dataclass
class ClassPool:
    """One GPU class: its devices, who holds them, and who waits."""

    name: str
    devices: tuple[str, ...]
    # Free devices are kept in configured order so placements are deterministic
    # (lowest ids first), which makes logs and tests readable.
    free: list[str] = field(default_factory=list)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job_id -> devices
    holder: dict[str, str] = field(default_factory=dict)  # running job_id -> its namespace
    levels: dict[str, int] = field(default_factory=dict)  # namespace -> GPUs of this class it holds
    queue: FairQueue = field(default_factory=FairQueue)
    owners: dict[str, Hashable] = field(default_factory=dict)  # queued job_id -> owner, when given
    # Host CPU cores and memory bytes its jobs hold together at most, None: not counted ("Compute resources").
    cpu_total: float | None = None
    memory_total: int | None = None
    cpu_used: float = 0.0
    memory_used: int = 0
    needs: dict[str, tuple[float, int]] = field(default_factory=dict)  # job_id -> (cores, bytes) it asks for
    short: tuple[str, str] | None = None  # (the head job waiting for CPU or memory, what it waits for)

    def __post_init__(self) -> None:
        if not self.free:
            self.free = list(self.devices)

    def shortage(self, need: tuple[float, int]) -> str | None:
        """What of ``need`` is not free now, in words; None when it all is."""
        cpu, memory = need
        if self.cpu_total is not None and cpu > self.cpu_total - self.cpu_used + 1e-9:
            free = max(0.0, self.cpu_total - self.cpu_used)
            return f"waiting for CPU: it needs {format_cores(cpu)}, {free:g} of the class's {self.cpu_total:g} are free"
        if self.memory_total is not None and memory > self.memory_total - self.memory_used:
            free_bytes = max(0, self.memory_total - self.memory_used)
            return (
                f"waiting for memory: it needs {format_bytes(memory)}, {format_bytes(free_bytes)} of the class's "
                f"{format_bytes(self.memory_total)} are free"
            )
        return None

    def start_order(self) -> Iterator[tuple[str, int]]:
        """``(job_id, num_gpus)`` of the queued jobs in the order they are due to start."""
        return self.queue.order(self.levels)

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


def _drop(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) - n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


class SchedulerState:
    """Mutable scheduler state; all methods are pure bookkeeping."""

    def __init__(
        self,
        classes: Mapping[str, Sequence[str]],
        cpu_slots: int | None = None,
        warm: WarmLookup | None = None,
        caps: Mapping[str, int] | None = None,
        totals: Mapping[str, tuple[float | None, int | None]] | None = None,
    ):
        """``totals``: class → (CPU cores, memory bytes) its jobs may hold together (None: not counted)."""
        self.cpu_slots = cpu_slots
        self.warm = warm  # None: placements ignore warm workers (lowest free devices)
        self.caps: dict[str, int] = dict(caps or {})  # namespace -> most GPUs it may hold, all classes together
        # namespace -> why its queued jobs wait (over its daily budget: "Budgets"); passed over like one at its cap
        self.paused: dict[str, str] = {}
        self.pools: dict[str, ClassPool] = {
            name: ClassPool(name=name, devices=tuple(devices)) for name, devices in classes.items()
        }
        self.cpu_queue = FairQueue()
        self.cpu_running: dict[str, str] = {}  # job_id -> namespace
        self._cpu_levels: dict[str, int] = {}  # namespace -> CPU jobs it runs
        self.gpus_held: dict[str, int] = {}  # namespace -> GPUs it holds over all classes
        self._class_of: dict[str, str | None] = {}  # every job we know about -> its class (None = CPU)
        for name, (cpu, memory) in (totals or {}).items():
            if name in self.pools:
                self.pools[name].cpu_total, self.pools[name].memory_total = cpu, memory

    # ----------------------------------------------------------------- mutation

    def enqueue(
        self,
        job_id: str,
        gpu_class: str | None,
        num_gpus: int,
        owner: Hashable | None = None,
        namespace: str = "",
        needs: tuple[float, int] | None = None,
    ) -> None:
        """Append a job to its namespace's queue of its class (or the CPU queue when ``num_gpus == 0``);
        ``owner``: what ``warm`` is asked about when the job is placed (None: lowest free devices); ``needs``: the
        host (CPU cores, memory bytes) it holds while it runs."""
        if job_id in self._class_of:
            raise ValueError(f"job {job_id} is already scheduled")
        if num_gpus <= 0:
            self.cpu_queue.add(job_id, namespace, 1)
            self._class_of[job_id] = None
            return
        pool = self.pools.get(gpu_class or "")
        if pool is None:
            raise KeyError(f"unknown GPU class {gpu_class!r}")
        if num_gpus > len(pool.devices):
            # Would wait forever; the catalog validates first, this guards the invariant.
            raise ValueError(f"job {job_id} needs {num_gpus} GPUs but class {gpu_class!r} has {len(pool.devices)}")
        cap = self.caps.get(namespace)
        if cap is not None and num_gpus > cap:
            raise ValueError(f"job {job_id} needs {num_gpus} GPUs but namespace {namespace!r} may hold {cap}")
        pool.queue.add(job_id, namespace, num_gpus)
        if owner is not None:
            pool.owners[job_id] = owner
        if needs is not None:
            pool.needs[job_id] = needs
        self._class_of[job_id] = gpu_class

    def release(self, job_id: str) -> tuple[str, ...]:
        """Forget a job wherever it is (queued or running); returns the devices it freed."""
        if job_id not in self._class_of:
            return ()
        gpu_class = self._class_of.pop(job_id)
        if gpu_class is None:
            if not self.cpu_queue.remove(job_id) and (namespace := self.cpu_running.pop(job_id, None)) is not None:
                _drop(self._cpu_levels, namespace, 1)
            return ()
        pool = self.pools[gpu_class]
        if pool.queue.remove(job_id):
            pool.owners.pop(job_id, None)
        devices = pool.held.pop(job_id, ())
        namespace = pool.holder.pop(job_id, None)
        need = pool.needs.pop(job_id, None)
        if pool.short is not None and pool.short[0] == job_id:
            pool.short = None
        if namespace is not None:
            _drop(pool.levels, namespace, len(devices))
            _drop(self.gpus_held, namespace, len(devices))
            if need is not None:
                pool.cpu_used, pool.memory_used = pool.cpu_used - need[0], pool.memory_used - need[1]
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
        """Place every job that can start now, fairly round the namespaces of each class (see above)."""
        placements: list[Placement] = []
        cpu = self.cpu_queue
        while cpu and (self.cpu_slots is None or len(self.cpu_running) < self.cpu_slots):
            job_id = next((j for j, _ in cpu.order(self._cpu_levels) if cpu.jobs[j][0] not in self.paused), None)
            if job_id is None:
                break
            namespace = cpu.jobs[job_id][0]
            cpu.remove(job_id)
            self.cpu_running[job_id] = namespace
            self._cpu_levels[namespace] = self._cpu_levels.get(namespace, 0) + 1
            placements.append(Placement(job_id, None, ()))
        for pool in self.pools.values():
            if pool.queue and pool.free:
                self._schedule_pool(pool, placements)
        return placements

    def _schedule_pool(self, pool: ClassPool, placements: list[Placement]) -> None:
        queue, caps = pool.queue, self.caps
        pool.short = None
        heap = [(pool.levels.get(ns, 0), tickets[0], ns) for ns, tickets in queue.tickets.items()]
        heapify(heap)
        while heap and pool.free:
            level, _, namespace = heap[0]
            job_id, num_gpus, _ = queue.head(namespace)
            cap = caps.get(namespace)
            if (cap is not None and self.gpus_held.get(namespace, 0) + num_gpus > cap) or namespace in self.paused:
                heappop(heap)  # at its cap (or over its budget): it waits for its own jobs to end, blocking no one
                continue
            if num_gpus > len(pool.free):
                break  # the chosen head blocks everyone behind it
            need = pool.needs.get(job_id)
            if need is not None:
                short = pool.shortage(need)
                if short is not None:
                    pool.short = (job_id, short)
                    break  # it blocks those behind it, as for GPUs
                pool.cpu_used, pool.memory_used = pool.cpu_used + need[0], pool.memory_used + need[1]
            queue.remove(job_id)
            devices = self._warm_set(pool, job_id, num_gpus) or pool.take(num_gpus)
            pool.held[job_id] = devices
            pool.holder[job_id] = namespace
            pool.levels[namespace] = level + num_gpus
            self.gpus_held[namespace] = self.gpus_held.get(namespace, 0) + num_gpus
            placements.append(Placement(job_id, pool.name, devices))
            tickets = queue.tickets.get(namespace)
            if tickets:
                heapreplace(heap, (level + num_gpus, tickets[0], namespace))
            else:
                heappop(heap)

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

    def waiting_for(self, job_id: str) -> str | None:
        """What a queued job waits for besides its turn and GPUs: its namespace's budget, or (the head) CPU or
        memory, in words; else None."""
        if self.paused:
            gpu_class = self._class_of.get(job_id, "")
            queue = self.cpu_queue if gpu_class is None else getattr(self.pools.get(gpu_class or ""), "queue", None)
            entry = queue.jobs.get(job_id) if queue is not None else None
            if entry is not None and entry[0] in self.paused:
                return self.paused[entry[0]]
        pool = self.pools.get(self._class_of.get(job_id) or "")
        return pool.short[1] if pool is not None and pool.short is not None and pool.short[0] == job_id else None

    def _order(self, gpu_class: str | None) -> Iterator[tuple[str, int]]:
        if gpu_class is None:
            return self.cpu_queue.order(self._cpu_levels)
        return self.pools[gpu_class].start_order()

    def queue_positions(self, gpu_class: str | None) -> dict[str, int]:
        """1-based position of each pending job of a class (1 = next to start), walking the start order."""
        return {job_id: i for i, (job_id, _) in enumerate(self._order(gpu_class), start=1)}

    def queue_position(self, job_id: str) -> int | None:
        if job_id not in self._class_of:
            return None
        gpu_class = self._class_of[job_id]
        if gpu_class is None:
            return self.cpu_queue.position(job_id, self._cpu_levels)
        pool = self.pools[gpu_class]
        return pool.queue.position(job_id, pool.levels)

    def queue_heads(self, limit: int) -> dict[str, list[str]]:
        """Per GPU class, the first `limit` pending job ids in start order (position = index + 1)."""
        return {name: [job_id for job_id, _ in islice(pool.start_order(), limit)] for name, pool in self.pools.items()}

    def usage(self) -> list[dict]:
        """Per class: gpus_total, gpus_busy, jobs_running, jobs_pending (GpuUsage fields)."""
        return [
            {
                "name": pool.name,
                "gpus_total": len(pool.devices),
                "gpus_busy": len(pool.devices) - len(pool.free),
                "jobs_running": len(pool.held),
                "jobs_pending": len(pool.queue),
                **({"pending_reason": pool.short[1]} if pool.short is not None else {}),
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
