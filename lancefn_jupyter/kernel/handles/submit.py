"""How a function's rows reach the control plane, for a job and for a batch (runs in the kernel;
docs/ARCHITECTURE.md, "Arrow data plane"): the `register=no` guard, then one of three transports: JSON rows
in the request, an Arrow table written into the embedded server's shared home (only its file name
travels), or the Arrow IPC bytes as the request body."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.kernel.client import Client, LancefnError
from lancefn_jupyter.kernel.session import shared_home
from lancefn_jupyter.wire import dataplane

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.handles.base import FunctionRef
    from lancefn_jupyter.wire.models import FunctionVersion
    from lancefn_jupyter.wire.models import Job as JobRecord

__all__ = ["create_batch", "registered_version", "run_job"]

# `functions/run` holds its reply up to this long so a quick job comes back finished in that one
# round trip; short, so a loop of submits of long jobs barely waits (a queued job answers at once).
_SUBMIT_WAIT_S = 0.02


def registered_version(function: FunctionRef) -> FunctionVersion:
    """The version to run (registering on first use); a `register=no` function is refused."""
    version = function.version
    if version is None:
        raise LancefnError(f"{function.name} was defined with register=no; call {function.name}.register() first")
    return version


def _arrow_upload(client: Client, table: Any) -> dict[str, Any]:
    """The keyword that carries an Arrow rows table: a file in the shared home, else the IPC bytes."""
    if (home := shared_home(client)) is not None:
        name = f"{uuid.uuid4().hex}.arrow"
        dataplane.write_ipc_file(home / "data" / "uploads" / name, table, durable=False)
        return {"rows_file": name}
    return {"arrow": dataplane.to_ipc_bytes(table)}


def run_job(
    client: Client,
    version: FunctionVersion,
    json_rows: list[dict[str, Any]] | None,
    table: Any,
    *,
    timeout_s: float | None,
    init: dict[str, Any] | None = None,
) -> tuple[str, JobRecord | None]:
    """Start one job over the rows (`json_rows`, else the Arrow `table`): (job id, its record when
    the reply carries it, which JSON rows' replies do)."""
    if json_rows is not None:
        snapshot = client.functions.run_job(
            version.name, version.version, json_rows, timeout_s=timeout_s, wait_s=_SUBMIT_WAIT_S, init=init
        )
        return snapshot.job_id, snapshot
    job_id = client.functions.run(
        version.name, version.version, None, timeout_s=timeout_s, init=init, **_arrow_upload(client, table)
    )
    return job_id, None


def create_batch(
    client: Client, version: FunctionVersion, json_chunks: list[list[dict[str, Any]]] | None, table: Any, **options: Any
) -> dict[str, Any]:
    """Create a batch: JSON rows per chunk, else one Arrow `table` with a record batch per chunk."""
    if json_chunks is not None:
        return client.batches.create(version.name, version.version, json_chunks, **options)
    return client.batches.create(version.name, version.version, None, **_arrow_upload(client, table), **options)
