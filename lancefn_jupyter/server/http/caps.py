"""Per-client caps on what a connection holds open (docs/ARCHITECTURE.md, "REST details", the limits): connections
waiting for a request head (new ones, and kept-alive ones between requests) per peer, requests in progress per key,
and request bodies being received and event streams per key and per peer.  Pure bookkeeping, called on the event loop.

A *peer* is who is at the other end of a connection, as ``peers.peer_of`` names it: its address, and for a client on
this machine the user that owns its socket too, so one local user's (or one job's) flood is not every local client's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ClientCaps", "Holds", "Waiting"]

T = TypeVar("T")


@dataclass(frozen=True)
class ClientCaps:
    """The caps, one ``lancefn-server`` flag each (``--max-idle-per-peer`` ...)."""

    idle_per_peer: int = 32  # kept-alive connections between requests; a new one past it closes the peer's oldest
    bodies_per_key: int = 32  # request bodies being received at once (and large registrations waiting for their check)
    bodies_per_peer: int = 64
    streams_per_key: int = 32  # event streams (GET /v1/jobs/events) open at once
    streams_per_peer: int = 64
    requests_per_key: int = 128  # requests in progress at once (half the default --limit-concurrency)


class Waiting(Generic[T]):
    """Connections waiting for a request head, per peer, oldest first: a peer holds at most ``per_peer``, and its
    new one past that pushes out its own oldest (never another peer's, and never a request in progress)."""

    def __init__(self, per_peer: int) -> None:
        self.per_peer = per_peer
        self._peers: dict[str, OrderedDict[T, None]] = {}

    def add(self, conn: T, peer: str) -> T | None:
        """Count ``conn`` as ``peer``'s newest; the connection it pushes out (to close), if any."""
        mine = self._peers.setdefault(peer, OrderedDict())
        mine[conn] = None
        if len(mine) <= self.per_peer:
            return None
        oldest = next(iter(mine))
        del mine[oldest]
        return oldest

    def discard(self, conn: T, peer: str) -> None:
        mine = self._peers.get(peer)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._peers[peer]


class Holds:
    """How many of one kind of request (``what``: "request bodies being received", "event streams") each key and
    each peer has open, each under its cap (``per_peer`` None: none per peer); a refusal's message names the cap and
    its flag."""

    def __init__(
        self, what: str, per_key: int, key_flag: str, per_peer: int | None = None, peer_flag: str = ""
    ) -> None:
        self.what = what
        self.per_key, self.key_flag, self.per_peer, self.peer_flag = per_key, key_flag, per_peer, peer_flag
        self._keys: dict[Hashable, int] = {}
        self._peers: dict[str, int] = {}

    def take(self, key: Hashable | None, peer: str) -> str | None:
        """Count one more for ``key`` (None: no key, the peer's cap alone) and ``peer``; past a cap, nothing is
        counted and the refusal's message comes back."""
        keys, peers = self._keys, self._peers
        held = keys.get(key, 0) if key is not None else 0
        if held >= self.per_key:
            return self._refusal("this API key", self.per_key, self.key_flag)
        per_peer = self.per_peer
        if per_peer is not None:
            by_peer = peers.get(peer, 0)
            if by_peer >= per_peer:
                return self._refusal(f"this client ({peer})", per_peer, self.peer_flag)
            peers[peer] = by_peer + 1
        if key is not None:
            keys[key] = held + 1
        return None

    def give(self, key: Hashable | None, peer: str) -> None:
        """Undo one :meth:`take` that succeeded."""
        if key is not None:
            _decrement(self._keys, key)
        if self.per_peer is not None:
            _decrement(self._peers, peer)

    def _refusal(self, who: str, cap: int, flag: str) -> str:
        return (
            f"{who} already has {cap} {self.what} open, the server's limit ({flag}); finish or close some of them "
            f"first, or start lancefn-server with a larger {flag}"
        )


def _decrement(counts: dict, key: Hashable) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
