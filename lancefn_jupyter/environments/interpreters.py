"""The Python interpreters this machine has, found without downloading any (docs/ARCHITECTURE.md, "Environments").

Candidates: the base, ``python3.Y`` on ``PATH``, pyenv's version directories (not its shims: a shim fails for a
version that is not active), and the Pythons uv has installed (its directory). Each is run once to learn its real
version; the answers are kept for the life of the process.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import threading
from collections.abc import Mapping

__all__ = ["available", "find", "version_of"]

_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"
_PROBE_TIMEOUT_S = 5.0
_lock = threading.Lock()
_NAME = re.compile(r"python3\.\d+")  # not python3.11-config, nor python3.13t (free-threaded: another ABI)
_versions: dict[str, str | None] = {}  # interpreter path -> "3.12" (None: it does not run)


def version_of(python: str) -> str | None:
    """``python``'s "X.Y" (None when it does not run), asked once per process."""
    with _lock:
        if python in _versions:
            return _versions[python]
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            cwd="/",  # a Python before 3.11 ignores PYTHONSAFEPATH: nothing planted in our cwd runs (ARCHITECTURE "Isolation")
        )
        version = done.stdout.strip() if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        version = None
    with _lock:
        _versions[python] = version
    return version


def _candidates(base: str, env: Mapping[str, str]) -> list[str]:
    """Interpreter paths worth probing, best first."""
    found = [base]
    path = env.get("PATH", os.defpath)
    home = env.get("HOME") or os.path.expanduser("~")
    pyenv_root = env.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    shims = os.path.join(pyenv_root, "shims")
    for directory in path.split(os.pathsep):
        if directory and os.path.abspath(directory) != shims:
            found += sorted(glob.glob(os.path.join(directory, "python3.[0-9]*")))
    found += sorted(glob.glob(os.path.join(pyenv_root, "versions", "*", "bin", "python3.[0-9]*")))
    # uv's managed Pythons (`uv python install`), read from its directory: `uv python list` probes every shim
    data_home = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    uv_dir = env.get("UV_PYTHON_INSTALL_DIR") or os.path.join(data_home, "uv", "python")
    found += sorted(glob.glob(os.path.join(uv_dir, "cpython-*", "bin", "python3.[0-9]*")))
    return [p for p in found if _NAME.fullmatch(os.path.basename(p)) or p == base]


def _survey(base: str, env: Mapping[str, str]) -> dict[str, str]:
    """Each version found, with the first interpreter found for it."""
    seen: set[str] = set()
    by_version: dict[str, str] = {}
    for candidate in _candidates(base, env):
        real = os.path.realpath(candidate)
        if real in seen and candidate != base:
            continue  # one binary reached through several links (PATH, pyenv): probed once
        seen.add(real)
        version = version_of(candidate)
        if version and version not in by_version:
            by_version[version] = candidate
    return by_version


_surveys: dict[tuple[str, ...], dict[str, str]] = {}


def _cached_survey(base: str, env: Mapping[str, str]) -> dict[str, str]:
    names = ("PATH", "HOME", "PYENV_ROOT", "XDG_DATA_HOME", "UV_PYTHON_INSTALL_DIR")
    marker = (base, *(env.get(name, "") for name in names))
    with _lock:
        if marker in _surveys:
            return _surveys[marker]
    survey = _survey(base, env)
    with _lock:
        return _surveys.setdefault(marker, survey)


def find(version: str, *, base: str, env: Mapping[str, str] | None = None) -> str | None:
    """An interpreter for Python ``version`` ("3.12"), the base's own when it is that version; None if none."""
    env = os.environ if env is None else env
    if version_of(base) == version:
        return base
    return _cached_survey(base, env).get(version)


def available(*, base: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every Python version found, oldest first: "X.Y" -> interpreter path (for messages)."""
    env = os.environ if env is None else env
    survey = _cached_survey(base, env)
    return dict(sorted(survey.items(), key=lambda item: tuple(int(p) for p in item[0].split("."))))
