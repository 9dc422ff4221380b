"""Who is calling, and what they may see: API keys, namespaces and ownership (docs/ARCHITECTURE.md,
"Namespaces").

Every API key belongs to one *namespace*; keys that share one are a team and share its functions
and jobs.  Each function version and job records its namespace.  A non-admin key's *scope* is its
namespace: anything outside it answers 404 exactly as an id that does not exist would.  The admin
key's scope is ``None`` (everything); its own work goes to :data:`DEFAULT_NAMESPACE`, which is also
where rows of a home created before namespaces existed belong.

Pure: parsing the ``--api-keys`` TOML and the visibility rules; the control plane applies them.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from lancefn_jupyter.server.policy.budgets import Budget

__all__ = [
    "ADMIN_NAME",
    "DEFAULT_NAMESPACE",
    "PRIVILEGES",
    "ApiKeyError",
    "Principal",
    "budgets",
    "gpu_caps",
    "load_api_keys",
    "queue_view",
    "visible",
]

PRIVILEGES = ("functions", "jobs", "system_usage")
DEFAULT_NAMESPACE = "default"
ADMIN_NAME = "admin"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ApiKeyError(Exception):
    """The --api-keys file is unusable; the message names the file and the entry."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: never carries the key itself, so it is safe to log."""

    name: str
    namespace: str
    privileges: frozenset[str]
    admin: bool = False
    max_gpus: int | None = None  # the namespace's cap on GPUs held at once, all classes together
    # Its daily budget (docs/ARCHITECTURE.md, "Budgets"): GPU-hours and cost per UTC day.
    max_gpu_hours_per_day: float | None = None
    max_cost_per_day: float | None = None

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


_NAME_RULE = "must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(_NAME_RULE)
    return value


def _key(value: Any) -> str:
    if not isinstance(value, str) or len(value) < 8 or not value.isprintable() or value.strip() != value:
        raise ValueError("must be a string of at least 8 printable characters")
    return value


def _privileges(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p in PRIVILEGES for p in value):
        raise ValueError(f"must be a list drawn from {', '.join(PRIVILEGES)}")
    return tuple(value)


def _max_gpus(value: Any) -> int | None:
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError("must be a whole number of GPUs >= 1 (the most this key's namespace may hold at once)")
    return value


def _budget(value: Any) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError("must be a number > 0 (per UTC day), e.g. max_gpu_hours_per_day = 24")
    return None if value is None else float(value)


