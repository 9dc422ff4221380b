"""Start, reuse and stop the embedded local control plane (like `ray.init()` with no address).

State lives under `$LANCEFN_HOME` (default: the per-user data dir). The running server writes
`server.json` (url, api key, pid; mode 0600). Any kernel, the Jupyter server extension and the CLI
reuse a live server from it; a dead or corrupt one is replaced. Two kernels racing to start one are
safe: the server holds a lock on its home, so the loser exits and we adopt the winner.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lancefn_jupyter.wire.homefs import home_problem, open_private, pid_alive, private_file_problem

__all__ = [
    "EmbeddedServerError",
    "ServerInfo",
    "default_home",
    "ensure_server",
    "prestart",
    "read_server_info",
    "stop_server",
]

SERVER_JSON = "server.json"
LOCK_FILE = "server.lock"
# The embedded server stops after this long with no kernel connected and no job pending or running (seconds;
# env LANCEFN_EMBEDDED_IDLE_S); the kernel starts it again on its next use (docs/ARCHITECTURE.md, "Embedded server
# idle exit").
EMBEDDED_IDLE_S = 1800.0
# Servers this process started and has not adopted yet, by home (see `prestart`).
_starting: dict[Path, subprocess.Popen] = {}


class EmbeddedServerError(RuntimeError):
    """The embedded control plane could not be started; the message says where its log is."""


@dataclass(frozen=True)
class ServerInfo:
    url: str
    api_key: str
    pid: int
    home: str
    version: str = ""
    executor: str = ""
    unix_socket: str | None = None  # its Unix socket, private to its user (docs/ARCHITECTURE.md, "Local clients")

    def __repr__(self) -> str:  # never show the key
        return f"ServerInfo(url={self.url!r}, pid={self.pid}, home={self.home!r}, executor={self.executor!r})"


def default_home() -> Path:
    env = os.environ.get("LANCEFN_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("lancefn-jupyter"))


def read_server_info(home: Path | None = None) -> ServerInfo | None:
    """The server recorded in `home`, or None if there is none or the file is unreadable/corrupt."""
    path = Path(home or default_home()) / SERVER_JSON
    try:
        data = json.loads(path.read_text())
        return ServerInfo(
            url=str(data["url"]),
            api_key=str(data["api_key"]),
            pid=int(data["pid"]),
            home=str(data.get("home", path.parent)),
            version=str(data.get("version", "")),
            executor=str(data.get("executor", "")),
            unix_socket=str(data["unix_socket"]) if data.get("unix_socket") else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _healthy(info: ServerInfo, timeout: float = 2.0) -> bool:
    if not pid_alive(info.pid):
        return False
    # The standard library, not httpx: on first use this runs before anything else needs an HTTP client.
    import http.client
    from urllib.parse import urlsplit

    url = urlsplit(info.url)
    if url.scheme != "http" or not url.hostname:
        return False  # an embedded server is plain HTTP on a local address; anything else is not ours
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    try:
        conn.request("GET", "/v1/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def prestart(home: Path | None = None) -> None:
    """Start the embedded server of `home` now, without waiting, unless one is recorded alive.

    The first `%%gpu_function` calls this before its own imports and packaging, so the server's
    start-up (mostly imports) overlaps the kernel's; `ensure_server` then adopts the process."""
    home = Path(home or default_home())
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    if home_problem(home) or home in _starting:
        return  # an unsafe home is refused, with its reason, by `ensure_server`
    info = read_server_info(home) if private_file_problem(home / SERVER_JSON) is None else None
    if info is not None and pid_alive(info.pid):
        return
    _starting[home] = _spawn(home, None)


def _spawn(home: Path, gpu_classes: str | None) -> subprocess.Popen:
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    # A same-user embedded server is yours alone: its workers run as you (even as root).
    command = [
        sys.executable,
        "-m",
        "lancefn_jupyter.server.cli",
        "--home",
        str(home),
        "--port",
        "0",
        "--worker-user",
        str(os.geteuid()),
        # Nothing idle holds resources: with no kernel connected and no job, it stops; the next use starts it again.
        "--idle-exit-s",
        os.environ.get("LANCEFN_EMBEDDED_IDLE_S", str(EMBEDDED_IDLE_S)),
    ]
    if gpu_classes:
        command += ["--gpu-classes", str(gpu_classes)]
    env = dict(os.environ)
    # The embedded server is ours, keyed by the home: never inherit a remote deployment's key.
    env.pop("LANCEFN_API_KEY", None)
    with os.fdopen(open_private(home / "server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as log:
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True
        )


def ensure_server(home: Path | None = None, *, gpu_classes: str | None = None, timeout: float = 60.0) -> ServerInfo:
    """A live embedded server for `home`: reuse the recorded one if healthy, else start a new one.

    A home others can write into is refused (its server.json could send our code and key anywhere),
    and a server.json that is not a private file of ours is not reused (the new server replaces it)."""
    home = Path(home or default_home())
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = home_problem(home)
    if problem:
        raise EmbeddedServerError(f"not using the embedded control plane's home: {problem}")
    started = _starting.pop(home, None)
    if started is not None and (gpu_classes or started.poll() is not None):
        started = None  # asked for another config, or it exited: start afresh below (and say why)
    info = read_server_info(home) if private_file_problem(home / SERVER_JSON) is None else None
    if started is None and info is not None and _healthy(info):
        return info
    log_path = home / "server.log"
    proc = started or _spawn(home, gpu_classes)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = read_server_info(home)
        # Our own process, or a concurrent starter that won the home's lock.
        if info is not None and (info.pid == proc.pid or proc.poll() is not None) and _healthy(info, 1.0):
            return info
        code = proc.poll()
        if code is not None and code != 2:
            break
        time.sleep(0.01)  # reading a small file: poll often, the server is ready within ~1 s
    code = proc.poll()
    what = f"exited with code {code}" if code is not None else f"did not start within {timeout:.0f}s"
    raise EmbeddedServerError(f"the embedded control plane {what}; its log is {log_path}" + _log_tail(log_path))


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n" + "\n".join(tail) if tail else ""


def stop_server(home: Path | None = None, *, timeout: float = 10.0) -> bool:
    """Stop the embedded server of `home` (SIGTERM, then SIGKILL). True if one was running.

    A stale server.json may name a pid that now belongs to an unrelated process: only a pid
    proven to be this home's server is signalled."""
    home = Path(home or default_home())
    info = read_server_info(home)
    if info is None or not pid_alive(info.pid) or not _is_home_server(info.pid, home):
        return False
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(info.pid):
            return True
        time.sleep(0.05)
    os.kill(info.pid, signal.SIGKILL)
    return True


def _is_home_server(pid: int, home: Path) -> bool:
    """Whether ``pid`` is the lancefn server of ``home``: its command line says so, or it holds
    the home's ``server.lock`` (the holder writes its pid there)."""
    import psutil

    home = home.resolve()
    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        argv = []
    if any(arg == "lancefn_jupyter.server.cli" or Path(arg).name == "lancefn-server" for arg in argv[:3]):
        served = Path(argv[argv.index("--home") + 1]) if "--home" in argv[:-1] else default_home()
        try:
            if served.expanduser().resolve() == home:
                return True
        except OSError:
            pass
    try:
        fd = os.open(home / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: by the pid written in it
            return os.read(fd, 32).strip() == str(pid).encode()
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False  # nobody holds it: no server runs on this home
    finally:
        os.close(fd)
