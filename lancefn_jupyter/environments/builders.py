"""Whom an environment is built as, and what its build's processes see (docs/ARCHITECTURE.md, "Environments"), pure.

A build runs package code (PEP 517 backends of sdists, ``.pth`` files when its Python is checked), so a root server
builds as the user the environment's workers run as (:class:`BuildUser`), never as itself. uv's configuration
files are never read (``UV_NO_CONFIG``): only pip's settings the server maps (``pipconf.py``) and the ``UV_*``
variables of the server's own environment apply, and those are part of the cache key (:func:`uv_variables`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BuildUser", "build_environment", "uv_variables"]


@dataclass(frozen=True)
class BuildUser:
    """Another uid than the server's: a build runs as it, with its gid and no supplementary groups."""

    uid: int
    gid: int


# What a build run as another user gets of the server's environment: what uv and Python need to run, fetch and
# verify (the locale, certificates, proxies) and the operator's uv settings; no tokens, nothing else of the server's.
_PASSED = frozenset(
    {"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "SSL_CERT_FILE", "SSL_CERT_DIR"}
    | {name for proxy in ("http", "https", "no", "all") for name in (f"{proxy}_proxy", f"{proxy.upper()}_PROXY")}
)
_PASSED_PREFIXES = ("LC_", "UV_")
_DROPPED = frozenset({"UV_CONFIG_FILE"})  # no configuration file at all, named or found
# Set by the server for each build, or changing how a build goes rather than what it installs: not in the key.
_NOT_KEYED = frozenset(
    {
        "UV_CACHE_DIR",
        "UV_LINK_MODE",
        "UV_NO_CONFIG",
        "UV_NO_PROGRESS",
        "UV_HTTP_TIMEOUT",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_CONCURRENT_BUILDS",
        "UV_CONCURRENT_INSTALLS",
    }
)


def build_environment(
    server_env: Mapping[str, str], settings_env: Mapping[str, str], user: BuildUser | None, uv_cache: str | None
) -> dict[str, str]:
    """The environment of a build's uv and check processes (``HOME`` and ``TMPDIR`` of another user are its
    private directory, set per build). ``settings_env``: what pip's settings map to; ``uv_cache``: the user's own
    uv cache (another user only)."""
    if user is None:
        env = dict(server_env)  # the server's own user: a same-user server is yours alone
    else:
        env = {
            name: value for name, value in server_env.items() if name in _PASSED or name.startswith(_PASSED_PREFIXES)
        }
    for name in _DROPPED:
        env.pop(name, None)
    env.update(settings_env)
    env.update(UV_NO_CONFIG="1", PYTHONSAFEPATH="1")
    if user is not None:
        # copy: the sealed environment shares no inode with the cache its builder may still write
        env.update(UV_CACHE_DIR=uv_cache or "", UV_LINK_MODE="copy")
    return env


def uv_variables(server_env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``UV_*`` variables of the server's environment that can change what a build installs (an index, a
    resolution strategy, an exclusion date): part of the cache key, so a change never reuses an environment."""
    return sorted(
        (name, value)
        for name, value in server_env.items()
        if name.startswith("UV_") and name not in _NOT_KEYED and name not in _DROPPED
    )
