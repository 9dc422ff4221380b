"""Secrets per namespace (docs/ARCHITECTURE.md, "Secrets"): create, alter, describe, list and drop them, check a
version's bindings, and hand a job's bound values to its environment. Runs in the control plane.

Values live in the server's database (``lancefn.sqlite3``, mode 0600 in the server's home: readable only by the
server's user) and in memory here; no reply, id, digest, event or log carries one. A job gets them as environment
variables, by the path its ``runtime.env`` values take (``TaskSpec.env``), so failure messages redact them too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from lancefn_jupyter.server.control.pages import clamp_limit, decode_token, encode_token
from lancefn_jupyter.server.control.states import now_ms
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.storage.store import Store
from lancefn_jupyter.wire.models import NAME_PATTERN, SecretBinding

__all__ = ["MAX_SECRET_BYTES", "SecretMissing", "SecretVault"]

MAX_SECRET_BYTES = 64 * 1024


class SecretMissing(Exception):
    """A job's bound secret does not exist (any more): it fails in phase ``environment`` with this message."""


@dataclass(frozen=True)
class _Secret:
    value: str
    created_ms: int
    updated_ms: int


def how_to_create(name: str) -> str:
    return f"create it with %gpu_secret {name} in a notebook, or db.create_secret({name!r}, value) with lancedb"


class SecretVault:
    """The secrets of every namespace, kept in memory and written through to the store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._secrets: dict[tuple[str, str], _Secret] = {
            (namespace, name): _Secret(value, created, updated)
            for namespace, name, value, created, updated in store.load_secrets()
        }

    # ----------------------------------------------------------------- requests

    def create(self, namespace: str, name: str, value: object) -> dict:
        checked = _checked(name, value)
        with self._lock:
            if (namespace, name) in self._secrets:
                raise ApiError(
                    409, f"secret {name!r} already exists; change its value with alter (db.alter_secret, %gpu_secret)"
                )
            now = now_ms()
            self.store.put_secret(namespace, name, checked, now, now)
            self._secrets[(namespace, name)] = _Secret(checked, now, now)
        return {"name": name}

    def alter(self, namespace: str, name: str, value: object) -> dict:
        """A new value: no version changes; the next job that binds it gets this one."""
        checked = _checked(name, value)
        with self._lock:
            old = self._get(namespace, name)
            now = now_ms()
            self.store.put_secret(namespace, name, checked, old.created_ms, now)
            self._secrets[(namespace, name)] = _Secret(checked, old.created_ms, now)
        return {"name": name}

    def describe(self, namespace: str, name: str) -> dict:
        """Its name and times, never its value."""
        secret = self._get(namespace, name)
        return {"name": name, "created_at_millis": secret.created_ms, "updated_at_millis": secret.updated_ms}

    def drop(self, namespace: str, name: str) -> dict:
        with self._lock:
            self._get(namespace, name)
            self.store.delete_secret(namespace, name)
            del self._secrets[(namespace, name)]
        return {"name": name, "dropped": True}

    def list(self, namespace: str, page_token: str | None, limit: int) -> dict:
        """Names in order, a page at a time (the token: how many came before)."""
        names = sorted(name for owner, name in self._secrets if owner == namespace)
        start, limit = decode_token(page_token) or 0, clamp_limit(limit)
        reply: dict = {"secrets": [{"name": name} for name in names[start : start + limit]]}
        if start + limit < len(names):
            reply["page_token"] = encode_token(start + limit)
        return reply

    # ----------------------------------------------------------------- bindings

    def binding_problem(self, namespace: str, bindings: Iterable[SecretBinding], env: Iterable[str]) -> str | None:
        """Why a registration's ``secret_bindings`` cannot be honoured here (a 400's message), or None."""
        variables: set[str] = set()
        for index, binding in enumerate(bindings):
            where = f"secret_bindings[{index}]"
            if binding.kind != "env" or binding.variable is None or binding.secret_ref is None:
                return f"{where}: only kind 'env' with a variable and a secret_ref is supported, e.g. EnvVarSecret('HF', 'HF_TOKEN')"
            ref = binding.secret_ref
            if ref.namespace_path not in ((), (namespace,)):
                return f"{where}: secret {ref.name!r} does not exist; {how_to_create(ref.name)}"
            if binding.variable in variables or binding.variable in env:
                return f"{where}: variable {binding.variable!r} is set twice; give each secret its own variable"
            variables.add(binding.variable)
            if (namespace, ref.name) not in self._secrets:
                return f"{where}: secret {ref.name!r} does not exist; {how_to_create(ref.name)}"
        return None

    def missing(self, namespace: str, bindings: Iterable[SecretBinding], then: str = "run the job again") -> str | None:
        """A job's failure message when a secret it binds is gone, or None."""
        for binding in bindings:
            assert binding.secret_ref is not None and binding.variable is not None  # checked at registration
            name = binding.secret_ref.name
            if (namespace, name) not in self._secrets:
                return (
                    f"secret {name!r} (bound to environment variable {binding.variable}) does not exist in namespace "
                    f"{namespace!r}; {how_to_create(name)}, then {then}"
                )
        return None

    def local_env(self, namespace: str, bindings: tuple[SecretBinding, ...]) -> dict[str, str]:
        """The values a function's bindings give its environment, for the kernel's ``.local()`` run of it with a key
        of ``namespace`` (the secrets' own): a 400 for a binding of another form or namespace, a 404 naming a
        missing secret and how to create it."""
        for index, binding in enumerate(bindings):
            ref = binding.secret_ref
            if binding.kind != "env" or binding.variable is None or ref is None:
                raise ApiError(400, f"secret_bindings[{index}]: only kind 'env' with a variable and a secret_ref")
            if ref.namespace_path not in ((), (namespace,)):
                raise ApiError(404, f"secret {ref.name!r} not found; {how_to_create(ref.name)}")
        with self._lock:
            problem = self.missing(namespace, bindings, then="run .local() again")
            if problem:
                raise ApiError(404, problem)
            return self.values(namespace, bindings)

    def values(self, namespace: str, bindings: Iterable[SecretBinding]) -> dict[str, str]:
        """A job's bound values by variable; :class:`SecretMissing` when one is gone."""
        bindings = tuple(bindings)
        problem = self.missing(namespace, bindings)
        if problem:
            raise SecretMissing(problem)
        return {b.variable: self._secrets[(namespace, b.secret_ref.name)].value for b in bindings}  # type: ignore[union-attr,misc]

    def _get(self, namespace: str, name: str) -> _Secret:
        secret = self._secrets.get((namespace, name))
        if secret is None:
            raise ApiError(404, f"secret {name!r} not found; {how_to_create(name)}")
        return secret


def _checked(name: str, value: object) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise ApiError(400, f"secret name {name!r} is invalid; use letters, digits, '_', '.', '-', e.g. 'HF_TOKEN'")
    if not isinstance(value, str) or not value:
        raise ApiError(400, 'the secret\'s value must be a non-empty string: send {"value": "..."}')
    if len(value.encode("utf-8")) > MAX_SECRET_BYTES:
        raise ApiError(400, f"the secret's value is over {MAX_SECRET_BYTES} bytes; store a shorter token")
    return value
