"""Where a namespace's backfills may read and write tables (docs/ARCHITECTURE.md, "Backfills", "Which tables").

The control plane opens a backfill's table itself (as its own OS user, root on a shared server), so a key
must not point it at another team's table: a server with keys in several namespaces only backfills tables
under its ``--table-roots``. A root is a directory (or an object-store prefix such as ``s3://bucket/teams``);
``{namespace}`` in it stands for the caller's namespace, so ``/data/{namespace}`` gives each team its own.
Pure: no I/O but ``os.path.realpath`` of local paths (the table's path cannot lead out of a root; what its
tree holds is checked, and its I/O done with the team's rights, by ``executors/table_agent.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TableRoots", "parse_table_roots"]

ENV_VAR = "LANCEFN_TABLE_ROOTS"


def _is_uri(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def _local(text: str) -> str:
    return os.path.realpath(text.removeprefix("file://"))


def parse_table_roots(text: str | None) -> tuple[str, ...]:
    """``--table-roots`` / ``LANCEFN_TABLE_ROOTS``: roots separated by commas; ValueError saying what to fix."""
    roots = tuple(part.strip() for part in (text or "").split(",") if part.strip())
    for root in roots:
        if not _is_uri(root) and not os.path.isabs(root.removeprefix("file://")):
            raise ValueError(f"--table-roots {root!r} is not an absolute path or an object-store URI (s3://…)")
        try:
            root.format(namespace="x")
        except (KeyError, IndexError, ValueError):
            raise ValueError(f"--table-roots {root!r}: the only placeholder a root may hold is {{namespace}}") from None
    return roots


@dataclass(frozen=True)
class TableRoots:
    """``roots``: the allowed roots; ``shared``: the server has keys in more than one namespace. A server
    that is not shared and names no roots backfills any table its user can open (a notebook's own server);
    a shared one with no roots backfills none until its operator names them. The admin key is the operator."""

    roots: tuple[str, ...] = ()
    shared: bool = False

    def problem(self, uri: str, namespace: str | None, *, admin: bool) -> str | None:
        """None if ``namespace`` may backfill the table at ``uri``; else a message saying what to do."""
        if admin or (not self.roots and not self.shared):
            return None
        if not self.roots:
            return (
                "this server is shared by several namespaces and names no --table-roots, so it backfills no table; "
                "ask its operator to start it with e.g. --table-roots '/data/{namespace}' and put your table there"
            )
        allowed = [root.format(namespace=namespace or "default") for root in self.roots]
        for root in allowed:
            if _is_uri(root) != _is_uri(uri):
                continue
            if _is_uri(root):
                if uri.rstrip("/").startswith(root.rstrip("/") + "/"):
                    return None
            else:
                base = _local(root)
                if os.path.commonpath([base, _local(uri)]) == base:
                    return None
        return (
            f"table_uri {uri!r} is outside the tables namespace {namespace!r} may backfill on this server "
            f"({', '.join(allowed)}); put the table under one of them"
        )

    def own_root(self, uri: str, namespace: str | None, *, admin: bool) -> str | None:
        """The real path of the local root holding ``uri`` (one ``problem`` allowed) when the backfill's table I/O
        must be done with the team's rights (a shared server, a namespace key, a local table: the table agent of
        the root's owner does it); None when the control plane does it itself, as before (a server of one
        namespace, the operator's key, an object-store URI)."""
        if admin or not self.shared or _is_uri(uri):
            return None
        table = _local(uri)
        for root in self.roots:
            text = root.format(namespace=namespace or "default")
            if not _is_uri(text):
                base = _local(text)
                if os.path.commonpath([base, table]) == base:
                    return base
        return None
