"""A worker uid per namespace (``--worker-uids A-B``): a root server runs each namespace's workers as a uid of
its own, so one team's job cannot signal (SIGKILL, SIGSTOP), trace or read another team's workers, their private
directories or what they write (docs/ARCHITECTURE.md, "Isolation").

The uids need no passwd entry (gid = the same number, no supplementary groups). A namespace gets the lowest free
uid of the range on its first job; the choice is recorded in the state database (table ``worker_uids``), so a
namespace keeps its uid across restarts and a uid never passes to another namespace.
"""

from __future__ import annotations

import grp
import pwd
import re
import threading
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from lancefn_jupyter.server.executors.isolation import WorkerUser, WorkerUserError
from lancefn_jupyter.worker.process import WorkerStartError


class Store(Protocol):
    """What this module needs of the state database (``server/storage/store.Store``, which executors don't import:
    the CLI hands it over)."""

    def executescript(self, script: str) -> None: ...
    def execute(self, sql: str, args: tuple = ()) -> None: ...
    def query(self, sql: str, args: tuple = ()) -> list[tuple]: ...
    def batch(self) -> AbstractContextManager[None]: ...


__all__ = [
    "DEFAULT_UID_BLOCKS",
    "DEFAULT_WORKER_MAX_PROCS",
    "UidRange",
    "UidsExhausted",
    "WorkerUids",
    "default_worker_uids",
    "parse_uid_range",
    "passwd_overlap",
    "pick_uid",
    "resolve_worker_uids",
]

# RLIMIT_NPROC of a namespace's workers (docs/ARCHITECTURE.md, "Isolation"): Linux counts every thread of the
# uid, so it must leave room for the math libraries' pools of a few workers; a fork bomb stops there.
DEFAULT_WORKER_MAX_PROCS = 512
_FLAG = "--worker-uids"
_HOW = f"write {_FLAG} as FIRST-LAST, two uids with FIRST <= LAST, e.g. {_FLAG} 61000-61999"
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")
_MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to setuid


class UidsExhausted(WorkerStartError):
    """No uid of the range is left for a new namespace: its job fails in phase ``worker``."""


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


# The default ranges, tried in order (docs/ARCHITECTURE.md, "Isolation"): 256 uids each (one per namespace, for
# the server's life), in 60578-61183, which systemd leaves to no one: above its regular and homed users
# (1000-60513) and its container bind users (60514-60577), below its dynamic service users (61184-65519), whose
# uids have no passwd entry until a service starts, and under 65534, so a container's 16-bit uid map holds them.
DEFAULT_UID_BLOCKS = (UidRange(60600, 60855), UidRange(60856, 61111))


def parse_uid_range(text: str) -> UidRange:
    """``"A-B"`` → ``UidRange(A, B)``; raises ``WorkerUserError`` saying how to write it. Uid 0 is refused: the
    workers would be root."""
    match = _RANGE.fullmatch(text or "")
    if match is None:
        raise WorkerUserError(f"{_FLAG} {text!r} is not a range of uids; {_HOW}")
    first, last = int(match.group(1)), int(match.group(2))
    if first > last:
        raise WorkerUserError(f"{_FLAG} {text!r}: {first} is above {last}; {_HOW}")
    if first == 0:
        raise WorkerUserError(f"{_FLAG} {text!r} includes uid 0 (root); {_HOW}")
    if last > _MAX_UID:
        raise WorkerUserError(f"{_FLAG} {text!r}: uids go up to {_MAX_UID}; {_HOW}")
    return UidRange(first, last)


def passwd_overlap(uids: UidRange, entries: Iterable[tuple[str, int]]) -> list[str]:
    """The ``"name (uid)"`` of the users in ``entries`` whose uid lies in the range: a real user's processes and
    files would be a namespace's to signal and read."""
    return [f"{name} ({uid})" for name, uid in entries if uid in uids]


def pick_uid(uids: UidRange, taken: Collection[int]) -> int | None:
    """The lowest uid of the range no namespace holds, or None when every one is taken."""
    held = {uid for uid in taken if uid in uids}
    if len(held) >= uids.size:
        return None
    return next(uid for uid in range(uids.first, uids.last + 1) if uid not in held)


def default_worker_uids(taken: Iterable[tuple[str, int]]) -> UidRange:
    """The first of ``DEFAULT_UID_BLOCKS`` that holds no id of ``taken`` (``"name", id``: the passwd users and the
    groups, since a worker's gid is its uid); raises ``WorkerUserError`` naming ``--worker-uids`` when each does."""
    taken = list(taken)
    for block in DEFAULT_UID_BLOCKS:
        if not passwd_overlap(block, taken):
            return block
    named = [entry for block in DEFAULT_UID_BLOCKS for entry in passwd_overlap(block, taken)]
    blocks = " and ".join(str(block) for block in DEFAULT_UID_BLOCKS)
    raise WorkerUserError(
        f"this root server's keys name several namespaces, so each runs its workers as a uid of its own, but the "
        f"default ranges {blocks} hold users or groups ({_shown(named)}); pass {_FLAG} FIRST-LAST naming a range no "
        "user or group has, or --worker-user USER to run every namespace as one user (one team's job could then "
        "signal another's)"
    )


