"""Private files in a lancefn home, and whether a home may be trusted at all.

The home holds the admin API key and says which pid is the server, so a home that another
user can write into, or a file planted there, must not be trusted.  Private files are
created 0600 from the start with ``O_NOFOLLOW`` (a planted symlink is never followed), and
temp files with ``O_EXCL`` under an unguessable name.  Files are replaced atomically (temp file,
rename), which the data plane's result files share.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "fsync_path",
    "home_problem",
    "open_private",
    "private_file_problem",
    "replace_atomically",
    "write_private",
]


def home_problem(home: Path) -> str | None:
    """Why ``home`` is unsafe to use (with the fix), or None."""
    st = os.stat(home)
    if st.st_uid != os.getuid():
        return (
            f"home directory {home} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
            "use a home of your own (--home or LANCEFN_HOME)"
        )
    if st.st_mode & 0o022:
        return (
            f"home directory {home} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), so anyone could "
            f"plant an API key or server.json there; fix it with: chmod 700 {home}"
        )
    return None


def private_file_problem(path: Path) -> str | None:
    """Why the existing private file ``path`` cannot be trusted, or None (also None if absent)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file (a symlink?); remove it"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by you; remove it (a new one is created)"
    if st.st_mode & 0o077:
        return (
            f"{path} is readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"if you trust its content fix it with: chmod 600 {path}, else remove it (a new one is created)"
        )
    return None


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of a private file: 0600 from creation, never through a symlink."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode otherwise
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: Path, text: str) -> None:
    """Write ``text`` atomically with mode 0600 (never briefly world-readable, no symlink followed)."""
    tmp = path.with_name(f".{path.name}.{os.urandom(8).hex()}.tmp")  # unguessable, as secrets.token_hex
    fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)

    def write() -> None:
        try:
            data = text.encode("utf-8")
            if os.write(fd, data) != len(data):
                raise OSError(f"short write to {tmp}")
            os.fsync(fd)
        finally:
            os.close(fd)

    replace_atomically(tmp, path, write)


def replace_atomically(tmp: str | Path, path: str | Path, write: Callable[[], None]) -> None:
    """``write()`` fills ``tmp``, which then replaces ``path`` in one rename, so a reader or a
    restart sees the old file or the whole new one; on any failure ``tmp`` is removed."""
    try:
        write()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory (after a rename in it) by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether the process a home's file names (a server's, a build's) still runs: ours once exited is reaped
    first (a zombie still answers ``kill(pid, 0)``); one of another user counts as alive."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
