"""What a GPU class's queue asks of an autoscaler: the jobs waiting and running, packed into node-shaped bundles,
bounded by the class's maximum nodes and what each namespace may hold (docs/ray.md, "Scaling with the queue").

Pure: the Ray driver gathers the jobs and publishes the bundles (``executors/ray/bridge.py``).  A job asks its GPUs,
and the CPUs and memory its version declares (``cpu=`` / ``memory=``); a bundle carries their sums, and the class's
node shape (``node_cpu`` / ``node_memory``) bounds them where the operator says it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Ask:
    """One job's ask (or a bundle's sum of them): GPUs, and CPUs and memory bytes where a version says them."""

    gpus: int
    cpus: float = 0.0
    memory: int = 0

    def __add__(self, other: Ask) -> Ask:
        return Ask(self.gpus + other.gpus, self.cpus + other.cpus, self.memory + other.memory)

    def fits(self, shape: Ask) -> bool:
        """Whether this fits a node of ``shape`` (a shape's 0 CPUs or memory: not bounded by it)."""
        return (
            self.gpus <= shape.gpus
            and (not shape.cpus or self.cpus <= shape.cpus)
            and (not shape.memory or self.memory <= shape.memory)
        )


@dataclass(frozen=True)
class NodeScaling:
    """A class whose nodes an autoscaler adds and removes (``[[gpu_classes]]`` ``max_nodes`` and friends)."""

    node: Ask  # one node of the class (its worker group's pod)
    max_nodes: int
    min_nodes: int = 0
    node_type: str = ""  # the autoscaler's node type (KubeRay worker group) of the class


@dataclass(frozen=True)
class Job:
    """A job of the class as the demand sees it: its ask and its namespace."""

    ask: Ask
    namespace: str = ""


@dataclass(frozen=True)
class Demand:
    """The class's bundles (at most one per node, each fitting the node shape), and the queued jobs left out of them
    (``never_fits``: larger than a node; ``over_allowance``: their namespace's cap or budget; ``over_max``: beyond the
    class's maximum nodes)."""

    bundles: tuple[Ask, ...] = ()
    never_fits: int = 0
    over_allowance: int = 0
    over_max: int = 0

    @property
    def nodes(self) -> int:
        return len(self.bundles)


def shape_demand(
    running: Iterable[Job],
    queued: Iterable[Job],
    scaling: NodeScaling,
    allowance: Mapping[str, int] | None = None,
) -> Demand:
    """The bundles the class needs in all: its running jobs (they hold their nodes) and then its queued jobs in
    submission order, first fit into node-shaped bundles, at most ``scaling.max_nodes`` of them.

    ``allowance``: namespace → GPUs it may still hold in this class (its ``max_gpus`` cap less what it holds in
    other classes; a budget lowers it further); a namespace not named is not bounded.  A queued job over its
    namespace's allowance, larger than a node, or finding no room in the class's maximum is left out, and the jobs
    behind it are still considered (a smaller one may fit)."""
    bins: list[Ask] = []
    held: dict[str, int] = {}
    never = over_allowance = over_max = 0

    def place(ask: Ask) -> bool:
        for index, used in enumerate(bins):
            if (used + ask).fits(scaling.node):
                bins[index] = used + ask
                return True
        if len(bins) < scaling.max_nodes:
            bins.append(ask)
            return True
        return False

    for job in running:  # they run somewhere: counted whatever their shape, as far as the maximum allows
        held[job.namespace] = held.get(job.namespace, 0) + job.ask.gpus
        place(job.ask)
    for job in queued:
        if not job.ask.fits(scaling.node):
            never += 1
            continue
        limit = None if allowance is None else allowance.get(job.namespace)
        if limit is not None and held.get(job.namespace, 0) + job.ask.gpus > limit:
            over_allowance += 1
            continue
        if not place(job.ask):
            over_max += 1
            continue
        held[job.namespace] = held.get(job.namespace, 0) + job.ask.gpus
    return Demand(tuple(bins), never, over_allowance, over_max)


def allowances(caps: Mapping[str, int], held_elsewhere: Mapping[str, int]) -> dict[str, int]:
    """Namespace → GPUs it may still hold in one class: its cap less what it holds in the other classes."""
    return {namespace: max(0, cap - held_elsewhere.get(namespace, 0)) for namespace, cap in caps.items()}


@dataclass
class StartClock:
    """How long the class's nodes took to start recently: each node asked for beyond those up is timed from when it
    was asked until a node of the class joins (the oldest ask first); an ask withdrawn before any node joined (the
    queue drained) is dropped, the newest first."""

    keep: int = 5  # the durations kept (the recent ones)
    _asked: deque[float] = field(default_factory=deque)  # when each outstanding node was asked for
    _took: deque[float] = field(default_factory=deque)
    _up: int = 0

    def update(self, now: float, wanted: int, up: int) -> None:
        """``wanted`` nodes asked for in all, ``up`` nodes of the class up, at ``now``."""
        for _ in range(max(0, up - self._up)):  # nodes that joined answer the oldest asks
            if self._asked:
                self._took.append(now - self._asked.popleft())
                while len(self._took) > self.keep:
                    self._took.popleft()
        self._up = up
        missing = max(0, wanted - up)
        while len(self._asked) < missing:
            self._asked.append(now)
        while len(self._asked) > missing:
            self._asked.pop()

    def next_up(self, now: float) -> float | None:
        """When the next node asked for should join (its ask + the recent start time, never before ``now``); None
        when none is asked for or no start has been timed yet."""
        recent = self.recent_s()
        if not self._asked or recent is None:
            return None
        return max(now, self._asked[0] + recent)

    def recent_s(self) -> float | None:
        """The median of the recent start durations, or None before any node has started."""
        if not self._took:
            return None
        ordered = sorted(self._took)
        return ordered[len(ordered) // 2]


def scaling_reason(starting: int, recent_s: float | None) -> str | None:
    """A pending job's reason while its class scales up: "scaling up: 2 nodes starting, ~40 s recently" (``starting``:
    nodes asked of the autoscaler and not up yet); None when none is starting."""
    if starting <= 0:
        return None
    recently = f", ~{recent_s:.0f} s recently" if recent_s is not None else ""
    return f"scaling up: {starting} node{'' if starting == 1 else 's'} starting{recently}"
