"""The Python API behind the magics: connections, GPU function handles, job handles, profiles.

Everything a magic does is reachable from here, for scripts and tests:

    from lancefn_jupyter import gpu_function, connect, list_gpu_classes
    @gpu_function(num_gpus=1, pip=["numpy"])
    def double(x: float) -> float: ...
    double.submit(2.0).result()

Connection rule (docs/ARCHITECTURE.md, "Connection rule"): an explicit `connect(url, api_key)`, else
`LANCEFN_URL`/`LANCEFN_API_KEY`, else the embedded control plane under `$LANCEFN_HOME`, started on first
use and reused afterwards.

This module holds no state and no logic: it re-exports the public names from the modules that own
them (docs/ARCHITECTURE.md, "Package layout"): `session.py` (connection, profiles), and in `handles/`
`function.py` (`GpuFunction`, `gpu_function`), `job.py` (`Job` and its errors), `batch.py`, `table_map.py` (`Backfill`),
`lookup.py` and `history.py` (versions from anywhere), and `listings.py`. Nothing in the package
imports this module except the magics and the package's lazy `__getattr__`.
"""

from __future__ import annotations

from lancefn_jupyter.kernel.client import LancefnEnvironmentWarning
from lancefn_jupyter.kernel.client import LancefnError as LancefnError

# `X as X`: reachable as `api.X` though not in `__all__` (the magics, tests and scripts use them).
from lancefn_jupyter.kernel.handles.batch import Batch, BatchChunkError, BatchError
from lancefn_jupyter.kernel.handles.function import (
    GpuFunction,
    NotRegisteredError,
    UnregisteredFunction,
    function_from_cell,
    gpu_function,
)
from lancefn_jupyter.kernel.handles.function import bind_refused as bind_refused
from lancefn_jupyter.kernel.handles.history import diff_versions, version_history
from lancefn_jupyter.kernel.handles.job import Job, JobCancelled, JobError, JobTimedOut, RemoteFunctionError
from lancefn_jupyter.kernel.handles.lookup import debug_job, lookup
from lancefn_jupyter.kernel.handles.table_map import Backfill
from lancefn_jupyter.kernel.listings import gpu_usage, list_gpu_classes, list_jobs, list_versions
from lancefn_jupyter.kernel.session import ConnectionInfo as ConnectionInfo
from lancefn_jupyter.kernel.session import (
    add_profile,
    connect,
    connection_info,
    current_client,
    gpu_profile,
    profiles,
    stop_local,
    use_local,
)

__all__ = [
    "Backfill",
    "Batch",
    "BatchChunkError",
    "BatchError",
    "GpuFunction",
    "Job",
    "JobCancelled",
    "JobError",
    "JobTimedOut",
    "LancefnEnvironmentWarning",
    "NotRegisteredError",
    "RemoteFunctionError",
    "UnregisteredFunction",
    "add_profile",
    "connect",
    "connection_info",
    "current_client",
    "debug_job",
    "diff_versions",
    "function_from_cell",
    "gpu_function",
    "gpu_profile",
    "gpu_usage",
    "list_gpu_classes",
    "list_jobs",
    "list_versions",
    "lookup",
    "profiles",
    "stop_local",
    "use_local",
    "version_history",
]
