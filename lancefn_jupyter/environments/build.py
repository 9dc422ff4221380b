"""Building one environment with uv, atomically (docs/ARCHITECTURE.md, "Environments").

Into ``<dir>/.build-<key>-<pid>-<n>``: ``uv venv``, ``uv pip compile`` (the base's versions preferred), ``uv pip
install --no-deps`` of what the base lacks — each run as the plan's :class:`~builders.BuildUser` when it has one, in
a fresh private directory (its cwd; another user's ``HOME`` and ``TMPDIR`` too) —, the link to the base (a ``.pth``)
or to ``lancefn_jupyter`` (another Python) and ``meta.json``, written by the server without following links, the
tree sealed (``seal.py``: the server's, read-only), a check that its Python imports the worker (as the build's
user), then renamed into ``<dir>/<key>``. Any failure removes the half-built directory and raises
:class:`BuildFailure`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lancefn_jupyter.environments import resolve
from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.environments.seal import SealError, seal

__all__ = ["BASE_PTH", "BuildFailure", "Plan", "build", "compile_plan", "remove", "tree_size"]

BASE_PTH = "_lancefn_base.pth"
_ERROR_LINES = 12  # of uv's error output in a failure message: enough to name the package, short enough to read
_counter = itertools.count()
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Run by the new environment's Python: it must start a worker and satisfy the declared requirements
_CHECK = """
import json, sys
import lancefn_jupyter.worker.main
from lancefn_jupyter.worker.runner import missing_packages
print(json.dumps(missing_packages(json.loads(sys.argv[1]))))
"""

Log = Callable[[list[str]], None]


class BuildFailure(Exception):
    """A step failed: ``str(self)`` says which; ``lines`` are uv's error lines (``by_uv``) or the check's."""

    def __init__(self, message: str, lines: Sequence[str] = (), *, by_uv: bool = False) -> None:
        super().__init__(message)
        self.lines = tuple(lines)
        self.by_uv = by_uv


@dataclass(frozen=True)
class Plan:
    """How to build: the interpreter, the requirements, the base to layer over (None: another Python), and whom
    the build runs as (None: the server's own user) with what environment (``builders.build_environment``)."""

    python: str
    requirements: tuple[str, ...]
    base: resolve.Base | None
    preferred: Mapping[str, str]  # the base's versions, preferred when resolving
    uv: str
    uv_args: tuple[str, ...]
    env: Mapping[str, str]
    user: BuildUser | None = None


@dataclass(frozen=True)
class _Workspace:
    """A build's private directory, and the environment its processes get."""

    path: Path
    env: Mapping[str, str]
    user: BuildUser | None

    def process(self, argv: Sequence[str]) -> dict[str, Any]:
        """``subprocess`` arguments of a build process ``argv``: run here, as the build's user with no other groups.
        Run as another user, it is the first process of a pid namespace of its own where the server may make one
        (root): when it ends, the kernel ends every process it left (a build backend's daemon cannot outlive its
        step and change the tree after it is sealed)."""
        base: dict[str, Any] = {
            "args": list(argv),
            "cwd": self.path,
            "env": dict(self.env),
            "stdin": subprocess.DEVNULL,
        }
        if self.user is None:
            return base
        if (unshare := _pid_namespace_tool()) is not None:
            ids = ["-S", str(self.user.uid), "-G", str(self.user.gid)]
            return {**base, "args": [unshare, "--pid", "--fork", "--kill-child", *ids, "--", *argv], "extra_groups": []}
        return {**base, "user": self.user.uid, "group": self.user.gid, "extra_groups": []}

    def write(self, name: str, text: str) -> str:
        """A new file of ours for the build's processes to read (and write: it is the build user's)."""
        path = self.path / name
        fd = os.open(path, _CREATE, 0o644)
        with os.fdopen(fd, "w") as handle:
            if self.user is not None:
                os.fchown(fd, self.user.uid, self.user.gid)
            handle.write(text)
        return str(path)

    def read(self, name: str) -> str:
        """What a build process wrote: a plain file of the build's user, read without following a link."""
        fd = os.open(self.path / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd) as handle:
            found = os.fstat(fd)
            owner = self.user.uid if self.user is not None else os.geteuid()
            if not stat.S_ISREG(found.st_mode) or found.st_uid != owner or found.st_nlink != 1:
                raise BuildFailure(f"uv left something other than its output at {name}")
            return handle.read()


@functools.cache
def _pid_namespace_tool() -> str | None:
    """util-linux ``unshare`` when it can give a build step a pid namespace of its own as another user here (root,
    with ``CAP_SYS_ADMIN``: a container may drop it); else None, and steps run without one (ARCHITECTURE
    "Environments", "Not covered")."""
    tool = shutil.which("unshare")
    if tool is None or os.geteuid() != 0:
        return None
    try:
        probe = subprocess.run(
            [tool, "--pid", "--fork", "--kill-child", "-S", "65534", "-G", "65534", "--", "/bin/true"],
            capture_output=True,
            timeout=10,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return tool if probe.returncode == 0 else None


@contextlib.contextmanager
def _workspace(plan: Plan) -> Iterator[_Workspace]:
    """A fresh private directory (0700, the build user's): the cwd of every build process, so nothing planted in the
    server's cwd or its parents is read; another user's ``HOME`` and ``TMPDIR``. Removed after (links not followed)."""
    path = Path(tempfile.mkdtemp(prefix="lancefn-build-"))
    try:
        env = dict(plan.env)
        if plan.user is not None:
            os.chown(path, plan.user.uid, plan.user.gid)
            env.update(HOME=str(path), TMPDIR=str(path))
        yield _Workspace(path, env, plan.user)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_uv(args: Sequence[str], plan: Plan, log: Log | None, work: _Workspace) -> list[str]:
    """Run uv with ``args`` in ``work``, its output lines to ``log`` as they come; its output lines, or
    BuildFailure."""
    process = subprocess.Popen(
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        umask=0o022,  # readable by the workers of a shared cache, whatever this process's umask
        **{**work.process([plan.uv, *args]), "env": {**work.env, "NO_COLOR": "1"}},
    )
    assert process.stdout is not None
    lines = []
    for raw in process.stdout:
        line = raw.rstrip("\n")
        lines.append(line)
        if log is not None:
            log([line])
    if process.wait() != 0:
        command = " ".join(args[:2] if args[0] == "pip" else args[:1])
        raise BuildFailure(f"uv {command} failed", _error_lines(lines), by_uv=True)
    return lines


def _error_lines(lines: Sequence[str]) -> list[str]:
    """uv's error report (from its first ``error:`` line), without blank lines and hints."""
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith(("error:", "×"))), 0)
    kept = [line.strip() for line in lines[start:] if line.strip() and not line.lstrip().startswith("hint:")]
    return kept[:_ERROR_LINES]


