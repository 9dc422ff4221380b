"""Sealing a built environment before its first use (docs/ARCHITECTURE.md, "Environments").

A build run as another user leaves a tree that user owns, and a process its build code left behind may still be
changing it. The server takes the tree over without ever following a link its builder planted: each directory is
made the server's and read-only (0555) *before* its entries are listed, so from then on nobody but the server adds,
removes or swaps an entry in it; each entry is then handled by name through that directory (``*at`` calls, links
never followed). The builder's files become the server's, readable by all and writable by none; files of the
server's own user lose group and world write (uv's ``<env>/.lock`` is 0666). Anything else (another uid's file, a
FIFO, a socket, a device, a hard link to a file of the server's) fails the build.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["SealError", "seal"]

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a device", stat.S_IFBLK: "a device"}
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class SealError(Exception):
    """The tree holds something an environment must not; the message names it (relative to the tree)."""


def seal(top: Path, builder_uid: int | None) -> None:
    """Make the tree ``top`` (a directory this process created) the server's user's and read-only: directories
    0555, files not writable by others. ``builder_uid``: the other user the build ran as (its entries change
    owner), None for a build as the server's own user. Raises :class:`SealError`."""
    me, group = os.geteuid(), os.getegid()
    owners = {me} if builder_uid is None else {me, builder_uid}
    pending = [""]  # directories (relative to top) whose parent is sealed: their names can no longer change
    while pending:
        relative = pending.pop()
        fd = os.open(top / relative if relative else top, _OPEN_DIR)
        try:
            _seal_directory(fd, relative or ".", me, group, owners)
            for name in os.listdir(fd):
                where = f"{relative}/{name}" if relative else name
                if _seal_entry(fd, name, where, me, group, owners, switched=builder_uid is not None):
                    pending.append(where)
        finally:
            os.close(fd)


def _seal_directory(fd: int, where: str, me: int, group: int, owners: set[int]) -> None:
    found = os.fstat(fd)
    _check_owner(found, where, owners)
    if found.st_uid != me:
        os.fchown(fd, me, group)
    os.fchmod(fd, 0o555)


def _seal_entry(fd: int, name: str, where: str, me: int, group: int, owners: set[int], *, switched: bool) -> bool:
    """Seal the entry ``name`` of the sealed directory ``fd``; True when it is a directory (to seal next)."""
    found = os.stat(name, dir_fd=fd, follow_symlinks=False)
    _check_owner(found, where, owners)
    kind = stat.S_IFMT(found.st_mode)
    if kind == stat.S_IFDIR:
        return True
    if kind == stat.S_IFLNK:
        if found.st_uid != me:
            os.chown(name, me, group, dir_fd=fd, follow_symlinks=False)
        return False
    if kind != stat.S_IFREG:
        raise SealError(f"the build left {_KINDS.get(kind, 'a special file')} at {where}")
    mode = stat.S_IMODE(found.st_mode)
    if found.st_uid != me:  # the builder's file: the server's now, readable by the workers, writable by no one else
        os.chown(name, me, group, dir_fd=fd, follow_symlinks=False)
        os.chmod(name, (mode & 0o755) | 0o444, dir_fd=fd)
    elif switched and found.st_nlink > 1:  # the builder linked a file of the server's user in: never touch it
        raise SealError(f"{where} is a hard link to a file of the server's user")
    elif mode & 0o022:
        os.chmod(name, mode & ~0o022, dir_fd=fd)
    return False


def _check_owner(found: os.stat_result, where: str, owners: set[int]) -> None:
    if found.st_uid not in owners:
        raise SealError(f"{where} belongs to uid {found.st_uid}, neither the server's user nor the build's")