def _admin(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


class _KeyEntry(BaseModel):
    """One ``[[api_keys]]`` table; each validator's message says what the field must be."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: Annotated[str, BeforeValidator(_key)]
    name: Annotated[str, BeforeValidator(_name)]
    namespace: Annotated[str | None, BeforeValidator(_name)] = None
    privileges: Annotated[tuple[str, ...], BeforeValidator(_privileges)] = ()
    admin: Annotated[bool, BeforeValidator(_admin)] = False
    max_gpus: Annotated[int | None, BeforeValidator(_max_gpus)] = None
    max_gpu_hours_per_day: Annotated[float | None, BeforeValidator(_budget)] = None
    max_cost_per_day: Annotated[float | None, BeforeValidator(_budget)] = None


def _entry_problem(error: ValidationError) -> str:
    """The first problem, as ``field 'x' <rule>`` (or how an entry looks)."""
    item = error.errors(include_url=False, include_input=False)[0]
    field = str(item["loc"][0]) if item["loc"] else ""
    if item["type"] == "extra_forbidden" or not field:
        return "an entry has 'key', 'name' and 'privileges', optionally 'namespace', 'admin' and 'max_gpus'"
    if item["type"] == "missing" and field == "name":
        return "field 'name' is required: a unique name for this key's holder, e.g. name = \"alice\""
    if item["type"] == "missing":
        return f"field {field!r} is required"
    return f"field {field!r} {item['msg'].removeprefix('Value error, ')}"


def _key_file_problem(path: str, st: os.stat_result) -> str | None:
    """Why the key file cannot be trusted (another user could read or change its keys), with the fix; or None.
    The file itself is checked (a symlink's target, as a mounted secret is)."""
    if st.st_uid != os.geteuid():
        return (
            f"{path}: the API key file is owned by uid {st.st_uid}, not by the server's user (uid {os.geteuid()}), "
            f"who could change its keys; fix it with: chown {os.geteuid()} {path} && chmod 600 {path}"
        )
    if st.st_mode & 0o077:
        return (
            f"{path}: the API key file is readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), "
            f"so other users, a job's worker among them, could read every key; fix it with: chmod 600 {path}"
        )
    return None


def load_api_keys(path: str) -> dict[str, Principal]:
    """``[[api_keys]] key, name, privileges, namespace?, admin?`` → ``{key: Principal}``.

    ``name`` is required and unique (logs and the admin say whose work it is without the key);
    ``namespace`` defaults to the key's ``name`` (a namespace of its own); ``max_gpus`` caps what the
    namespace holds at once (keys of one namespace that give it must agree; see ``gpu_caps``).
    """
    try:
        with open(path, "rb") as f:
            problem = _key_file_problem(path, os.fstat(f.fileno()))
            if problem:
                raise ApiKeyError(problem)
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ApiKeyError(f"{path}: API key file not found; fix the --api-keys path") from None
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ApiKeyError(f"{path}: cannot read API key file ({error})") from None
    if set(data) - {"api_keys"}:
        raise ApiKeyError(
            f"{path}: unknown top-level key {sorted(set(data) - {'api_keys'})[0]!r}; use [[api_keys]] tables"
        )
    entries = data.get("api_keys", [])
    if not isinstance(entries, list):
        raise ApiKeyError(f"{path}: 'api_keys' must be a list of [[api_keys]] tables")
    keys: dict[str, Principal] = {}
    names: set[str] = {ADMIN_NAME}
    for i, raw in enumerate(entries):
        where = f"{path}: api_keys[{i}]"
        if not isinstance(raw, dict):
            raise ApiKeyError(
                f"{where}: an entry has 'key', 'name' and 'privileges', optionally 'namespace', 'admin' and 'max_gpus'"
            )
        try:
            entry = _KeyEntry.model_validate(raw)
        except ValidationError as error:
            raise ApiKeyError(f"{where}: {_entry_problem(error)}") from None
        if entry.name in names:
            raise ApiKeyError(
                f"{where}: name {entry.name!r} is already used ({ADMIN_NAME!r} is the generated admin key's); pick a unique name"
            )
        if entry.key in keys:
            raise ApiKeyError(f"{where}: this key is listed twice")
        names.add(entry.name)
        namespace = entry.namespace or entry.name
        for other in keys.values():
            if (
                other.namespace == namespace
                and None not in (other.max_gpus, entry.max_gpus)
                and other.max_gpus != entry.max_gpus
            ):
                raise ApiKeyError(
                    f"{where}: max_gpus = {entry.max_gpus} but key {other.name!r} of namespace {namespace!r} says "
                    f"{other.max_gpus}; the cap is the namespace's: give one value"
                )
        for other in keys.values():
            for field in ("max_gpu_hours_per_day", "max_cost_per_day"):
                mine, theirs = getattr(entry, field), getattr(other, field)
                if other.namespace == namespace and None not in (mine, theirs) and mine != theirs:
                    raise ApiKeyError(
                        f"{where}: {field} = {mine:g} but key {other.name!r} of namespace {namespace!r} says "
                        f"{theirs:g}; the budget is the namespace's: give one value"
                    )
        keys[entry.key] = Principal(
            entry.name,
            namespace,
            frozenset(entry.privileges),
            admin=entry.admin,
            max_gpus=entry.max_gpus,
            max_gpu_hours_per_day=entry.max_gpu_hours_per_day,
            max_cost_per_day=entry.max_cost_per_day,
        )
    return keys


def budgets(principals: Iterable[Principal]) -> dict[str, Budget]:
    """Namespace → its daily budget (docs/ARCHITECTURE.md, "Budgets"); those without one absent."""
    found: dict[str, Budget] = {}
    for p in principals:
        if p.max_gpu_hours_per_day is not None or p.max_cost_per_day is not None:
            have = found.get(p.namespace, Budget())
            found[p.namespace] = Budget(
                have.gpu_hours if p.max_gpu_hours_per_day is None else p.max_gpu_hours_per_day,
                have.cost if p.max_cost_per_day is None else p.max_cost_per_day,
            )
    return found


def gpu_caps(principals: Iterable[Principal]) -> dict[str, int]:
    """Namespace → the most GPUs it may hold at once (docs/ARCHITECTURE.md, "Scheduling"); uncapped ones absent."""
    return {p.namespace: p.max_gpus for p in principals if p.max_gpus is not None}