def compile_plan(plan: Plan, log: Log | None, *, python: str | None = None) -> tuple[str, ...]:
    """``uv pip compile`` of the requirements (the base's versions preferred): the pins to install."""
    with _workspace(plan) as work:
        return _compile(plan, log, work, python or plan.python)


def _compile(plan: Plan, log: Log | None, work: _Workspace, python: str) -> tuple[str, ...]:
    wanted = work.write("requirements.in", "".join(f"{line.strip()}\n" for line in plan.requirements))
    pinned = work.write("requirements.txt", resolve.preferences(plan.preferred))
    args = ["pip", "compile", wanted, "-o", pinned, "--python", python, "--no-header", "--no-annotate"]
    run_uv([*args, *plan.uv_args], plan, log, work)
    pins = resolve.resolved_pins(work.read("requirements.txt"))
    return resolve.install_set(pins, None if plan.base is None else plan.base.distributions)


def build(directory: Path, key: str, request: EnvironmentRequest, plan: Plan, log: Log | None) -> dict[str, object]:
    """Build the environment ``key`` in ``directory``; its ``meta.json`` contents. Raises BuildFailure."""
    tmp = directory / f".build-{key}-{os.getpid()}-{next(_counter)}"
    try:
        with _workspace(plan) as work:
            tmp.mkdir(mode=0o700)
            if plan.user is not None:
                os.chown(tmp, plan.user.uid, plan.user.gid)
            venv = ["venv", "--relocatable", "--python", plan.python, "--no-python-downloads", str(tmp)]
            run_uv(venv, plan, log, work)
            python = str(tmp / "bin" / "python")
            installed = _compile(plan, log, work, python)
            if installed:
                listing = work.write("install.txt", "".join(f"{pin}\n" for pin in installed))
                run_uv(
                    ["pip", "install", "--python", python, "--no-deps", "-r", listing, *plan.uv_args], plan, log, work
                )
            _link(tmp, plan)
            final = directory / key
            meta = {
                "key": key,
                "request": asdict(request),
                "python": str(final / "bin" / "python"),
                "installed": list(installed),
                "size_bytes": tree_size(tmp),
                "built_at": time.time(),
            }
            _write(tmp, ("meta.json",), json.dumps(meta, indent=1))
            try:
                seal(tmp, plan.user.uid if plan.user is not None else None)
            except SealError as error:
                raise BuildFailure(f"the built environment cannot be sealed: {error}") from None
            _check(python, request.pip, work)
        if final.exists() and not (final / "meta.json").exists():  # what an interrupted eviction left: unusable
            remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # built meanwhile by a process that ignored the lock: keep the one in place
            if not (final / "meta.json").exists():
                raise
            remove(tmp)
            return dict(json.loads((final / "meta.json").read_text()))
        _fsync_dir(directory)
        return meta
    except BaseException:
        remove(tmp)
        raise


