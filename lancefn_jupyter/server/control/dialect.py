"""LanceDB 0.40's dialect of the function catalog (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): its ``$``-joined
ids and namespace paths, its decimal versions, and its ``FunctionVersion`` shape, from what this server stores.

Pure: the catalog reads the store and hands the values in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lancefn_jupyter.server.policy.namespaces import visible
from lancefn_jupyter.wire.dataplane import struct_fields
from lancefn_jupyter.wire.models import FunctionSignature

__all__ = [
    "ARTIFACT_MEDIA_TYPE",
    "batch_event_row",
    "batch_udf",
    "decimal_version",
    "event_row",
    "job_row",
    "lancedb_version",
    "namespace_of",
    "namespace_path_of",
    "split_id",
    "version_position",
]

ARTIFACT_MEDIA_TYPE = "application/vnd.lancefn.python-callable.v1"
_MEDIA_TYPES = {"python_bundle": "application/vnd.lancefn.python-bundle.v1"}


def split_id(raw: str) -> tuple[tuple[str, ...], str]:
    """A ``$``-joined function or secret id: its namespace path and its name (``team$scale`` → ``(("team",),
    "scale")``; ``scale`` → ``((), "scale")``)."""
    *path, name = raw.split("$")
    return tuple(path), name


def namespace_of(path: tuple[str, ...], home: str, scope: str | None) -> str | None:
    """The namespace a LanceDB namespace path means for a caller whose own namespace is ``home``: the root (``()``) is
    the caller's own; a one-level path is that namespace when the caller may see it. None: another team's, a deeper
    path, or an empty segment, each answered exactly as a namespace that does not exist."""
    if not path:
        return home
    if len(path) == 1 and path[0] and visible(scope, path[0]):
        return path[0]
    return None


def namespace_path_of(raw: str) -> tuple[str, ...]:
    """A ``/v1/namespace/{ns}/...`` segment as a path: ``$`` is the root, else ``$``-joined parts."""
    return () if raw in ("", "$") else tuple(raw.split("$"))


def decimal_version(ids: list[str], vid: str) -> str:
    """``vid``'s LanceDB version: its position (from 1) among its name's versions in registration order."""
    return str(ids.index(vid) + 1)


def version_position(ids: list[str], version: str) -> str | None:
    """The version id a LanceDB ``version`` means: a decimal position, or one of our content ids as is; None if
    neither names one of ``ids``."""
    if version.isdigit() and version[0] != "0" and len(version) < 19:
        position = int(version)
        return ids[position - 1] if position <= len(ids) else None
    return version if version in ids else None


def object_id(namespace: str, name: str) -> str:
    """A function's stable object id: the same for all its versions, different across namespaces."""
    return "fn-" + hashlib.sha256(f"{namespace}\0{name}".encode()).hexdigest()[:24]


def lancedb_version(definition: dict, *, ids: list[str], namespace: str) -> dict[str, Any]:
    """A stored ``FunctionVersion`` (env values already redacted) in LanceDB 0.40's shape. Our content id and digests
    are in ``metadata`` (``lancefn.version`` is accepted wherever a version is); ``runtime`` rides along with 0.40's
    ``gpu`` marker on a GPU runtime, so 0.40's ``PythonRuntimeSpec`` parses it too."""
    name, vid = definition["name"], definition["version"]
    artifact = definition["artifact"]
    runtime = dict(definition["runtime"])
    if runtime.get("kind") == "python_v2":
        runtime["gpu"] = True
    return {
        "name": name,
        "namespace_path": [namespace],
        "object_id": object_id(namespace, name),
        "location": f"lancefn://{namespace}/functions/{name}",
        "version": decimal_version(ids, vid),
        "image": {
            "manifest_digest": artifact["digest"],
            "descriptor": {
                "mediaType": _MEDIA_TYPES.get(artifact["kind"], ARTIFACT_MEDIA_TYPE),
                "digest": artifact["digest"],
                "annotations": {"org.lancefn.entrypoint": artifact["entrypoint"], "org.lancefn.kind": artifact["kind"]},
            },
            "source": True,
        },
        "signature": definition["signature"],
        "secret_bindings": list(definition.get("secret_bindings", ())),
        "runtime": runtime,
        "created_at": definition["created_at"],
        "metadata": {
            "lancefn.version": vid,
            "lancefn.namespace": namespace,
            "lancefn.runtime_digest": definition["runtime_digest"],
            "lancefn.environment_digest": definition["environment_digest"],
            "lancefn.runtime": json.dumps(runtime, sort_keys=True, separators=(",", ":")),
        },
        "disabled": False,
    }


