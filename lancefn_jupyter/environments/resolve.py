"""What an environment installs: the base's packages, the requirements to resolve, and the layering rule
(docs/ARCHITECTURE.md, "Environments").

Pure apart from :func:`describe_base` and :func:`unsatisfied`, which ask the base interpreter (in this process when
it is this process's, else in a subprocess that imports only the standard library and ``lancefn_jupyter.worker``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "GPU_WORKER_REQUIREMENTS",
    "WORKER_REQUIREMENTS",
    "Base",
    "describe_base",
    "install_set",
    "interpreter_tag",
    "is_this_process",
    "normalized",
    "preferences",
    "requirements_in",
    "resolved_pins",
    "unsatisfied",
]

# What a worker imports beyond lancefn_jupyter itself, for an environment that cannot layer over the base
WORKER_REQUIREMENTS = ("packaging", "numpy", "pyarrow")
GPU_WORKER_REQUIREMENTS = ("numba", "numba-cuda")

# Run in the base (exec'd here when the base is this process): what it has, as JSON-able data
_DESCRIBE = """
def describe():
    import site, sys
    from importlib import metadata
    dists = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in dists:
            dists[name] = dist.version
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if site.ENABLE_USER_SITE and user not in dirs:
        dirs.append(user)
    return {"version": "%d.%d" % sys.version_info[:2], "site_dirs": dirs, "prefix": sys.prefix,
            "distributions": dists}
"""

_UNSATISFIED = """
import json, sys
from lancefn_jupyter.worker.runner import missing_packages
print(json.dumps(missing_packages(json.loads(sys.argv[1]))))
"""


@dataclass(frozen=True)
class Base:
    """The interpreter environments layer over: its Python, site directories, and installed distributions."""

    python: str
    version: str  # "3.11"
    prefix: str
    site_dirs: tuple[str, ...]
    distributions: Mapping[str, str]  # canonical name -> version (the first on its path, as imports see it)


def is_this_process(python: str) -> bool:
    """Whether ``python`` is this process's interpreter (not resolved through symlinks: a venv's python links to
    an interpreter whose packages differ)."""
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def _run_in(python: str, script: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        [python, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        cwd="/",  # a Python before 3.11 ignores PYTHONSAFEPATH: nothing planted in our cwd runs (ARCHITECTURE "Isolation")
    )
    if done.returncode != 0:
        raise RuntimeError(f"{python} failed: {done.stderr.strip()[-500:]}")
    return done.stdout


def describe_base(python: str, env: Mapping[str, str] | None = None) -> Base:
    """The base interpreter as environments see it."""
    if is_this_process(python):
        scope: dict[str, Any] = {}
        exec(_DESCRIBE, scope)
        data = scope["describe"]()
    else:
        data = json.loads(_run_in(python, _DESCRIBE + "import json; print(json.dumps(describe()))", env=env))
    dists: dict[str, str] = {}
    for name, version in data["distributions"].items():
        dists.setdefault(canonicalize_name(name), version)
    return Base(python, data["version"], data["prefix"], tuple(data["site_dirs"]), dists)


def unsatisfied(requirements: Sequence[str], python: str, env: Mapping[str, str] | None = None) -> list[str]:
    """The requirements ``python``'s environment does not satisfy (``missing_packages``' rules, run there)."""
    if not requirements:
        return []
    if is_this_process(python):
        from lancefn_jupyter.worker.runner import missing_packages

        return [text for text, _ in missing_packages(requirements)]
    try:
        answer = _run_in(python, _UNSATISFIED, json.dumps(list(requirements)), env=env)
    except (RuntimeError, OSError, subprocess.SubprocessError):
        return list(requirements)  # a base that cannot run the check cannot run a worker: the build's check says why
    return [text for text, _ in json.loads(answer)]


def requirements_in(packages: Sequence[str], *, layered: bool, gpu: bool = False) -> list[str]:
    """The requirements to resolve: the declared ones, plus the worker's own for an environment that does not
    layer over the base (it has none of the base's packages)."""
    wanted = list(packages)
    if not layered:
        named = {_name(text) for text in packages}
        extra = WORKER_REQUIREMENTS + (GPU_WORKER_REQUIREMENTS if gpu else ())
        wanted += [name for name in extra if name not in named]
    return wanted


def preferences(distributions: Mapping[str, str]) -> str:
    """An output file seeded with the base's pins: ``uv pip compile -o`` keeps existing pins where compatible, so
    the resolution prefers what the base has (installing less, and matching what the base was tested with). A
    version that is not PEP 440 is left out: uv would refuse the whole file."""
    return "".join(f"{name}=={version}\n" for name, version in sorted(distributions.items()) if _valid(version))


def resolved_pins(text: str) -> list[str]:
    """The requirements of a ``uv pip compile`` output file (comments, options and hashes dropped)."""
    pins = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        pins.append(line.split(" --hash", 1)[0].strip())
    return pins


def install_set(pins: Sequence[str], distributions: Mapping[str, str] | None) -> tuple[str, ...]:
    """The pins to install: all of them without a base (``None``), else those the base lacks or has at another
    version. A pin that is not ``name==version`` (a URL) is always installed."""
    if distributions is None:
        return tuple(pins)
    chosen = []
    for pin in pins:
        try:
            requirement = Requirement(pin)
        except InvalidRequirement:
            chosen.append(pin)
            continue
        have = distributions.get(canonicalize_name(requirement.name))
        versions = [spec.version for spec in requirement.specifier if spec.operator in ("==", "===")]
        if have is None or requirement.url or not versions or not _same_version(have, versions[0]):
            chosen.append(pin)
    return tuple(chosen)


def _valid(version: str) -> bool:
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _name(text: str) -> str:
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return text.strip().lower()


def normalized(packages: Sequence[str]) -> tuple[str, ...]:
    """Requirements in one spelling, sorted: two requests naming the same packages share one environment."""
    out = set()
    for text in packages:
        try:
            out.add(str(Requirement(text)))
        except InvalidRequirement:
            out.add(text.strip())
    return tuple(sorted(out))


def interpreter_tag() -> str:
    """This platform (part of a cache key: an environment built on one machine type is not for another)."""
    import platform

    return f"{sys.platform}-{platform.machine()}-{'-'.join(platform.libc_ver())}"
