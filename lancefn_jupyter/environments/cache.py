"""The environment cache: one virtual environment per (environment, Python, platform, base, builder), built once
with uv, shared read-only, evicted least recently used (docs/ARCHITECTURE.md, "Environments").

Layout under the root: ``<key>/`` (a built environment, read-only, with ``meta.json``) and
``.build-<key>-<pid>-<n>/`` (one being built) for builds as the cache's own user; ``uid-<uid>/`` (0750, the
server's user and the builder's group) holding the same for builds as another user (a ``BuildUser``: the
workers' uid), with ``uid-<uid>/.uv-cache/`` (that user's uv cache, 0700, its own); ``.locks/<key>`` (leases:
shared flocks; its mtime is the last use) and ``.locks/<key>.build`` (held while building that key, across
processes).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lancefn_jupyter.environments import build, interpreters, pipconf, resolve
from lancefn_jupyter.environments.builders import BuildUser, build_environment, uv_variables
from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.environments.requirements import pip_problem
from lancefn_jupyter.wire.homefs import pid_alive

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
    if configured := os.environ.get("LANCEFN_ENV_CACHE"):
        return Path(configured)
    return Path("/var/cache/lancefn/envs") if shared else Path.home() / ".cache" / "lancefn" / "envs"


class _Flight:
    """One build in progress in this process: its output lines go to every caller waiting on it (replayed to
    late ones), and all of them get its environment or its failure."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._lines: list[str] = []
        self._logs: list[Callable[[list[str]], None]] = []
        self._env: Environment | None = None
        self._error: EnvironmentFailure | None = None

    def join(self, log: Callable[[list[str]], None] | None) -> None:
        if log is None:
            return
        with self._lock:  # held while telling, so a late waiter's lines stay in order
            self._logs.append(log)
            if self._lines:
                _tell(log, list(self._lines))

    def emit(self, lines: list[str]) -> None:
        with self._lock:
            self._lines += lines
            for log in self._logs:
                _tell(log, lines)

    def finish(self, env: Environment | None, error: EnvironmentFailure | None) -> None:
        self._env, self._error = env, error
        self._done.set()

    def result(self) -> Environment:
        self._done.wait()
        if self._error is not None:  # a copy per waiter: each raise gets its own traceback
            error = self._error
            raise EnvironmentFailure(str(error), refused=error.refused, lines=error.lines)
        assert self._env is not None
        return self._env


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
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.base_python = base_python
        self.shared = shared
        self._uv = uv
        self._env = dict(os.environ if env is None else env)
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._plans: dict[str, tuple[str, ...]] = {}
        self._base: resolve.Base | None = None
        self._settings: pipconf.UvSettings | None = None

    # -- what the request needs (no build) -------------------------------------------------------------------

    def problem(self, request: EnvironmentRequest) -> str | None:
        """Why this machine cannot honour ``request`` (a pip entry that is not a requirement; ``image``; conda
        packages not importable; ``python_version`` not found, naming the versions it has), or None. No build, no
        network; interpreter discovery cached."""
        if problem := pip_problem(request.pip):
            return problem
        if request.image:
            return (
                f"image={request.image!r}: the local executor runs no containers. Use the Ray executor "
                '(`lancefn-server --executor ray`, where image becomes runtime_env["image_uri"]) or drop image='
            )
        if request.python_version:
            wanted = _minor(request.python_version)
            if wanted is None:
                return f"python_version={request.python_version!r} is not a Python version such as '3.12'"
            if tuple(int(part) for part in wanted.split(".")) < _OLDEST_WORKER_PYTHON:
                return f"wants Python {wanted}: lancefn workers need Python 3.11 or newer"
            if self._python_for(request) is None:
                found = interpreters.available(base=self.base_python, env=self._env)
                have = ", ".join(f"{version} ({path})" for version, path in found.items()) or "none"
                return f"wants Python {wanted}; this machine has {have}"
        if request.conda and not self._layered(request):
            return (
                f"conda packages are honoured only from the control plane's own environment (Python "
                f"{self._base_version()}), not with python_version={request.python_version!r}: use pip= "
                "packages or drop python_version="
            )
        if request.conda:
            missing = resolve.unsatisfied(request.conda, self.base_python, self._env)
            if missing:
                return (
                    f"conda packages not importable in the control plane's environment ({self.base_python}): "
                    f"{', '.join(missing)} (the local executor does not run conda). Install them into that "
                    "environment, or declare them as pip="
                )
        return None

    def needs_build(self, request: EnvironmentRequest) -> bool:
        """True when workers need an environment of their own: declared pip packages the base does not satisfy, or
        a Python other than the base's. False: workers run on the base interpreter as they are."""
        if request.kind != "pip" or request.image:
            return False
        if not self._layered(request):
            return True
        return bool(resolve.unsatisfied(request.pip, self.base_python, self._env))

    def key(self, request: EnvironmentRequest, *, gpu: bool = False, builder: BuildUser | None = None) -> str:
        """The cache key: sha256 hex of the packages, the Python (version, path), the platform, the base's
        packages, the pip settings that choose where packages come from, the ``UV_*`` variables and whom it is
        built as. ``gpu``: the function runs on a GPU (an environment for another Python then gets numba-cuda);
        ``builder``: another user than the cache's own, whom the build runs as (None: this process's user)."""
        python = self._python_for(request)
        if python is None:
            raise EnvironmentFailure(self.problem(request) or "no such Python", refused=True)
        base = self._base_info()
        layered = self._layered(request)
        args = self.uv_args()
        identity = {
            "format": 2,
            "packages": resolve.normalized(request.pip),
            "python": [interpreters.version_of(python), python],
            "platform": resolve.interpreter_tag(),
            "base": sorted(base.distributions.items()),
            "pip": args,
            "constraints": _constraint_digests(args),
            "uv": uv_variables(self._env),
            "builder": [builder.uid, builder.gid] if builder is not None else None,
            "gpu": gpu and not layered,  # only another Python's environment installs the GPU stack itself
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def plan(
        self, request: EnvironmentRequest, *, gpu: bool = False, builder: BuildUser | None = None
    ) -> tuple[str, ...]:
        """The pinned requirements to install over the base (``uv pip compile`` preferring the base's versions;
        only what the base lacks or has at another version). For executors that build elsewhere (Ray's ``uv``).
        Resolved once per environment key in this process, as ``builder`` (None: this process's user): resolving
        runs build backends. Raises :class:`EnvironmentFailure` (refused: a pip entry that is not a requirement)."""
        if problem := pip_problem(request.pip):  # never an option line in the requirements file uv reads
            raise EnvironmentFailure(problem, refused=True)
        if not self.needs_build(request):
            return ()
        key = self.key(request, gpu=gpu, builder=builder)
        with self._lock:
            if key in self._plans:
                return self._plans[key]
        try:
            pins = build.compile_plan(self._build_plan(request, gpu, builder), None)
        except build.BuildFailure as exc:
            raise _failure(request, exc) from None
        with self._lock:
            self._plans[key] = pins
        return pins

    def uv_args(self) -> list[str]:
        """The uv flags the pip configuration maps to (index URLs, find-links, constraints, …)."""
        return list(self._pip().args)

    # -- the cache -------------------------------------------------------------------------------------------

    def directory(self, builder: BuildUser | None = None) -> Path:
        """Where the environments built as ``builder`` live: the root for this process's user, else
        ``uid-<uid>/`` (only the server's user and the builder's group reach it)."""
        return self.root if builder is None else self.root / f"uid-{builder.uid}"

    def lookup(
        self, request: EnvironmentRequest, *, gpu: bool = False, builder: BuildUser | None = None
    ) -> Environment | None:
        """The built environment if the cache has it (its last use refreshed), else None. No build."""
        if self.problem(request) is not None or not self.needs_build(request):
            return None
        return self._load(self.key(request, gpu=gpu, builder=builder), builder)

    def ensure(
        self,
        request: EnvironmentRequest,
        log: Callable[[list[str]], None] | None = None,
        *,
        gpu: bool = False,
        builder: BuildUser | None = None,
    ) -> Environment | None:
        """The environment, built now if needed (blocking; once across threads and processes: the others wait and
        share it); None when ``needs_build`` is False. ``log`` gets uv's output lines as they come. ``builder``:
        another user to build as (a root server's workers' uid; None: this process's user). Raises
        :class:`EnvironmentFailure` (refused, or the build failed). Evicts beyond ``max_bytes`` after a build."""
        problem = self.problem(request)
        if problem is not None:
            raise EnvironmentFailure(problem, refused=True)
        if not self.needs_build(request):
            return None
        key = self.key(request, gpu=gpu, builder=builder)
        found = self._load(key, builder)
        if found is not None:
            return found
        with self._lock:
            flight = self._flights.get(key)
            owner = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        flight.join(log)
        if owner:
            env: Environment | None = None
            # what the waiters get if this thread is interrupted (KeyboardInterrupt, SystemExit) mid-build
            error: EnvironmentFailure | None = EnvironmentFailure(
                f"the environment build was interrupted ({request.describe()})"
            )
            try:
                env, error = self._build(key, request, gpu, builder, flight.emit), None
            except EnvironmentFailure as exc:
                error = exc
            except Exception as exc:  # an I/O error of ours: still the job's phase-environment failure
                error = EnvironmentFailure(f"the environment could not be built ({request.describe()}): {exc}")
            finally:
                with self._lock:
                    del self._flights[key]  # no failure is cached: the next ensure builds again
                flight.finish(env, error)
        return flight.result()

    def lease(self, env: Environment) -> int | None:
        """An open file descriptor holding a shared lock on ``env`` (eviction skips it while any is open, in any
        process: hand it to the worker with ``pass_fds`` and close yours); None when ``env`` was evicted meanwhile
        (build it again)."""
        fd = os.open(env.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits while an eviction of it is under way
            if not (env.path / _META).exists():
                os.close(fd)
                return None
            os.utime(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def evict(self) -> list[str]:
        """Remove least-recently-used environments nobody holds a lease on until the cache fits ``max_bytes``;
        the keys removed."""
        return self._evict(keep=())

    # -- internals -------------------------------------------------------------------------------------------

    def _base_info(self) -> resolve.Base:
        with self._lock:
            if self._base is not None:
                return self._base
        base = resolve.describe_base(self.base_python, self._env)
        with self._lock:
            self._base = base
        return base

    def _pip(self) -> pipconf.UvSettings:
        with self._lock:
            if self._settings is not None:
                return self._settings
        settings = pipconf.read_pip_settings(self._env, prefix=self._base_info().prefix)
        with self._lock:
            self._settings = settings
        return settings

    def _layered(self, request: EnvironmentRequest) -> bool:
        """Whether the environment layers over the base: it runs the base's Python."""
        wanted = _minor(request.python_version) if request.python_version else None
        return wanted is None or wanted == self._base_version()

    def _base_version(self) -> str:
        """The base's ``major.minor``; this process's own without scanning its packages (``_base_info`` reads every
        distribution's metadata, ~50 ms: a plain version's registration only asks whether the Python matches)."""
        if resolve.is_this_process(self.base_python):
            return f"{sys.version_info.major}.{sys.version_info.minor}"
        return self._base_info().version

    def _python_for(self, request: EnvironmentRequest) -> str | None:
        if self._layered(request):
            return self.base_python
        wanted = _minor(request.python_version or "")
        return interpreters.find(wanted, base=self.base_python, env=self._env) if wanted else None

    def _build_plan(self, request: EnvironmentRequest, gpu: bool, builder: BuildUser | None) -> build.Plan:
        python = self._python_for(request)
        if python is None:
            raise EnvironmentFailure(self.problem(request) or "no such Python", refused=True)
        base = self._base_info()
        layered = self._layered(request)
        settings = self._pip()
        uv_cache = str(self._builder_dir(builder) / _UV_CACHE) if builder is not None else None
        return build.Plan(
            python=python,
            requirements=tuple(resolve.requirements_in(request.pip, layered=layered, gpu=gpu)),
            base=base if layered else None,
            preferred=base.distributions,
            uv=self._uv or _default_uv(),
            uv_args=settings.args,
            env=build_environment(self._env, dict(settings.env), builder, uv_cache),
            user=builder,
        )

    def _root_dir(self) -> Path:
        """The root and its ``.locks``, created on first use: 0755 when shared (the missing parents too: the
        workers, another user, must reach it), else 0700."""
        mode = 0o755 if self.shared else 0o700
        missing = [path for path in (self.root / _LOCKS, *(self.root / _LOCKS).parents) if not path.exists()]
        for path in reversed(missing):
            path.mkdir(exist_ok=True)
            if self.shared or path in (self.root, self.root / _LOCKS):
                path.chmod(mode)  # whatever the umask
        return self.root

    def _builder_dir(self, builder: BuildUser) -> Path:
        """``uid-<uid>/`` (0750, this process's user, the builder's group: its workers read the environments, no
        other user's do) and its ``.uv-cache/`` (0700, the builder's: no other build writes into it), made or
        set right on each use, through descriptors (never a link planted in the root)."""
        directory = self.directory(builder)
        _own_directory(self._root_dir(), directory.name, os.geteuid(), builder.gid, 0o750)
        _own_directory(directory, _UV_CACHE, builder.uid, builder.gid, 0o700)
        return directory

    def _environment(self, path: Path, meta: dict[str, object]) -> Environment:
        key = path.name
        installed = meta.get("installed")
        size = meta.get("size_bytes")
        return Environment(
            key=key,
            path=path,
            python=str(path / "bin" / "python"),
            lock_path=self.root / _LOCKS / key,
            installed=tuple(str(pin) for pin in installed) if isinstance(installed, list) else (),
            size_bytes=size if isinstance(size, int) else 0,
        )

    def _load(self, key: str, builder: BuildUser | None) -> Environment | None:
        """The built environment ``key`` (its last use refreshed), or None."""
        path = self.directory(builder) / key
        meta = _read_meta(path)
        if meta is None:
            return None
        env = self._environment(path, meta)
        _touch(env.lock_path)
        return env

    def _build(
        self,
        key: str,
        request: EnvironmentRequest,
        gpu: bool,
        builder: BuildUser | None,
        log: Callable[[list[str]], None],
    ) -> Environment:
        root = self._root_dir()
        with open(root / _LOCKS / f"{key}.build", "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # another process building it: wait, then use what it built
            found = self._load(key, builder)
            if found is not None:
                return found
            plan = self._build_plan(request, gpu, builder)
            try:
                meta = build.build(self.directory(builder), key, request, plan, log)
            except build.BuildFailure as exc:
                raise _failure(request, exc) from None
        env = self._environment(self.directory(builder) / key, meta)
        _touch(env.lock_path)
        self._evict(keep=(key,))  # not the one just built: its caller is about to use it
        return env

    def _evict(self, keep: Sequence[str]) -> list[str]:
        if not self.root.is_dir():
            return []
        builders = (path for path in self.root.glob("uid-*") if path.is_dir() and not path.is_symlink())
        directories = [self.root, *builders]
        for directory in directories:
            _sweep_builds(directory)
        entries = []
        for path in (entry for directory in directories for entry in directory.iterdir()):
            meta = _read_meta(path) if not path.name.startswith((".", "uid-")) else None
            if meta is not None:
                size = meta.get("size_bytes")
                entries.append(
                    (_last_use(self.root / _LOCKS / path.name, path), path, size if isinstance(size, int) else 0)
                )
        total = sum(size for _, _, size in entries)
        removed: list[str] = []
        for _, path, size in sorted(entries, key=lambda entry: entry[0]):
            if total <= self.max_bytes:
                break
            if path.name in keep:
                continue
            fd = os.open(self.root / _LOCKS / path.name, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # leased: a worker is using it
                build.remove(path)
            finally:
                os.close(fd)  # the lock file stays: a lease waiting on it must see the directory gone, not a new file
            total -= size
            removed.append(path.name)
        return removed


_META = "meta.json"
_LOCKS = ".locks"
_UV_CACHE = ".uv-cache"
_OLDEST_WORKER_PYTHON = (3, 11)
_STALE_BUILD_S = 3600.0


def _tell(log: Callable[[list[str]], None], lines: list[str]) -> None:
    try:
        log(lines)
    except Exception:  # one waiter's broken log must not fail (or strand) the build the others wait on
        pass


def _minor(version: str) -> str | None:
    """ "3.12" from "3.12" or "3.12.1"; None when it is not a version."""
    parts = version.strip().split(".")
    if len(parts) < 2 or not all(part.isdigit() for part in parts[:2]):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


def _default_uv() -> str:
    """PyPI uv's binary (a dependency), else uv on PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("uv") or "uv"


def _failure(request: EnvironmentRequest, exc: build.BuildFailure) -> EnvironmentFailure:
    """The job's message: uv's own error lines, or which check failed after uv succeeded and why."""
    if exc.by_uv and exc.lines:
        detail = "\n".join(exc.lines)
    else:
        detail = f"{exc}: " + "\n".join(exc.lines) if exc.lines else str(exc)
    return EnvironmentFailure(f"uv could not build the environment ({request.describe()}): {detail}", lines=exc.lines)


def _constraint_digests(args: Sequence[str]) -> list[str]:
    """sha256 of each ``--constraint`` file (its contents choose versions, not only its path)."""
    digests = []
    for flag, value in itertools.pairwise(args):
        if flag == "--constraint":
            try:
                digests.append(hashlib.sha256(Path(value).read_bytes()).hexdigest())
            except OSError:
                digests.append("")
    return digests


def _own_directory(parent: Path, name: str, uid: int, gid: int, mode: int) -> None:
    """``parent/name`` a directory owned ``uid:gid`` with ``mode`` (made if missing); a link or a file there is
    refused (OSError), never followed."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(parent / name, 0o700)
    fd = os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _read_meta(path: Path) -> dict[str, object] | None:
    try:
        meta = json.loads((path / _META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _touch(lock_path: Path) -> None:
    """Record a use (the lock file's mtime); a cache this process cannot write still serves."""
    try:
        lock_path.touch(mode=0o644)
    except OSError:
        pass


def _last_use(lock_path: Path, env_path: Path) -> float:
    for path in (lock_path, env_path):
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def _sweep_builds(root: Path) -> None:
    """Remove ``.build-<key>-<pid>-<n>`` directories over an hour old whose builder is gone (a crash mid-build)."""
    now = time.time()
    for path in root.glob(".build-*"):
        parts = path.name.split("-")
        if len(parts) != 4 or not parts[2].isdigit():
            continue
        try:
            if now - path.stat().st_mtime < _STALE_BUILD_S or pid_alive(int(parts[2])):
                continue
        except OSError:
            continue
        build.remove(path)