def _shown(named: list[str]) -> str:
    return ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")


def resolve_worker_uids(
    value: str | None,
    *,
    worker_user: str | None,
    executor: str,
    euid: int,
    passwd: Iterable[tuple[str, int]] = (),
    groups: Iterable[tuple[str, int]] = (),
    shared: bool = False,
) -> UidRange | None:
    """``--worker-uids`` checked against the rest of the start-up (pure: ``euid``, ``passwd`` and ``groups`` are
    passed in); None when not given, unless the server is ``shared`` (its keys name several namespaces) and runs as
    root with the local executor and no ``--worker-user``: then a default range (:func:`default_worker_uids`).
    Raises ``WorkerUserError`` with what to change."""
    if not value:
        default = shared and euid == 0 and executor == "local" and not worker_user
        return default_worker_uids([*passwd, *groups]) if default else None
    uids = parse_uid_range(value)
    if executor != "local":
        raise WorkerUserError(
            f"{_FLAG} applies to the local executor only (a Ray executor's workers are Ray's processes); "
            f"drop {_FLAG} or use --executor local"
        )
    if worker_user:
        raise WorkerUserError(
            f"--worker-user {worker_user!r} and {_FLAG} {value} both say whom workers run as; give one "
            "(unset LANCEFN_WORKER_USER if it comes from there)"
        )
    if euid != 0:
        raise WorkerUserError(
            f"{_FLAG} needs the server to run as root (it runs as uid {euid}); drop the flag to run workers as yourself"
        )
    named = passwd_overlap(uids, passwd)
    if named:
        raise WorkerUserError(
            f"{_FLAG} {uids} includes uids /etc/passwd names: {_shown(named)}; pick a range no user has "
            "(e.g. above the largest uid in /etc/passwd)"
        )
    return uids


def system_passwd() -> list[tuple[str, int]]:
    return [(entry.pw_name, entry.pw_uid) for entry in pwd.getpwall()]


def system_groups() -> list[tuple[str, int]]:
    """The groups as ``("group NAME", gid)``: a default range must hold none, since a worker's gid is its uid."""
    return [(f"group {entry.gr_name}", entry.gr_gid) for entry in grp.getgrall()]


def uid_user(uid: int) -> WorkerUser:
    """The worker user of a namespace's uid: gid = the same number; no home (HOME is its private work dir)."""
    return WorkerUser(f"uid {uid}", uid, uid, "/")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_uids(
    namespace TEXT PRIMARY KEY,
    uid INTEGER NOT NULL UNIQUE
);
"""


class WorkerUids:
    """Namespace → uid of ``uids``, recorded in the state database once :meth:`attach` gave it one (the CLI
    builds the executor before it opens the store); without a store, kept in memory only (tests, embedding)."""

    def __init__(self, uids: UidRange) -> None:
        self.range = uids
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._known: dict[str, int] = {}

    def attach(self, store: Store) -> None:
        store.executescript(_SCHEMA)
        with self._lock:
            self._store = store
            self._known = self._recorded()

    def _recorded(self) -> dict[str, int]:
        if self._store is None:
            return dict(self._known)
        return {namespace: int(uid) for namespace, uid in self._store.query("SELECT namespace, uid FROM worker_uids")}

    def known(self, namespace: str) -> int | None:
        """The namespace's uid if it has one already (never allocates)."""
        with self._lock:
            uid = self._known.get(namespace)
            return uid if uid in self.range else None

    def uid_for(self, namespace: str) -> int:
        """The namespace's uid, allocated (and recorded) on its first call; raises ``UidsExhausted``."""
        with self._lock:
            uid = self._known.get(namespace)
            if uid in self.range:
                return uid  # type: ignore[return-value]  # `in` checked it is an int
            uid = self._allocate(namespace)
            self._known[namespace] = uid
            return uid

    def _allocate(self, namespace: str) -> int:
        if self._store is None:
            return self._choose(namespace, self._known)
        with self._store.batch():  # read, choose and record in one transaction
            known = self._recorded()
            uid = self._choose(namespace, known)
            # A uid recorded outside the range (the range changed across a restart) is replaced.
            self._store.execute(
                "INSERT INTO worker_uids(namespace, uid) VALUES(?, ?) ON CONFLICT(namespace) DO UPDATE SET uid = ?",
                (namespace, uid, uid),
            )
        return uid

    def _choose(self, namespace: str, known: Mapping[str, int]) -> int:
        uid = pick_uid(self.range, [held for other, held in known.items() if other != namespace])
        if uid is None:
            raise UidsExhausted(
                f"no worker uid is left for namespace {namespace!r}: all {self.range.size} uids of "
                f"{_FLAG} {self.range} belong to other namespaces; restart the server with a wider {_FLAG} range"
            )
        return uid
