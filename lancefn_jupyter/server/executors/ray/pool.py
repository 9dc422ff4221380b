"""Warm actors, as plain bookkeeping (no Ray): which job runs next, on which actor, and which
idle actor retires.  The bridge does the Ray calls this decides.

Every job runs in a warm actor kept per key ((class, GPUs,) function name, version, namespace),
so a process that ran one version never runs another.  The bridge, not Ray, queues them, in one
pool for CPU jobs and one per GPU class.  A job weighs its GPUs (a CPU job weighs 1); a pool has
``slots`` (the cluster's CPUs, or the class's GPUs), and the jobs running plus the idle actors
weigh at most that: an idle GPU actor holds its GPUs.  A job whose version has an idle actor
reuses it; else an idle actor of another version whose *setup key* is the job's (same class, GPUs,
name, namespace and setup digest: docs/ARCHITECTURE.md, "Setup reuse") takes it and moves to the
job's key (:meth:`reused_from` says from which); otherwise the least recently used idle actors of
other keys retire to make room.

Jobs start in submission order, as the local scheduler places them (docs/ARCHITECTURE.md,
"Scheduling"): the head of the queue waits for room and the jobs behind it wait too.  When
nothing runs, the head starts even if it weighs more than ``slots`` (a class scaled to zero, or
a node not yet joined): Ray then holds it, and an autoscaler sees its demand.  The GPUs are
counted cluster-wide, so free ones may sit on the wrong node; the bridge then retires idle actors
itself (:meth:`retire_least_recent`) for a new actor Ray does not place.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Any


class ActorPool:
    def __init__(self, slots: int, idle_s: float) -> None:
        self.slots = slots
        self.idle_s = idle_s
        self._queue: collections.deque[tuple[str, Hashable, int]] = collections.deque()
        self._busy: dict[str, list] = {}  # job id → [key, weight, actor or None while it is being created]
        self._idle: dict[Hashable, list[tuple[Any, float, int]]] = {}  # key → (actor, idle since, weight), oldest first
        self._setups: dict[Hashable, Hashable] = {}  # key → its setup key (only keys whose setup may be reused)
        self._reused: dict[str, Hashable] = {}  # a started job → the key whose idle actor it took

    def submit(self, job_id: str, key: Hashable, weight: int = 1, setup: Hashable | None = None) -> None:
        """Queue a job of ``key``; ``setup``: its setup key, so an idle actor of another key with it may run it."""
        if setup is not None:
            self._setups[key] = setup
        self._queue.append((job_id, key, weight))

    def _take_idle(self, job_id: str, key: Hashable) -> Any:
        """The most recently idle actor of ``key`` (the likeliest still cached), else of a key with its setup key."""
        owner: Hashable | None = key if self._idle.get(key) else None
        setup = self._setups.get(key)
        if owner is None and setup is not None:
            peers = [k for k, idle in self._idle.items() if self._setups.get(k) == setup and idle]
            owner = max(peers, key=lambda k: self._idle[k][-1][1], default=None)
            if owner is not None:
                self._reused[job_id] = owner
        if owner is None:
            return None
        idle = self._idle[owner]
        actor = idle.pop()[0]
        if not idle:
            del self._idle[owner]
        return actor

    def reused_from(self, job_id: str) -> Hashable | None:
        """The key of the other version whose idle actor the started job took (once; None: its own or a new one)."""
        return self._reused.pop(job_id, None)

    def dispatch(self) -> tuple[list[tuple[str, Any]], list[Any]]:
        """Jobs that start now, each with its warm actor (``None``: create one and :meth:`bind`
        it), and the idle actors to retire to make room for them."""
        starts, retire = [], []
        while self._queue:
            job_id, key, weight = self._queue[0]
            busy = self.busy_weight()
            if busy and busy + weight > self.slots:
                break  # the head waits for room, and the jobs behind it wait too
            self._queue.popleft()
            actor = self._take_idle(job_id, key)
            if actor is None:
                while self._idle and busy + self.idle_weight() + weight > self.slots:
                    retire.append(self.retire_least_recent())
            self._busy[job_id] = [key, weight, actor]
            starts.append((job_id, actor))
        return starts, retire

    def bind(self, job_id: str, actor: Any) -> bool:
        """The new actor of a started job; ``False`` if the job was removed meanwhile."""
        entry = self._busy.get(job_id)
        if entry is None:
            return False
        entry[2] = actor
        return True

    def release(self, job_id: str, now: float, *, reuse: bool) -> Any:
        """The job ended: its actor turns idle (``reuse``), else it is returned to be killed."""
        entry = self._busy.pop(job_id, None)
        self._reused.pop(job_id, None)
        if entry is None:
            return None
        key, weight, actor = entry
        if reuse and actor is not None:
            self._idle.setdefault(key, []).append((actor, now, weight))
            return None
        return actor

    def remove(self, job_id: str) -> Any:
        """Cancelled or timed out: dropped from the queue, or its actor returned to be killed."""
        for index, (queued, _, _) in enumerate(self._queue):
            if queued == job_id:
                del self._queue[index]
                return None
        return self.release(job_id, 0.0, reuse=False)

    def expire(self, now: float) -> list[Any]:
        """Idle actors past ``idle_s``, removed."""
        retire = []
        for key in list(self._idle):
            retire += [entry[0] for entry in self._idle[key] if now - entry[1] >= self.idle_s]
            self._idle[key] = [entry for entry in self._idle[key] if now - entry[1] < self.idle_s]
            if not self._idle[key]:
                del self._idle[key]
        if len(self._setups) > 64 + 4 * (len(self._idle) + len(self._busy) + len(self._queue)):
            live = {*self._idle, *(entry[0] for entry in self._busy.values()), *(key for _, key, _ in self._queue)}
            self._setups = {key: setup for key, setup in self._setups.items() if key in live}
        return retire

    def clear(self) -> list[Any]:
        """Every actor (idle and busy), removed; the queue is dropped."""
        actors = [entry[0] for idle in self._idle.values() for entry in idle]
        actors += [entry[2] for entry in self._busy.values() if entry[2] is not None]
        self._queue.clear()
        self._busy.clear()
        self._idle.clear()
        self._reused.clear()
        return actors

    def waiting(self) -> bool:
        """Whether jobs are queued (a freed slot may start one)."""
        return bool(self._queue)

    def queued(self) -> list[str]:
        """The queued jobs' ids, in submission order."""
        return [job_id for job_id, _, _ in self._queue]

    def running(self) -> list[str]:
        """The started jobs' ids (their actors running them or being placed)."""
        return list(self._busy)

    def retire_times(self) -> list[float]:
        """When each idle actor retires unused (the clock of ``release``'s ``now``), soonest first."""
        return sorted(entry[1] + self.idle_s for idle in self._idle.values() for entry in idle)

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def idle_weight(self) -> int:
        return sum(entry[2] for idle in self._idle.values() for entry in idle)

    def busy_weight(self) -> int:
        return sum(entry[1] for entry in self._busy.values())

    def retire_least_recent(self) -> Any:
        """The least recently used idle actor, removed (``None`` if none is idle)."""
        if not self._idle:
            return None
        key = min(self._idle, key=lambda k: self._idle[k][0][1])
        actor = self._idle[key].pop(0)[0]
        if not self._idle[key]:
            del self._idle[key]
        return actor
