"""Who is calling, and what they may see: API keys, namespaces and ownership (docs/ARCHITECTURE.md,
"Namespaces").

Every API key belongs to one *namespace*; keys that share one are a team and share its functions
and jobs.  Each function version and job records its namespace.  A non-admin key's *scope* is its
namespace: anything outside it answers 404 exactly as an id that does not exist would.  The admin
key's scope is ``None`` (everything); its own work goes to :data:`DEFAULT_NAMESPACE`, which is also
where rows of a home created before namespaces existed belong.

Pure: parsing the ``--api-keys`` TOML and the visibility rules; the core applies them.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = [
    "ADMIN_NAME",
    "DEFAULT_NAMESPACE",
    "PRIVILEGES",
    "ApiKeyError",
    "Principal",
    "load_api_keys",
    "visible",
    "queue_view",
]

PRIVILEGES = ("functions", "jobs", "system_usage")
DEFAULT_NAMESPACE = "default"
ADMIN_NAME = "admin"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FIELDS = {"key", "privileges", "name", "namespace", "admin"}


class ApiKeyError(Exception):
    """The --api-keys file is unusable; the message names the file and the entry."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: never carries the key itself, so it is safe to log."""

    name: str
    namespace: str
    privileges: frozenset[str]
    admin: bool = False

    @property
    def scope(self) -> str | None:
        """The namespace this caller may see, or None for all (admin)."""
        return None if self.admin else self.namespace


def admin_principal() -> Principal:
    return Principal(ADMIN_NAME, DEFAULT_NAMESPACE, frozenset(PRIVILEGES), admin=True)


def visible(scope: str | None, namespace: str | None) -> bool:
    """Whether a caller with ``scope`` may see an item of ``namespace``."""
    return scope is None or scope == namespace


def queue_view(payload: Mapping[str, Any], owners: Mapping[str, str], scope: str | None) -> dict:
    """The ``queue`` event as a caller with ``scope`` sees it: positions count everyone's jobs, but
    another namespace's job shows as ``null`` (no id, hence no name or owner), and per-job maps
    keyed by job id (e.g. ``expected_start_ms``) keep only the caller's jobs."""
    if scope is None:
        return dict(payload)
    view: dict[str, Any] = {}
    for key, value in payload.items():
        if key == "classes":
            view[key] = {name: [i if owners.get(i) == scope else None for i in ids] for name, ids in value.items()}
        elif isinstance(value, Mapping):
            view[key] = {i: v for i, v in value.items() if owners.get(i) == scope}
        else:
            view[key] = value
    return view


def _check_name(value: Any, where: str, field: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ApiKeyError(
            f"{where}: field {field!r} must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return value


def load_api_keys(path: str) -> dict[str, Principal]:
    """``[[api_keys]] key, name, privileges, namespace?, admin?`` → ``{key: Principal}``.

    ``name`` is required and unique (logs and the admin say whose work it is without the key);
    ``namespace`` defaults to the key's ``name`` (a namespace of its own).
    """
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ApiKeyError(f"{path}: API key file not found; fix the --api-keys path") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ApiKeyError(f"{path}: cannot read API key file ({error})") from None
    if set(data) - {"api_keys"}:
        raise ApiKeyError(f"{path}: unknown top-level key {sorted(set(data) - {'api_keys'})[0]!r}; use [[api_keys]] tables")
    entries = data.get("api_keys", [])
    if not isinstance(entries, list):
        raise ApiKeyError(f"{path}: 'api_keys' must be a list of [[api_keys]] tables")
    keys: dict[str, Principal] = {}
    names: set[str] = {ADMIN_NAME}
    for i, entry in enumerate(entries):
        where = f"{path}: api_keys[{i}]"
        if not isinstance(entry, dict) or set(entry) - _FIELDS:
            raise ApiKeyError(f"{where}: an entry has 'key', 'name' and 'privileges', optionally 'namespace' and 'admin'")
        key, privileges = entry.get("key"), entry.get("privileges", [])
        if not isinstance(key, str) or len(key) < 8 or not key.isprintable() or key.strip() != key:
            raise ApiKeyError(f"{where}: field 'key' must be a string of at least 8 printable characters")
        if not isinstance(privileges, list) or not all(p in PRIVILEGES for p in privileges):
            raise ApiKeyError(f"{where}: field 'privileges' must be a list drawn from {', '.join(PRIVILEGES)}")
        if "name" not in entry:
            raise ApiKeyError(f"{where}: field 'name' is required: a unique name for this key's holder, e.g. name = \"alice\"")
        name = _check_name(entry["name"], where, "name")
        if name in names:
            raise ApiKeyError(f"{where}: name {name!r} is already used ({ADMIN_NAME!r} is the generated admin key's); pick a unique name")
        namespace = _check_name(entry.get("namespace", name), where, "namespace")
        admin = entry.get("admin", False)
        if not isinstance(admin, bool):
            raise ApiKeyError(f"{where}: field 'admin' must be true or false")
        if key in keys:
            raise ApiKeyError(f"{where}: this key is listed twice")
        names.add(name)
        keys[key] = Principal(name, namespace, frozenset(privileges), admin=admin)
    return keys
