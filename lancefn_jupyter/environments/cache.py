"""The environment cache: one virtual environment per (environment, Python, platform, base), built once with uv,
shared read-only, evicted least recently used (docs/ARCHITECTURE.md, "Environments").

CONTRACT STUB (issue 25): signatures and behaviour are fixed here; the implementation lands with the environments
branch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lancefn_jupyter.environments.request import EnvironmentRequest

__all__ = ["DEFAULT_MAX_BYTES", "Environment", "EnvironmentCache", "EnvironmentFailure", "default_cache_dir"]

DEFAULT_MAX_BYTES = 20 * 2**30  # --env-cache-max-bytes: a few CUDA stacks (torch alone is ~5 GB)


class EnvironmentFailure(Exception):
    """The environment cannot be had; ``str(self)`` is the job's phase-``environment`` message.

    ``refused``: this machine cannot honour the request (no such Python, an image, conda packages it lacks) — trying
    again will not help. Else the build failed (uv's own error lines in the message and in ``lines``); the next
    job of that environment builds again."""

    def __init__(self, message: str, *, refused: bool = False, lines: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.refused = refused
        self.lines = tuple(lines)


@dataclass(frozen=True)
class Environment:
    """A built environment: workers of its versions start ``python`` (``-m lancefn_jupyter.worker.main``)."""

    key: str
    path: Path
    python: str
    lock_path: Path  # hold LOCK_SH on it while using the environment (see EnvironmentCache.lease)
    installed: tuple[str, ...]  # "name==version" installed over the base
    size_bytes: int


def default_cache_dir(shared: bool) -> Path:
    """``$LANCEFN_ENV_CACHE``, else ``/var/cache/lancefn/envs`` when ``shared`` (workers run as another user, who
    must read it: a root server), else the user's cache (``~/.cache/lancefn/envs``)."""
    raise NotImplementedError


class EnvironmentCache:
    def __init__(
        self,
        root: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        base_python: str = sys.executable,
        shared: bool = False,
        uv: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``root``: the cache directory (created 0755 when ``shared``, else 0700). ``base_python``: the interpreter
        whose packages an environment layers over (the control plane's or the kernel's own). ``uv``: the uv
        binary (default: PyPI uv's). ``env``: the environment whose ``PIP_*`` variables and pip.conf files apply
        to builds (default ``os.environ``)."""
        raise NotImplementedError

    def problem(self, request: EnvironmentRequest) -> str | None:
        """Why this machine cannot honour ``request`` (``image``; conda packages not importable; ``python_version``
        not found, naming the versions it has), or None. No build, no network; interpreter discovery cached."""
        raise NotImplementedError

    def needs_build(self, request: EnvironmentRequest) -> bool:
        """True when workers need an environment of their own: declared pip packages the base does not satisfy, or
        a Python other than the base's. False: workers run on the base interpreter as they are."""
        raise NotImplementedError

    def key(self, request: EnvironmentRequest) -> str:
        """The cache key: sha256 hex of the packages, the Python (version, path), the platform, the base's
        packages and the pip settings that choose where packages come from."""
        raise NotImplementedError

    def lookup(self, request: EnvironmentRequest) -> Environment | None:
        """The built environment if the cache has it (its last use refreshed), else None. No build."""
        raise NotImplementedError

    def ensure(self, request: EnvironmentRequest, log: Callable[[list[str]], None] | None = None) -> Environment | None:
        """The environment, built now if needed (blocking; once across threads and processes: the others wait and
        share it); None when ``needs_build`` is False. ``log`` gets uv's output lines as they come. Raises
        :class:`EnvironmentFailure` (refused, or the build failed). Evicts beyond ``max_bytes`` after a build."""
        raise NotImplementedError

    def plan(self, request: EnvironmentRequest) -> tuple[str, ...]:
        """The pinned requirements to install over the base (``uv pip compile`` preferring the base's versions;
        only what the base lacks or has at another version). For executors that build elsewhere (Ray's ``uv``)."""
        raise NotImplementedError

    def lease(self, env: Environment) -> int | None:
        """An open file descriptor holding a shared lock on ``env`` (eviction skips it while any is open, in any
        process: hand it to the worker with ``pass_fds`` and close yours); None when ``env`` was evicted meanwhile
        (build it again)."""
        raise NotImplementedError

    def evict(self) -> list[str]:
        """Remove least-recently-used environments nobody holds a lease on until the cache fits ``max_bytes``;
        the keys removed."""
        raise NotImplementedError

    def uv_args(self) -> list[str]:
        """The uv flags the pip configuration maps to (index URLs, find-links, constraints, …)."""
        raise NotImplementedError