def _site_packages(env: Path) -> tuple[str, ...]:
    """``lib/python3.X/site-packages`` of ``env``, as path components under it."""
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise BuildFailure(f"uv venv made no site-packages in {env}")
    return found[0].relative_to(env).parts


def _link(env: Path, plan: Plan) -> None:
    """Layered: a ``.pth`` adding the base's site directories after the environment's own (``addsitedir``, so the
    base's own ``.pth`` files, editable installs included, apply). Another Python: ``lancefn_jupyter`` linked in
    (never the base's site-packages: their extension modules are for another ABI)."""
    site_packages = _site_packages(env)
    if plan.base is not None:
        lines = [f"import site; site.addsitedir({directory!r})\n" for directory in plan.base.site_dirs]
        _write(env, (*site_packages, BASE_PTH), "".join(lines))
    else:
        package = Path(__file__).resolve().parents[1]  # lancefn_jupyter, as this process imports it
        with _directory(env, site_packages) as fd:
            os.symlink(package, "lancefn_jupyter", target_is_directory=True, dir_fd=fd)


@contextlib.contextmanager
def _directory(env: Path, parts: Sequence[str]) -> Iterator[int]:
    """A descriptor of ``env/<parts>``, reached one directory at a time without following a link (the tree is the
    build user's until it is sealed)."""
    fd = os.open(env, _OPEN_DIR)
    try:
        for part in parts:
            inner = os.open(part, _OPEN_DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def _write(env: Path, parts: Sequence[str], text: str) -> None:
    """A new file of ours in the environment, readable by everyone whatever this process's umask (a shared
    cache's workers are another user: without the ``.pth`` they would not see the base); never through a link."""
    with _directory(env, parts[:-1]) as fd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=fd)  # what the build put there (ours must be what it says)
        handle = os.open(parts[-1], _CREATE, 0o644, dir_fd=fd)
        with os.fdopen(handle, "w") as out:
            os.fchmod(handle, 0o644)
            out.write(text)


def _check(python: str, requirements: Sequence[str], work: _Workspace) -> None:
    """The environment's Python starts a worker and satisfies the declared requirements (run as the build's user:
    its packages' ``.pth`` files run)."""
    done = subprocess.run(  # PYTHONSAFEPATH is set (builders.build_environment): as a worker starts
        capture_output=True,
        text=True,
        timeout=120,
        **work.process([python, "-c", _CHECK, json.dumps(list(requirements))]),
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()[-1:]  # the exception line says what is missing
        raise BuildFailure("its Python cannot start a lancefn worker", lines)
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    if missing:
        lines = [f"{text}: {reason}" for text, reason in missing]
        raise BuildFailure("the built environment does not satisfy its requirements", lines)


def tree_size(path: Path) -> int:
    """Bytes of the files under ``path`` (links not followed)."""
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return total


def remove(path: Path) -> None:
    """Remove an environment (built or half-built): its ``meta.json`` first, so that what a failure leaves is
    never taken for a usable environment. ``rmtree`` never follows a link; a server that is not root makes its own
    read-only directories writable first (root needs no write permission, and must not ``chmod`` through a tree
    another user may still be changing)."""
    if not os.path.lexists(path):
        return
    if os.geteuid() != 0:
        for parent, dirs, _files in os.walk(path):
            os.chmod(parent, 0o755)
            for name in dirs:
                full = os.path.join(parent, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o755)
    with contextlib.suppress(OSError):
        os.unlink(path / "meta.json")
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
