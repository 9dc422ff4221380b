"""The kernel's connection state: which control plane it talks to, the one client for it, and the
one event listener that follows it (runs in the kernel; docs/ARCHITECTURE.md, "Client and API (kernel side)").

`connect`, `use_local`, `stop_local`, `current_client`, `connection_info` and the compute profiles
(`gpu_profile`, `add_profile`, `profiles`) live here (re-exported by `lancefn_jupyter.kernel.api`) so that
widgets and handles reach the current client without importing `api`. The session owns the kernel's
`EventListener` (`listener()`), handing it `chosen_client` as the client to follow, so the listener
never imports the session. One lock so concurrent threads (widgets, the listener) agree.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lancefn_jupyter.kernel.client import Client, Forbidden
from lancefn_jupyter.kernel.client.listener import EventListener
from lancefn_jupyter.kernel.options import ComputeProfile, build_profile
from lancefn_jupyter.wire.models import FunctionVersion, GpuClass

__all__ = [
    "ConnectionInfo",
    "add_profile",
    "chosen_client",
    "class_hardware",
    "connect",
    "connection_info",
    "current_client",
    "gpu_profile",
    "listener",
    "profiles",
    "registration_cache",
    "shared_home",
    "start_listener",
    "stop_listener",
    "stop_local",
    "use_local",
]


@dataclass(frozen=True)
class ConnectionInfo:
    """Which control plane this kernel talks to (never holds the API key)."""

    url: str
    embedded: bool
    home: str | None = None
    pid: int | None = None


class _Session:
    """Process-wide connection state; one lock so concurrent threads (widgets) agree."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.client: Client | None = None
        self.info: ConnectionInfo | None = None
        self.classes: dict[str, GpuClass] = {}
        # (url, sha256 of the canonical request) → version: an unchanged cell re-registers with no HTTP.
        self.registered: dict[tuple[str, str], FunctionVersion] = {}
        self.profiles: dict[str, ComputeProfile] = {}

    def replace(self, client: Client, info: ConnectionInfo) -> Client:
        with self.lock:
            if self.client is not None and self.client is not client:
                self.client.close()
            self.client, self.info = client, info
            self.classes = {}
            return client


_session = _Session()


def connect(
    url: str | None = None, api_key: str | None = None, *, home: str | None = None, unix_socket: str | None = None
) -> Client:
    """Connect to a control plane: `url` (with `api_key`, else `LANCEFN_API_KEY`), else `LANCEFN_URL`, else local.
    `unix_socket`: that server's Unix socket on this machine (its `server.json` says where), for quicker requests."""
    url = url or os.environ.get("LANCEFN_URL")
    if not url:
        return use_local(home)
    key = api_key if api_key is not None else os.environ.get("LANCEFN_API_KEY")
    client = Client(url, key, unix_socket=unix_socket)
    return _session.replace(client, ConnectionInfo(url=client.url, embedded=False))


def use_local(home: str | None = None) -> Client:
    """Use (starting it if needed) the embedded control plane under `home` (default `$LANCEFN_HOME`)."""
    from lancefn_jupyter.embedded import ensure_server

    home_path = Path(home) if home else None
    info = ensure_server(home_path)

    def recover() -> tuple[str, str]:
        # The embedded server died (killed, machine slept, `%lancefn stop` elsewhere): start it again.
        # Its state is in the home, so versions and jobs are all still there.
        fresh = ensure_server(home_path)
        _session.info = ConnectionInfo(url=fresh.url, embedded=True, home=fresh.home, pid=fresh.pid)
        return fresh.url, fresh.api_key

    client = Client(info.url, info.api_key, recover=recover, unix_socket=info.unix_socket)
    return _session.replace(client, ConnectionInfo(url=info.url, embedded=True, home=info.home, pid=info.pid))


def stop_local(home: str | None = None) -> bool:
    """Stop the embedded control plane (jobs and versions persist in its home)."""
    from lancefn_jupyter.embedded import stop_server

    with _session.lock:
        if _session.info is not None and _session.info.embedded and _session.client is not None:
            _session.client.close()
            _session.client, _session.info = None, None
        return stop_server(Path(home) if home else None)


def current_client() -> Client:
    """The client in use, connecting by the default rule on first use."""
    with _session.lock:
        if _session.client is None:
            connect()
        assert _session.client is not None
        return _session.client


def chosen_client() -> Client | None:
    """The client in use, or None while no control plane is chosen yet (never connects)."""
    return _session.client


def connection_info() -> ConnectionInfo | None:
    return _session.info


_listener: EventListener | None = None
_listener_lock = threading.Lock()
_atexit_registered = False


def listener() -> EventListener:
    """The kernel's one event listener (created, not started, on first use); it follows the client
    in use, so `%lancefn connect …` moves its stream to the new control plane."""
    global _listener
    with _listener_lock:
        if _listener is None:
            _listener = EventListener(chosen_client)
        return _listener


def start_listener() -> EventListener:
    """Start the kernel's listener if it is not running (widgets call this)."""
    global _atexit_registered
    started = listener().start()
    if not _atexit_registered:
        atexit.register(stop_listener)
        _atexit_registered = True
    return started


def stop_listener(timeout: float = 5.0) -> None:
    """Stop the kernel's listener threads (subscriptions stay; a new widget starts it again)."""
    if _listener is not None:
        _listener.stop(timeout)


def shared_home(client: Client) -> Path | None:
    """The embedded server's home when `client` talks to it: Arrow rows and results are then
    handed over as files in ``$HOME/data`` instead of bytes over HTTP (docs/ARCHITECTURE.md)."""
    info = _session.info
    if info is None or not info.embedded or not info.home or client is not _session.client:
        return None
    return Path(info.home)


def class_hardware(name: str | None) -> GpuClass | None:
    """Hardware of a class for display; None when unknown or the key may not list classes."""
    name = name or "default"
    with _session.lock:
        if name not in _session.classes:
            try:
                _session.classes = {c.name: c for c in current_client().gpu.classes()}
            except Forbidden:
                return None
        return _session.classes.get(name)


def gpu_profile(name: str, **options: Any) -> ComputeProfile:
    """Define (or replace) a reusable compute profile; `gpu_function(profile=name)` uses it."""
    return add_profile(build_profile(name, **options))


def add_profile(profile: ComputeProfile) -> ComputeProfile:
    """Define (or replace) a profile already built (what `%gpu_profile NAME key=value…` does)."""
    _session.profiles[profile.name] = profile
    return profile


def profiles() -> dict[str, ComputeProfile]:
    return dict(_session.profiles)


def registration_cache() -> dict[tuple[str, str], FunctionVersion]:
    """The versions this process registered or looked up, by (url, request key); the handles own its entries."""
    return _session.registered
