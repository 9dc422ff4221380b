"""`lookup()`: a handle on a registered version from any kernel or script (runs in the kernel;
docs/ARCHITECTURE.md, "Function versions (wire rules)")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lancefn_jupyter.kernel.handles.function import GpuFunction
from lancefn_jupyter.kernel.handles.history import live_versions, pick_version
from lancefn_jupyter.kernel.handles.job import Job
from lancefn_jupyter.kernel.session import current_client

__all__ = ["debug_job", "lookup"]


def lookup(ref: str) -> GpuFunction:
    """A handle on a registered version from any kernel or script: `lookup("name")` (newest) or
    `lookup("name@1a2b3c")` (a unique version prefix of 6+ characters).

    It has `submit`, `map`, `remote`, `local`, `version`, `diff` and the card. Env values are secrets the
    control plane never returns: `.local()` takes each env name's value from this process's environment.
    """
    from lancefn_jupyter.wire.versions import parse_ref

    name, prefix = parse_ref(ref)
    client = current_client()
    fv = pick_version(name, prefix, live_versions(client, name))
    return GpuFunction.from_version(fv, client.functions.artifact(fv.name, fv.version))


def debug_job(job_id: str, commands: Sequence[str] = ()) -> Any:
    """`Job.debug()` for a job known by its id (`%gpu_debug JOB_ID`, any kernel): its version is looked up first
    (docs/ARCHITECTURE.md, "Debugging a failure")."""
    job = Job.attach(job_id)
    spec = job.snapshot.spec
    function = lookup(f"{spec.get('name', '?')}@{spec.get('version', '?')}")
    return Job(job_id, function=function, snapshot=job.snapshot).debug(commands)
