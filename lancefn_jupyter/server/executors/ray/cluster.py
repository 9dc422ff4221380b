"""The cluster as the Ray processes see it (the control plane, the bridge, the tasks): class resources, the
local cluster plan, its temp dir, the sweep of a bridge's local Ray processes, which pip packages a task
installs, and the ``runtime_env`` fields of a version's environment (docs/ARCHITECTURE.md, "Environments")."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lancefn_jupyter.environments.request import EnvironmentRequest
    from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig


CLASS_RESOURCE_PREFIX = "lancefn_gpu_class:"
NAMESPACE = "lancefn"  # Ray namespace of the event hub actors (the bridge makes them, tasks look them up)
_MAX_SOCKET_DIR = 40  # Ray's unix sockets live under <temp_dir>/session_…/sockets (107-char limit)


def class_resource(gpu_class: str) -> str:
    """The Ray custom resource of a GPU class: one unit per GPU of the class on a node."""
    return CLASS_RESOURCE_PREFIX + gpu_class


def local_cluster_plan(classes: GpuClassConfig | None) -> dict:
    """What a local Ray started by the executor gets: ``{"gpu_ids": [...], "resources": {...}}``.

    Every configured device becomes one logical Ray GPU (real classes keep their CUDA ids, so
    Ray hands tasks real device ids; simulated classes get ``sim0, sim1, …`` numbered across
    classes) and each class gets its class resource with one unit per device.  Ray enforces the
    per-class *counts*; on one node it may hand a task of one class a GPU id listed for another.
    """
    gpu_ids: list[str] = []
    resources: dict[str, int] = {}
    sim = 0
    for spec in classes.classes if classes is not None else ():
        if spec.simulated:
            ids = [f"sim{sim + i}" for i in range(len(spec.devices))]
            sim += len(ids)
        else:
            ids = list(spec.devices)
        gpu_ids += ids
        if ids:
            resources[class_resource(spec.name)] = len(ids)
    return {"gpu_ids": gpu_ids, "resources": resources}


def default_temp_dir(home: str | os.PathLike[str] | None) -> str:
    """Ray's temp dir for a local cluster: ``<home>/ray`` when short enough for Ray's unix
    sockets, else a per-home directory under the system temp dir."""
    if os.environ.get("LANCEFN_RAY_TEMP_DIR"):
        return os.environ["LANCEFN_RAY_TEMP_DIR"]
    if home is not None:
        candidate = os.path.join(os.path.abspath(home), "ray")
        if len(candidate) <= _MAX_SOCKET_DIR:
            return candidate
    import hashlib
    import tempfile

    tag = hashlib.sha256(str(home).encode()).hexdigest()[:8]
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    return os.path.join(base, f"lancefn-ray-{os.getuid() if hasattr(os, 'getuid') else 0}-{tag}")


def pip_requirements(packages: Sequence[str], mode: str = "auto") -> list[str]:
    """Which declared packages go to Ray (into ``runtime_env["uv"]``, resolved: :func:`environment_runtime_env`).

    ``auto`` (default): only PEP 508 requirements that are *not* satisfied in the control
    plane's own environment — the same check the worker makes.  A local Ray shares that
    environment, and a cluster image is expected to be built like it, so installed packages
    are not re-installed per task (and a cluster without internet keeps working).
    ``always``: every PEP 508 requirement.  ``never``: none.  Conda specs never go to pip; the
    worker's check in the task still fails such a job in phase ``environment`` naming them.
    """
    if mode == "never" or not packages:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    pep508 = []
    for text in packages:
        try:
            Requirement(text)
        except InvalidRequirement:
            continue
        pep508.append(text)
    if mode == "always":
        return pep508
    from lancefn_jupyter.worker.runner import missing_packages

    missing = {text for text, _ in missing_packages(pep508)}
    return [text for text in pep508 if text in missing]


def needs_resolution(request: EnvironmentRequest | None, packages: Sequence[str], mode: str = "auto") -> bool:
    """Whether :func:`environment_runtime_env` would call its ``plan``: pip packages go to Ray's ``uv`` and the
    versions must be resolved over the control plane's packages first (``auto`` mode, no ``image``)."""
    if request is not None and request.image:
        return False
    return mode == "auto" and bool(pip_requirements(_pip_packages(request, packages), mode))


def environment_runtime_env(
    request: EnvironmentRequest | None,
    packages: Sequence[str],
    mode: str = "auto",
    *,
    plan: Callable[[EnvironmentRequest], Sequence[str]],
    uv_args: Callable[[], Sequence[str]] = list,
) -> dict[str, Any]:
    """The ``runtime_env`` fields of a version's environment on Ray (docs/ray.md, "Packages and environment").

    * ``image`` → ``{"image_uri": image}`` alone: Ray refuses ``image_uri`` beside ``pip``/``uv``, so the image
      must hold the declared packages (the worker's check in the task names missing ones).
    * pip packages the control plane lacks (``LANCEFN_RAY_PIP`` ``auto``) → ``{"uv": {"packages": plan,
      "uv_pip_install_options": ["--no-deps", *uv_args]}}``: ``plan`` is the layering rule's pinned set over the
      control plane's packages (``EnvironmentCache.plan``), and ``--no-deps`` makes Ray's uv install exactly it.
      ``always``: every declared requirement, resolved by Ray's uv on the node (its image, not ours, is the base).
      ``never``: nothing.
    * conda specs: nothing (never installed per task).

    ``plan`` may raise (a resolution error): the caller fails the job in phase ``environment`` with it."""
    if request is not None and request.image:
        return {"image_uri": request.image}
    pip = pip_requirements(_pip_packages(request, packages), mode)
    if not pip:
        return {}
    if mode == "always":
        return {"uv": {"packages": list(pip), "uv_pip_install_options": list(uv_args())}}
    from lancefn_jupyter.environments.request import EnvironmentRequest

    if request is None:
        request = EnvironmentRequest(packages=tuple(packages))
    pinned = list(plan(request))
    if not pinned:  # the resolution kept the control plane's versions after all
        return {}
    return {"uv": {"packages": pinned, "uv_pip_install_options": ["--no-deps", *uv_args()]}}


def _pip_packages(request: EnvironmentRequest | None, packages: Sequence[str]) -> Sequence[str]:
    """The declared pip requirements: the request's (none for a conda environment), else ``packages``."""
    return request.pip if request is not None else packages


def _session_pids(sid: int) -> list[int]:
    import psutil  # a dependency; portable where /proc is not

    found = []
    for pid in psutil.pids():
        if pid == os.getpid():
            continue
        try:
            if os.getsid(pid) == sid:
                found.append(pid)
        except (ProcessLookupError, PermissionError, OSError):
            continue
    return found


def kill_session(sid: int, grace_s: float = 2.0) -> None:
    """Stop the processes a bridge left behind (Ray's raylet, GCS, agents, workers)."""
    pids = _session_pids(sid)
    if not pids:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _session_pids(sid):
        time.sleep(0.1)
    for pid in _session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
