"""Which OS user local workers run as (``--worker-user``), and the start-time check that it can.

A server running as root runs its workers as an unprivileged user (default ``nobody``; a uid per namespace when its
keys name several, ``uids.py``), so a job cannot open the home's ``api_key``, ``server.json``, ``server.lock`` or
database (the home is 0700, owned by the server's user) nor read the server's memory or environment.  A server that
is not root runs workers as itself: a same-user server is yours alone (docs/ARCHITECTURE.md, "Isolation").
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_WORKER_USER",
    "PASSED_ENV",
    "PASSED_ENV_PREFIXES",
    "WorkDirs",
    "WorkerUser",
    "WorkerUserError",
    "check_env_cache",
    "check_worker_user",
    "resolve_worker_user",
    "worker_environment",
]

DEFAULT_WORKER_USER = "nobody"


# What a worker run as another user gets of the server's environment (docs/ARCHITECTURE.md, "Isolation"): what
# Python, the GPU and math libraries and the locale need; nothing else (no tokens, no other teams' settings).
PASSED_ENV = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR"}
)
PASSED_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NUMBA_", "OMP_", "MKL_", "OPENBLAS_")


def worker_environment(server_env: Mapping[str, str], *, switched: bool) -> dict[str, str]:
    """The environment a worker starts with: ``PYTHONSAFEPATH=1`` always (no cwd or script directory on its
    ``sys.path``), and, for a worker run as another user (``switched``), only ``PASSED_ENV`` and
    ``PASSED_ENV_PREFIXES`` of ``server_env``; a same-user worker keeps the rest (the server is yours alone)."""
    env = {
        name: value
        for name, value in server_env.items()
        if not switched or name in PASSED_ENV or name.startswith(PASSED_ENV_PREFIXES)
    }
    env["PYTHONSAFEPATH"] = "1"
    return env


WORK_ROOT_RECORD = "worker-dirs"  # in the home: the workers' root of the server that last ran there


class WorkDirs:
    """Private working directories of workers: ``<root>/<random>``, owned by the worker's uid, mode 0700, under a
    root only the server's user can list (0711) — never the server's cwd, which another user may write.

    ``home``: the root's path is recorded there, so that the next server on the home (holding its lock) removes
    the root a killed server left behind, with whatever its workers wrote."""

    def __init__(self, home: str | Path | None = None) -> None:
        record = Path(home) / WORK_ROOT_RECORD if home is not None else None
        if record is not None:
            _remove_left_root(record)
        self.root = tempfile.mkdtemp(prefix="lancefn-workers-")
        os.chmod(self.root, 0o711)
        if record is not None:
            fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(self.root + "\n")

    def new(self, user: WorkerUser | None) -> str:
        path = tempfile.mkdtemp(dir=self.root)  # 0700
        if user is not None:
            os.chown(path, user.uid, user.gid)
        return path

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _remove_left_root(record: Path) -> None:
    """Remove the workers' root named in ``record`` if it is still there: only a ``lancefn-workers-*`` directory
    of the temp dir that this user owns (the record is in the private home, but check anyway)."""
    try:
        left = Path(record.read_text().strip())
    except (OSError, UnicodeDecodeError):
        return
    try:
        ours = (
            left.parent == Path(tempfile.gettempdir())
            and left.name.startswith("lancefn-workers-")
            and not left.is_symlink()
            and left.stat().st_uid == os.geteuid()
        )
    except OSError:
        return
    if ours:
        shutil.rmtree(left, ignore_errors=True)


class WorkerUserError(Exception):
    """``--worker-user`` cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class WorkerUser:
    name: str
    uid: int
    gid: int
    home: str


def resolve_worker_user(value: str | None) -> WorkerUser | None:
    """The user workers switch to, or None to run them as the server's own user.

    ``value`` empty/None: ``nobody`` when the server runs as root, else no switch."""
    euid = os.geteuid()
    name = value or (DEFAULT_WORKER_USER if euid == 0 else None)
    if name is None:
        return None
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        raise WorkerUserError(
            f"--worker-user {name!r}: no such user; create it (e.g. `useradd --system lancefn-worker`) or name another"
        ) from None
    if entry.pw_uid == euid:
        return None  # naming the server's own user opts out (an embedded server is yours alone)
    if euid != 0:
        raise WorkerUserError(
            f"--worker-user {entry.pw_name!r} needs the server to run as root (it runs as uid {euid}); drop the flag to run workers as yourself"
        )
    return WorkerUser(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def _closed_dirs(paths: list[Path]) -> list[str]:
    """Directories above ``paths`` that others cannot traverse (no o+x): what to open up."""
    closed: dict[str, None] = {}
    for path in paths:
        for parent in reversed(path.parents):
            try:
                if not os.stat(parent).st_mode & stat.S_IXOTH:
                    closed[str(parent)] = None
            except OSError:
                continue
    return list(closed)


def check_worker_user(user: WorkerUser, env: Mapping[str, str]) -> str | None:
    """None if ``user`` can start a worker (this interpreter imports the worker module), else a
    message naming the directories to open (``chmod o+x``) or the flag to change."""
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import lancefn_jupyter.worker.main"],
            env=dict(env),
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        returncode, stderr = probe.returncode, probe.stderr
    except OSError as error:  # the exec itself refused (an interpreter path that user cannot traverse)
        returncode, stderr = -1, f"{type(error).__name__}: {error.strerror or error}"
    if returncode == 0:
        return None
    # The package's own directory, found without importing the package (the server never imports its kernel side).
    spec = importlib.util.find_spec("lancefn_jupyter")
    package = Path(spec.origin if spec and spec.origin else __file__).resolve()
    # The path as started (a symlink's directory may be the closed one) and where it leads.
    closed = _closed_dirs([Path(sys.executable), Path(sys.executable).resolve(), Path(sys.prefix), package])
    detail = (stderr.strip().splitlines() or [f"exit code {returncode}"])[-1]
    fix = (
        f"let it traverse {', '.join(closed)} (e.g. `chmod o+x {' '.join(closed)}`)"
        if closed
        else "make the interpreter, its site-packages and lancefn_jupyter readable for it"
    )
    return (
        f"workers run as user {user.name!r} because the server runs as root, but that user cannot start Python "
        f"{sys.executable} ({detail}); {fix}, or pass --worker-user naming a user who can"
    )


def check_env_cache(user: WorkerUser, root: Path) -> str | None:
    """None if ``user`` can reach the environment cache ``root`` (workers start its environments' Python),
    else a message naming the directories to open (docs/ARCHITECTURE.md, "Environments")."""
    closed = _closed_dirs([root / "env"])
    if not closed:
        return None
    return (
        f"workers run as user {user.name!r}, who cannot reach the environment cache {root}: let it traverse "
        f"{', '.join(closed)} (e.g. `chmod o+x {' '.join(closed)}`), or pass --env-cache naming a directory it can reach"
    )
