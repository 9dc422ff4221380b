"""Registered versions from any kernel or script: `lookup`, `version_history`, `diff_versions`
(docs/ARCHITECTURE.md, "Function versions (wire rules)")."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lancefn_jupyter.client import Client, LancefnError
from lancefn_jupyter.handles.function import GpuFunction, request_key
from lancefn_jupyter.options import build_options
from lancefn_jupyter.packaging import PackagedFunction
from lancefn_jupyter.session import _session, current_client
from lancefn_jupyter.wire.models import FunctionRegistrationRequest, FunctionVersion

if TYPE_CHECKING:
    from lancefn_jupyter.wire.versions import VersionDiff, VersionHistory

__all__ = ["diff_versions", "lookup", "version_history"]


def _registered_versions(client: Client, name: str) -> list[FunctionVersion]:
    """Live versions of `name` with definitions, registration order (oldest first)."""
    return [item.definition for item in client.functions.list(name, include_definition=True) if item.definition]


def _pick_version(name: str, prefix: str | None, known: list[FunctionVersion]) -> FunctionVersion:
    from lancefn_jupyter.wire.versions import resolve_version

    version = resolve_version(name, prefix, [fv.version for fv in known])
    return next(fv for fv in known if fv.version == version)


def _looked_up_stub(fv: FunctionVersion) -> Callable[..., Any]:
    """Stands in for the Python function, which lives in another process: it carries the signature
    (so `submit`/`map` bind arguments as usual) and says what to call instead."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise LancefnError(
            f"{fv.name}@{fv.version} was looked up from the control plane, so its Python function is not "
            f"in this process; call .local(...), .remote(...), .submit(...) or .map(...)"
        )

    stub.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in fv.signature.inputs]
    )
    stub.__name__ = stub.__qualname__ = fv.artifact.entrypoint
    return stub


def lookup(ref: str) -> GpuFunction:
    """A handle on a registered version from any kernel or script: `lookup("name")` (newest) or
    `lookup("name@1a2b3c")` (a unique version prefix of 6+ characters).

    It has `submit`, `map`, `remote`, `local`, `version`, `diff` and the card. Env values are secrets the
    control plane never returns: `.local()` takes each env name's value from this process's environment.
    """
    from lancefn_jupyter.wire.versions import parse_ref

    name, prefix = parse_ref(ref)
    client = current_client()
    fv = _pick_version(name, prefix, _registered_versions(client, name))
    source = client.functions.artifact(fv.name, fv.version)
    text = source.decode("utf-8")
    packaged = PackagedFunction(
        source=source,
        digest=fv.artifact.digest,
        entrypoint=fv.artifact.entrypoint,
        signature=fv.signature,
        line_map={i: i for i in range(1, text.count("\n") + 2)},  # the artifact is the user's text here
    )
    runtime, resources = fv.runtime, fv.runtime.resources
    environment = runtime.environment
    packages = tuple(environment.packages) if environment else ()
    options = build_options(
        name=fv.name,
        num_gpus=resources.num_gpus if resources else None,
        gpu_class=resources.gpu_class if resources else None,
        pip=packages if environment is None or environment.kind == "pip" else (),
        conda=packages if environment is not None and environment.kind == "conda" else (),
        conda_channels=tuple(environment.channels) if environment else (),
        image=environment.image if environment else None,
        python_version=runtime.python_version,
        env={key: os.environ[key] for key in (runtime.env or {}) if key in os.environ},
    )
    handle = GpuFunction(_looked_up_stub(fv), packaged, options, cell_source=text)
    handle._line_label = f"line {{}} of {fv.name}@{fv.version[:8]}'s source"
    # The registered request (env values redacted): `register()` finds the version here and sends nothing.
    handle._request = FunctionRegistrationRequest(
        name=fv.name, artifact=packaged.artifact_request(), signature=fv.signature, runtime=runtime
    )
    _session.registered[(client.url, request_key(handle._request))] = fv
    handle._version = fv
    return handle


def version_history(name: str, *, limit: int = 50) -> VersionHistory:
    """`%gpu_versions NAME`: the newest `limit` versions, newest first, each with its one-line change
    and lookup snippet (one request: the control plane reads the artifacts)."""
    from lancefn_jupyter.client import NotFound
    from lancefn_jupyter.wire.versions import HistoryRow, VersionHistory, resolve_version

    try:
        functions = current_client().functions.history(name, limit=limit)
    except NotFound:
        resolve_version(name, None, [])  # raises the kernel's wording: "no function named …"
    rows = [
        HistoryRow(name, r["version"], r.get("created_at", ""), r.get("change", ""), r.get("snippet", ""))
        for f in functions
        if f["name"] == name
        for r in f["versions"]
    ]
    return VersionHistory(name, rows)


def diff_versions(name: str, old: str | None = None, new: str | None = None) -> VersionDiff:
    """Source diff and runtime differences between two versions of `name`.

    Default: the newest version against the one before; with only `old`, `old` against the newest.
    Versions may be unique prefixes of 6+ characters.
    """
    from lancefn_jupyter.wire.versions import diff_pair
    from lancefn_jupyter.wire.versions import diff_versions as diff

    client = current_client()
    known = {fv.version: fv for fv in _registered_versions(client, name)}
    old_id, new_id = diff_pair(name, list(known), old, new)
    sources = [client.functions.artifact(name, v).decode("utf-8") for v in (old_id, new_id)]
    return diff(known[old_id], known[new_id], *sources)
