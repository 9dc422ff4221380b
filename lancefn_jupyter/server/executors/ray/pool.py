"""Warm CPU actors, as plain bookkeeping (no Ray): which job runs next, on which actor, and which
idle actor retires.  The bridge does the Ray calls this decides.

CPU jobs (runtime ``python``, no GPUs) run in warm actors kept per (function name, version,
namespace), so a process that ran one version never runs another.  The bridge, not Ray, queues
them: at most ``slots`` run at once (the cluster's CPUs), and at most ``slots`` actors live at
once, busy or idle; a job whose version has no idle actor retires the least recently used idle
actor of another version to make room.  Jobs start in submission order.
"""

from __future__ import annotations

import collections
from typing import Any, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


class CpuActorPool:
    def __init__(self, slots: int, idle_s: float) -> None:
        self.slots = slots
        self.idle_s = idle_s
        self._queue: collections.deque[tuple[str, Hashable]] = collections.deque()
        self._busy: dict[str, list] = {}  # job id → [key, actor or None while it is being created]
        self._idle: dict[Hashable, list[tuple[Any, float]]] = {}  # key → (actor, idle since), oldest first

    def submit(self, job_id: str, key: Hashable) -> None:
        self._queue.append((job_id, key))

    def dispatch(self) -> tuple[list[tuple[str, Any]], list[Any]]:
        """Jobs that start now, each with its warm actor (``None``: create one and :meth:`bind`
        it), and the idle actors to retire to make room for them."""
        starts, retire = [], []
        while self._queue and len(self._busy) < self.slots:
            job_id, key = self._queue.popleft()
            idle = self._idle.get(key)
            actor = idle.pop()[0] if idle else None  # the most recently idle: the likeliest still cached
            if idle is not None and not idle:
                del self._idle[key]
            if actor is None:
                while self._idle and len(self._busy) + self.idle_count() >= self.slots:
                    retire.append(self._pop_least_recent())
            self._busy[job_id] = [key, actor]
            starts.append((job_id, actor))
        return starts, retire

    def bind(self, job_id: str, actor: Any) -> bool:
        """The new actor of a started job; ``False`` if the job was removed meanwhile."""
        entry = self._busy.get(job_id)
        if entry is None:
            return False
        entry[1] = actor
        return True

    def release(self, job_id: str, now: float, *, reuse: bool) -> Any:
        """The job ended: its actor turns idle (``reuse``), else it is returned to be killed."""
        entry = self._busy.pop(job_id, None)
        if entry is None:
            return None
        key, actor = entry
        if reuse and actor is not None:
            self._idle.setdefault(key, []).append((actor, now))
            return None
        return actor

    def remove(self, job_id: str) -> Any:
        """Cancelled or timed out: dropped from the queue, or its actor returned to be killed."""
        for index, (queued, _) in enumerate(self._queue):
            if queued == job_id:
                del self._queue[index]
                return None
        return self.release(job_id, 0.0, reuse=False)

    def expire(self, now: float) -> list[Any]:
        """Idle actors past ``idle_s``, removed."""
        return expire_idle(self._idle, now, self.idle_s)

    def clear(self) -> list[Any]:
        """Every actor (idle and busy), removed; the queue is dropped."""
        actors = [actor for idle in self._idle.values() for actor, _ in idle]
        actors += [entry[1] for entry in self._busy.values() if entry[1] is not None]
        self._queue.clear()
        self._busy.clear()
        self._idle.clear()
        return actors

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def _pop_least_recent(self) -> Any:
        key = min(self._idle, key=lambda k: self._idle[k][0][1])
        actor, _ = self._idle[key].pop(0)
        if not self._idle[key]:
            del self._idle[key]
        return actor


def expire_idle(idle: dict[K, list[tuple[Any, float]]], now: float, idle_s: float) -> list[Any]:
    """The actors in ``idle`` (key → (actor, idle since)) idle for ``idle_s`` or longer, removed."""
    retire = []
    for key in list(idle):
        retire += [actor for actor, since in idle[key] if now - since >= idle_s]
        idle[key] = [(actor, since) for actor, since in idle[key] if now - since < idle_s]
        if not idle[key]:
            del idle[key]
    return retire