def batch_udf(signature: FunctionSignature, arrow: Mapping[str, str]) -> FunctionSignature | str:
    """A LanceDB 0.40 batch UDF (its entry annotates its parameters ``pa.Array``, or its one parameter
    ``pa.RecordBatch``: ``arrow`` names them, and ``"return"``, with their pyarrow type) as this server's batched
    signature: one call per chunk, each parameter the chunk's values as one Arrow array of the type its
    ``input_schema`` declares (form ``arrow``) or the RecordBatch of its struct's fields (form ``record_batch``), the
    result one Arrow array of ``output_schema``'s type (docs/ARCHITECTURE.md, "Batched functions"). A str: why it
    cannot run here, and what to do instead."""
    names = [parameter.name for parameter in signature.inputs]
    batches = [name for name in names if name in arrow]
    fix = "annotate every parameter pa.Array (a LanceDB batch UDF: one call per batch) or none (one call per row)"
    if not batches:
        return f"the entry returns pa.{arrow['return']} but takes one value per row; {fix}"
    tables = [name for name in batches if arrow[name] in ("RecordBatch", "Table")]
    if tables and (problem := _record_batch_problem(signature, tables[0], arrow[tables[0]])):
        return problem
    if len(batches) < len(names):
        rows = ", ".join(repr(name) for name in names if name not in arrow)
        return f"the entry takes {', '.join(repr(n) for n in batches)} as Arrow batches but {rows} per row; {fix}"
    if signature.output.kind != "scalar":
        return (
            f"a LanceDB batch UDF with a {signature.output.kind!r} output is not supported by this server yet; return "
            "one pa.Array of a scalar output_schema, or take one value per row"
        )
    form = "record_batch" if tables else "arrow"
    inputs = tuple(parameter.model_copy(update={"form": form}) for parameter in signature.inputs)
    output = signature.output.model_copy(update={"form": "arrow"})
    return signature.model_copy(update={"inputs": inputs, "output": output, "batched": True})


def _record_batch_problem(signature: FunctionSignature, name: str, kind: str) -> str | None:
    """Why a LanceDB batch UDF over a RecordBatch cannot run here (a sentence saying what to do), or None: it takes
    one ``pa.RecordBatch`` parameter whose ``input_schema`` field is a struct of the batch's columns, and each chunk
    is that struct column as a RecordBatch."""
    columns = f"pa.schema([pa.field({name!r}, pa.struct([pa.field('a', pa.float64()), ...]))])"
    if kind != "RecordBatch":
        return f"parameter {name!r} is a pa.{kind}; annotate it pa.RecordBatch (input_schema={columns})"
    if len(signature.inputs) > 1:
        others = ", ".join(repr(p.name) for p in signature.inputs if p.name != name)
        return (
            f"parameter {name!r} is a pa.RecordBatch beside {others}; a RecordBatch must be the only parameter (its "
            "columns the fields of its struct input_schema), or take each column as its own pa.Array parameter"
        )
    (parameter,) = signature.inputs
    if struct_fields(parameter.arrow_type) is None:
        return (
            f"parameter {name!r} is a pa.RecordBatch but its input_schema type is {parameter.arrow_type}, not a struct; "
            f"declare the batch's columns as a struct (input_schema={columns}), or take each column as its own "
            "pa.Array parameter"
        )
    return None


def job_row(job: dict[str, Any]) -> dict[str, Any]:
    """A job as ``POST /v1/jobs/list`` lists it: ours, and the names LanceDB 0.40's ``JobInfo`` reads (``state``,
    ``created_at_millis``, ``table``: the table a backfill writes, else "" as 0.40 reads a string)."""
    return {**job, "state": job["job_state"], "created_at_millis": job["creation_ms"], "table": job.get("table") or ""}


def event_row(seq: int, job: dict[str, Any]) -> dict[str, Any]:
    """One recorded job change (a job's wire form at that moment) as a row of LanceDB 0.40's ``Job.events()``."""
    state = job.get("job_state", "")
    at = job.get("finished_ms") if state in ("DONE", "FAILED", "CANCELLED", "TIMED_OUT") else None
    return {
        "seq": seq,
        "job_id": job.get("job_id", ""),
        "state": state,
        "updated_at_millis": at or job.get("started_ms") or job.get("creation_ms") or 0,
        "updated_by": "lancefn-server",
        "emitted_from": "control_plane",
        "emitted_by": (job.get("placement") or {}).get("node") or "lancefn-server",
        "claim_entity": None,
        "rows_processed": (job.get("progress") or {}).get("rows_done", 0),
    }


def batch_event_row(seq: int, batch_id: str, event: dict[str, Any]) -> dict[str, Any]:
    """One recorded change of a batch or backfill (``batches/store.py``'s ``batch_events``) as a row of LanceDB 0.40's
    ``Job.events()``, in a job's event columns: ``job_id`` the batch's id; a chunk's change names the chunk in
    ``emitted_by`` and its job in ``claim_entity``; ``updated_by`` says what changed it."""
    chunk = event.get("chunk")
    return {
        "seq": seq,
        "job_id": batch_id,
        "state": event["state"],
        "updated_at_millis": event["at_ms"],
        "updated_by": event["by"],
        "emitted_from": "control_plane" if chunk is None else "chunk",
        "emitted_by": "lancefn-server" if chunk is None else f"chunk {chunk}",
        "claim_entity": event.get("job_id"),
        "rows_processed": event["rows"],
    }
