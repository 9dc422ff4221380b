"""Which control plane the Jupyter server extension proxies to: the one a kernel would use.

1. `LANCEFN_URL` (+ `LANCEFN_API_KEY`) in the Jupyter server's environment: a remote or shared
   deployment.
2. Otherwise the embedded local control plane of `$LANCEFN_HOME` (default: the per-user data dir),
   started if needed through `lancefn_jupyter.embedded.ensure_server` — the same server kernels
   reuse, so the panel and the notebook see the same jobs.

The key stays in this process: only `ControlPlaneTarget.public_dict()` (URL without key) ever
goes to the browser.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ControlPlaneTarget", "DiscoveryError", "discover", "redact_url"]


class DiscoveryError(RuntimeError):
    """No control plane could be found or started; the message says why."""


@dataclass(frozen=True)
class ControlPlaneTarget:
    url: str
    api_key: str | None
    embedded: bool
    source: str  # "env" | "embedded"

    def __repr__(self) -> str:  # never show the key
        return f"ControlPlaneTarget(url={self.url!r}, embedded={self.embedded}, source={self.source!r})"

    def public_dict(self) -> dict:
        return {"url": redact_url(self.url), "embedded": self.embedded, "source": self.source}


def redact_url(url: str) -> str:
    """The URL without any userinfo (`http://user:secret@host` → `http://host`)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _ensure_embedded(home: Path) -> tuple[str, str]:
    """Start or reuse the embedded control plane of `home`; returns (url, api_key). Blocking."""
    from lancefn_jupyter.embedded import ensure_server

    info = ensure_server(home=home)
    return info.url, info.api_key


def discover(
    env: Mapping[str, str] | None = None,
    *,
    ensure_embedded: Callable[[Path], tuple[str, str]] = _ensure_embedded,
) -> ControlPlaneTarget:
    """Resolve the control plane. Blocking (may start the embedded server): call it off the loop."""
    env = os.environ if env is None else env
    url = (env.get("LANCEFN_URL") or "").strip()
    if url:
        return ControlPlaneTarget(
            url=url.rstrip("/"), api_key=env.get("LANCEFN_API_KEY") or None, embedded=False, source="env"
        )
    home_env = (env.get("LANCEFN_HOME") or "").strip()
    if home_env:
        home = Path(home_env).expanduser()
    else:
        import platformdirs

        home = Path(platformdirs.user_data_dir("lancefn-jupyter"))
    try:
        embedded_url, api_key = ensure_embedded(home)
    except Exception as exc:  # the message (log path etc.) is shown in the panel
        raise DiscoveryError(f"could not start the embedded control plane in {home}: {exc}") from exc
    return ControlPlaneTarget(url=embedded_url.rstrip("/"), api_key=api_key, embedded=True, source="embedded")
