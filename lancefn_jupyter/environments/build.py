"""Building one environment with uv, atomically (docs/ARCHITECTURE.md, "Environments").

Into ``<root>/.build-<key>-<pid>-<n>``: ``uv venv``, ``uv pip compile`` (the base's versions preferred), ``uv pip
install --no-deps`` of what the base lacks, the link to the base (a ``.pth``) or to ``lancefn_jupyter`` (another
Python), a check that its Python imports the worker, ``meta.json``, directories made read-only, then renamed into
``<root>/<key>``. Any failure removes the half-built directory and raises :class:`EnvironmentFailure`.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lancefn_jupyter.environments import resolve
from lancefn_jupyter.environments.request import EnvironmentRequest

__all__ = ["BASE_PTH", "BuildFailure", "Plan", "build", "compile_plan", "remove", "tree_size"]

BASE_PTH = "_lancefn_base.pth"
_ERROR_LINES = 12  # of uv's error output in a failure message: enough to name the package, short enough to read
_counter = itertools.count()

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
    """How to build: the interpreter, the requirements, and the base to layer over (None: another Python)."""

    python: str
    requirements: tuple[str, ...]
    base: resolve.Base | None
    preferred: Mapping[str, str]  # the base's versions, preferred when resolving
    uv: str
    uv_args: tuple[str, ...]
    env: Mapping[str, str]


def run_uv(args: Sequence[str], plan: Plan, log: Log | None) -> list[str]:
    """Run uv with ``args``, its output lines to ``log`` as they come; its output lines, or BuildFailure."""
    process = subprocess.Popen(
        [plan.uv, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env={**plan.env, "NO_COLOR": "1"},
        umask=0o022,  # readable by the workers of a shared cache, whatever this process's umask
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
    with tempfile.TemporaryDirectory(prefix="lancefn-resolve-") as scratch:
        wanted = Path(scratch, "requirements.in")
        wanted.write_text("".join(f"{line}\n" for line in plan.requirements))
        pinned = Path(scratch, "requirements.txt")
        pinned.write_text(resolve.preferences(plan.preferred))
        args = ["pip", "compile", str(wanted), "-o", str(pinned), "--python", python or plan.python]
        run_uv([*args, "--no-header", "--no-annotate", *plan.uv_args], plan, log)
        pins = resolve.resolved_pins(pinned.read_text())
    return resolve.install_set(pins, None if plan.base is None else plan.base.distributions)


def build(root: Path, key: str, request: EnvironmentRequest, plan: Plan, log: Log | None) -> dict[str, object]:
    """Build the environment ``key`` under ``root``; its ``meta.json`` contents. Raises BuildFailure."""
    tmp = root / f".build-{key}-{os.getpid()}-{next(_counter)}"
    try:
        run_uv(["venv", "--relocatable", "--python", plan.python, "--no-python-downloads", str(tmp)], plan, log)
        python = str(tmp / "bin" / "python")
        installed = compile_plan(plan, log, python=python)
        if installed:
            with tempfile.NamedTemporaryFile("w", prefix="lancefn-install-", suffix=".txt") as listing:
                listing.write("".join(f"{pin}\n" for pin in installed))
                listing.flush()
                args = ["pip", "install", "--python", python, "--no-deps", "-r", listing.name]
                run_uv([*args, *plan.uv_args], plan, log)
        _link(tmp, plan)
        _check(python, request.pip, plan.env)
        final = root / key
        meta = {
            "key": key,
            "request": asdict(request),
            "python": str(final / "bin" / "python"),
            "installed": list(installed),
            "size_bytes": tree_size(tmp),
            "built_at": time.time(),
        }
        _write(tmp / "meta.json", json.dumps(meta, indent=1))
        _make_read_only(tmp)
        if final.exists() and not (final / "meta.json").exists():  # what an interrupted eviction left: unusable
            remove(final)
        try:
            os.rename(tmp, final)
        except OSError:  # built meanwhile by a process that ignored the lock: keep the one in place
            if not (final / "meta.json").exists():
                raise
            remove(tmp)
            return dict(json.loads((final / "meta.json").read_text()))
        _fsync_dir(root)
        return meta
    except BaseException:
        remove(tmp)
        raise


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages"))
    if not found:
        raise BuildFailure(f"uv venv made no site-packages in {env}")
    return found[0]


def _link(env: Path, plan: Plan) -> None:
    """Layered: a ``.pth`` adding the base's site directories after the environment's own (``addsitedir``, so the
    base's own ``.pth`` files, editable installs included, apply). Another Python: ``lancefn_jupyter`` linked in
    (never the base's site-packages: their extension modules are for another ABI)."""
    site_packages = _site_packages(env)
    if plan.base is not None:
        lines = [f"import site; site.addsitedir({directory!r})\n" for directory in plan.base.site_dirs]
        _write(site_packages / BASE_PTH, "".join(lines))
    else:
        package = Path(__file__).resolve().parents[1]  # lancefn_jupyter, as this process imports it
        (site_packages / "lancefn_jupyter").symlink_to(package, target_is_directory=True)


def _write(path: Path, text: str) -> None:
    """A file of ours in the environment, readable by everyone whatever this process's umask (a shared cache's
    workers are another user: without the ``.pth`` they would not see the base)."""
    path.write_text(text)
    path.chmod(0o644)


def _check(python: str, requirements: Sequence[str], env: Mapping[str, str]) -> None:
    """The environment's Python starts a worker and satisfies the declared requirements."""
    done = subprocess.run(
        [python, "-c", _CHECK, json.dumps(list(requirements))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONSAFEPATH": "1"},  # as a worker starts: nothing from the working directory
        cwd="/",  # a Python before 3.11 ignores PYTHONSAFEPATH: nothing planted in our cwd runs (ARCHITECTURE "Isolation")
        stdin=subprocess.DEVNULL,
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


def _make_read_only(path: Path) -> None:
    """Directories 0555, deepest first: nobody adds, removes or renames files. Files keep their modes (uv may
    hardlink them from its cache: a chmod would change the cache's copy too)."""
    for parent, dirs, _files in os.walk(path, topdown=False):
        for name in dirs:
            full = os.path.join(parent, name)
            if not os.path.islink(full):
                os.chmod(full, 0o555)
    os.chmod(path, 0o555)


def remove(path: Path) -> None:
    """Remove an environment (built or half-built): its ``meta.json`` first, so that what a failure leaves is
    never taken for a usable environment; directories made writable again for ``rmtree``."""
    if not path.exists():
        return
    for parent, dirs, _files in os.walk(path):
        os.chmod(parent, 0o755)
        for name in dirs:
            full = os.path.join(parent, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755)
    (path / "meta.json").unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
