"""`/v1/secret/*`: the key's namespace's secrets (docs/ARCHITECTURE.md, "Secrets"); values go in, and come back only
to the kernel's `.local()` of a function that binds them (`local_env`)."""

from __future__ import annotations

import builtins  # list() below shadows the type in annotations
from urllib.parse import quote

from lancefn_jupyter.kernel.client._http import Transport

__all__ = ["SecretsResource"]


class SecretsResource:
    def __init__(self, transport: Transport):
        self._t = transport

    def create(self, name: str, value: str) -> None:
        self._t.post(f"/v1/secret/{quote(name, safe='')}/create", {"value": value})

    def alter(self, name: str, value: str) -> None:
        self._t.post(f"/v1/secret/{quote(name, safe='')}/alter", {"value": value})

    def describe(self, name: str) -> dict:
        """``{name, created_at_millis, updated_at_millis}``."""
        return self._t.post(f"/v1/secret/{quote(name, safe='')}/describe", {})

    def drop(self, name: str) -> None:
        self._t.post(f"/v1/secret/{quote(name, safe='')}/drop", {})

    def list(self) -> builtins.list[str]:
        """Every secret's name in the key's namespace (following page tokens)."""
        names: builtins.list[str] = []
        params: dict[str, str] = {}
        while True:
            reply = self._t.get("/v1/namespace/$/secret/list", params=params)
            names += [item["name"] for item in reply["secrets"]]
            if not reply.get("page_token"):
                return names
            params = {"page_token": reply["page_token"]}

    def local_env(self, bindings: builtins.list[dict]) -> dict[str, str]:
        """The bound values by environment variable (``secret_bindings`` in wire form), for a ``.local()`` run only:
        kept in that run's environment, never shown or stored."""
        return dict(self._t.post("/v1/secrets/local_env", {"secret_bindings": bindings})["env"])
