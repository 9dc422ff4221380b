"""A function's registered versions, read from the control plane (runs in the kernel;
docs/ARCHITECTURE.md, "Function versions (wire rules)"): `version_history`, `diff_versions`, and the
version a ref names (`lookup` builds its handle from that)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lancefn_jupyter.kernel.client import Client, NotFound
from lancefn_jupyter.kernel.session import current_client
from lancefn_jupyter.wire.models import FunctionVersion

if TYPE_CHECKING:
    from lancefn_jupyter.wire.versions import VersionDiff, VersionHistory

__all__ = ["diff_versions", "live_versions", "pick_version", "version_history"]


def live_versions(client: Client, name: str) -> list[FunctionVersion]:
    """Live versions of `name` with definitions, registration order (oldest first)."""
    return [item.definition for item in client.functions.list(name, include_definition=True) if item.definition]


def pick_version(name: str, prefix: str | None, known: list[FunctionVersion]) -> FunctionVersion:
    """The version `prefix` names among `known` (None: the newest); raises the kernel's wording if none."""
    from lancefn_jupyter.wire.versions import resolve_version

    version = resolve_version(name, prefix, [fv.version for fv in known])
    return next(fv for fv in known if fv.version == version)


def version_history(name: str, *, limit: int = 50) -> VersionHistory:
    """`%gpu_versions NAME`: the newest `limit` versions, newest first, each with its one-line change
    and lookup snippet (one request: the control plane reads the artifacts)."""
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
    known = {fv.version: fv for fv in live_versions(client, name)}
    old_id, new_id = diff_pair(name, list(known), old, new)
    sources = [client.functions.artifact(name, v).decode("utf-8") for v in (old_id, new_id)]
    return diff(known[old_id], known[new_id], *sources)
