"""The check of a table's tree before a team's backfill reads or writes it (docs/ARCHITECTURE.md, "Backfills",
"Which tables"): every entry of the table directory, seen with ``lstat`` (never following a link), must keep the
team's I/O under the namespace's table root.

Refused, naming the entry (relative to the table) and the fix: a symbolic link whose target leaves the root, a
regular file with more than one hard link (Lance never makes one; a ``cp -l`` copy or a link to another team's
file), a mount point or an entry on another file system, and anything but files, directories and links (a FIFO
would stall the read). A link that stays inside the root is followed, and its target checked the same way.

The walk costs about 4 µs an entry (1.2 ms for a 100-fragment table of 300 files); a table's later checks (one
before each chunk's slice read and each fragment commit) cost a ``stat`` per directory instead: a clean walk is
remembered with each directory's inode, mtime and ctime (an entry added, removed or renamed changes its
directory's; ctime cannot be set back), the links' targets (resolved again) and the mount table. This is the
clear refusal; the guarantee is that the table agent does the I/O with the team's rights (``table_agent.py``).
"""

from __future__ import annotations

import collections
import os
import stat
import threading
from dataclasses import dataclass

__all__ = ["MAX_ENTRIES", "TreeCheck", "tree_problem"]

MAX_ENTRIES = 200_000  # a table with more files is refused (compact it): the walk holds a thread meanwhile
_REMEMBERED = 256  # tables whose clean walk is remembered
_MOUNTINFO = "/proc/self/mountinfo"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _mount_points() -> frozenset[str]:
    """Every mount point this process sees (``/proc/self/mountinfo``'s fifth field, octal escapes decoded)."""
    try:
        with open(_MOUNTINFO, "rb") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return frozenset()
    points = set()
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 4:
            points.add(
                fields[4].decode("unicode_escape", "replace").encode("latin-1", "replace").decode(errors="replace")
            )
    return frozenset(points)


@dataclass(frozen=True)
class _Clean:
    """What a clean walk saw: where the table's path led, each directory's (dev, ino, mtime_ns, ctime_ns), each
    link's target, the mount table."""

    real: str
    dirs: dict[str, tuple[int, int, int, int]]
    links: dict[str, str]
    mounts: frozenset[str]


def _signature(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


class _Walk:
    """One walk of a table's tree (``table``: its path as planned, under the real path ``root``)."""

    def __init__(self, table: str, root: str, max_entries: int) -> None:
        self.table, self.root, self.max_entries = table, root, max_entries
        self.real = os.path.realpath(table)
        self.clean = _Clean(self.real, {}, {}, _mount_points())
        self.stack: list[str] = []
        self.dev = 0

    def run(self) -> str | None:
        if not _under(self.real, self.root):
            return (
                f"the table's path {self.table} now leads outside {self.root}, where this namespace's tables live "
                "(a symbolic link on the way); put the table itself there"
            )
        try:
            top = os.lstat(self.real)
        except OSError:
            return None  # no table there: opening it says so
        if not stat.S_ISDIR(top.st_mode):
            return None
        self.dev = top.st_dev
        problem = self.entry(self.real, top)
        count = 0
        while problem is None and self.stack:
            directory = self.stack.pop()
            try:
                entries = list(os.scandir(directory))
            except OSError as error:
                return f"{self.name(directory)} cannot be listed ({error.strerror}); make it the team's own"
            count += len(entries)
            if count > self.max_entries:
                return (
                    f"the table directory holds more than {self.max_entries:,} entries; compact the table "
                    "(LanceDB: table.optimize()) and clean up old versions before backfilling it"
                )
            for item in entries:
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                problem = self.entry(item.path, st)
                if problem is not None:
                    break
        return problem

    def name(self, path: str) -> str:
        if _under(path, self.real):
            return repr(os.path.relpath(path, self.real))
        return f"{path!r} (reached by a symbolic link)"

    def entry(self, path: str, st: os.stat_result) -> str | None:
        """The problem with one entry, seen without following it (a link's target is checked the same way)."""
        if path in self.clean.mounts and path != self.root:
            return f"{self.name(path)} is a mount point; a backfill reads only the table's own files: copy them there"
        if st.st_dev != self.dev:
            return f"{self.name(path)} is on another file system (a mount); copy the files into the table instead"
        if stat.S_ISDIR(st.st_mode):
            if path not in self.clean.dirs:
                self.clean.dirs[path] = _signature(st)
                self.stack.append(path)
        elif stat.S_ISLNK(st.st_mode):
            return self.link(path)
        elif not stat.S_ISREG(st.st_mode):
            return f"{self.name(path)} is not a file, a directory or a symbolic link; remove it from the table"
        elif st.st_nlink > 1:
            return (
                f"{self.name(path)} has {st.st_nlink} hard links (Lance never makes one); a backfill reads only "
                "files that are the table's own: replace it with a copy (cp, not cp -l or ln)"
            )
        return None

    def link(self, path: str) -> str | None:
        target = os.path.realpath(path)
        if not _under(target, self.root):
            return (
                f"{self.name(path)} is a symbolic link that leads outside {self.root}, where this namespace's tables "
                "live; replace it with the directory or file itself"
            )
        self.clean.links[path] = target
        try:
            st = os.lstat(target)
        except OSError:
            return None  # a dangling link: opening the table says what is missing
        return self.entry(target, st)


def _walk(table: str, root: str, max_entries: int) -> tuple[str | None, _Clean | None]:
    """(the problem, None) or (None, what the clean walk saw)."""
    walk = _Walk(table, root, max_entries)
    problem = walk.run()
    return problem, (walk.clean if problem is None else None)


def tree_problem(table: str, root: str, *, max_entries: int = MAX_ENTRIES) -> str | None:
    """Why a team's backfill must not touch the table at ``table`` (a real path under the real path ``root``),
    or None. One full walk (``TreeCheck`` remembers clean ones)."""
    return _walk(table, root, max_entries)[0]


class TreeCheck:
    """``tree_problem`` with the clean walks remembered, so that a table's later checks cost a ``stat`` per
    directory and a ``realpath`` per link (thread-safe; any thread but the event loop)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._clean: collections.OrderedDict[tuple[str, str], _Clean] = collections.OrderedDict()
        self._lock = threading.Lock()

    def problem(self, table: str, root: str) -> str | None:
        key = (table, root)
        with self._lock:
            clean = self._clean.get(key)
        if clean is not None and _unchanged(table, clean):
            return None
        problem, clean = _walk(table, root, self.max_entries)
        with self._lock:
            if clean is None:
                self._clean.pop(key, None)
            else:
                self._clean[key] = clean
                self._clean.move_to_end(key)
                while len(self._clean) > _REMEMBERED:
                    self._clean.popitem(last=False)
        return problem


def _unchanged(table: str, clean: _Clean) -> bool:
    """Whether nothing a clean walk of ``table`` saw has changed: its path leads where it led, no entry was added,
    removed or renamed in any directory (their mtime and ctime), every link leads where it led, same mounts."""
    if os.path.realpath(table) != clean.real:
        return False
    for path, signature in clean.dirs.items():
        try:
            if _signature(os.lstat(path)) != signature:
                return False
        except OSError:
            return False
    if any(os.path.realpath(path) != target for path, target in clean.links.items()):
        return False
    return _mount_points() == clean.mounts
