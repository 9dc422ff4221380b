"""``lancefn-server``: run the control plane for one home directory.

    lancefn-server [--home DIR] [--host 127.0.0.1] [--port 0] [--gpu-classes FILE]
                   [--executor local|ray] [--ray-address ADDR] [--api-keys FILE]
                   [--max-body-bytes N] [--max-artifact-bytes N] [--body-timeout-s S]
                   [--header-timeout-s S] [--limit-concurrency N] [--log-level warning]
                   [--worker-user USER] [--max-idle-workers N] [--max-idle-per-device-set N]

Env equivalents: ``LANCEFN_HOME``, ``LANCEFN_GPU_CLASSES``, ``LANCEFN_API_KEY``.

Startup order matters: lock the home (one server per home), validate config (exit 2 with
a readable message), bind the socket (so ``--port 0`` resolves to a real port), start
serving, and only then write ``server.json`` — its existence means "ready".  SIGTERM/SIGINT
stop gracefully: streams and long polls end, the executor shuts down, ``server.json`` is
removed.  After a SIGKILL a stale ``server.json`` may remain; its pid is dead and the lock
is free, which is how clients (and the next server) tell.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from .._homefs import home_problem, open_private, private_file_problem, write_private
from .._version import __version__

__all__ = ["main", "default_home", "SERVER_JSON", "LOCK_FILE", "API_KEY_FILE"]

SERVER_JSON = "server.json"
LOCK_FILE = "server.lock"
API_KEY_FILE = "api_key"  # the generated admin key, reused across restarts so clients keep working
EXIT_CONFIG = 2

log = logging.getLogger("lancefn.server")


def default_home() -> Path:
    """``$LANCEFN_HOME``, else the per-user data dir (``platformdirs``)."""
    if os.environ.get("LANCEFN_HOME"):
        return Path(os.environ["LANCEFN_HOME"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("lancefn-jupyter"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lancefn-server", description="lancefn control plane (REST API for GPU function versions and jobs)"
    )
    p.add_argument(
        "--home", help="state directory (SQLite, server.json, logs); default $LANCEFN_HOME or the per-user data dir"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: only this machine)")
    p.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    p.add_argument(
        "--gpu-classes", help="GPU class TOML config; default $LANCEFN_GPU_CLASSES, else NVML, else simulated"
    )
    p.add_argument("--executor", choices=("local", "ray"), default="local", help="where workers run (default local)")
    p.add_argument(
        "--ray-address",
        help="Ray cluster address for --executor ray (default: start a private local Ray; 'auto': the cluster on this machine or $RAY_ADDRESS; see docs/ray.md)",
    )
    p.add_argument(
        "--api-keys", help="TOML file of extra API keys with privileges ([[api_keys]] key=..., privileges=[...])"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest accepted request body (default 8 MiB, or enough for a --max-artifact-bytes artifact if larger)",
    )
    p.add_argument(
        "--max-artifact-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest accepted function artifact (default 4 MiB)",
    )
    p.add_argument(
        "--body-timeout-s",
        type=float,
        default=30.0,
        help="a request body must arrive within this many seconds (default 30)",
    )
    p.add_argument(
        "--header-timeout-s",
        type=float,
        default=10.0,
        help="a request's line and headers must arrive within this many seconds (default 10)",
    )
    p.add_argument(
        "--limit-concurrency",
        type=int,
        default=256,
        help="most connections and requests at once; more get 503 (default 256)",
    )
    p.add_argument(
        "--worker-user",
        default=os.environ.get("LANCEFN_WORKER_USER") or None,
        help="OS user local workers run as when the server runs as root (default: nobody; env LANCEFN_WORKER_USER); "
        "a non-root server runs workers as itself",
    )
    p.add_argument(
        "--max-idle-workers", type=int, default=16, help="local executor: idle warm workers kept in all (default 16)"
    )
    p.add_argument(
        "--max-idle-per-device-set",
        type=int,
        default=4,
        help="local executor: idle workers of distinct function versions kept per device set, least recently used retired first (default 4)",
    )
    p.add_argument(
        "--max-arrow-body-bytes",
        type=int,
        default=4 * 1024**3,
        help="largest accepted Arrow IPC rows body, streamed to disk (default 4 GiB)",
    )
    p.add_argument(
        "--result-max-age-days",
        type=float,
        default=7.0,
        help="Arrow result files older than this are removed (default 7)",
    )
    p.add_argument(
        "--result-max-bytes",
        type=int,
        default=5 * 1024**3,
        help="Arrow result files beyond this total are removed, oldest first (default 5 GiB)",
    )
    p.add_argument(
        "--result-fsync",
        action="store_true",
        help="fsync each Arrow result file before the job is DONE (survives power loss; slower)",
    )
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return p


def _fail(message: str) -> int:
    print(f"lancefn-server: {message}", file=sys.stderr, flush=True)
    return EXIT_CONFIG


def _refuse(message: str) -> int:
    """An unsafe home: exit 1, not EXIT_CONFIG, which clients read as "another server holds this home"."""
    print(f"lancefn-server: {message}", file=sys.stderr, flush=True)
    return 1


def _admin_key(home: Path) -> str:
    """The admin key; raises ``PermissionError`` (message says the fix) for an untrustworthy file."""
    if os.environ.get("LANCEFN_API_KEY"):
        return os.environ["LANCEFN_API_KEY"]
    path = home / API_KEY_FILE
    problem = private_file_problem(path)
    if problem:
        raise PermissionError(f"refusing the admin key file: {problem}")
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), encoding="utf-8") as f:
            key = f.read().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(32)
    write_private(path, key + "\n")
    return key


def _lock_home(home: Path) -> tuple[Any, str | None]:
    """Take ``server.lock``; returns (file, None) or (None, holder pid text)."""
    handle = os.fdopen(open_private(home / LOCK_FILE, os.O_RDWR | os.O_CREAT), "r+")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return None, holder
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle, None


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    home = Path(args.home).expanduser() if args.home else default_home()
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        return _fail(f"cannot create home directory {home}: {error}")
    home = home.resolve()
    problem = home_problem(home)
    if problem:
        return _refuse(problem)
    try:
        lock, holder = _lock_home(home)
    except OSError as error:  # e.g. a symlink planted at server.lock (never followed)
        return _refuse(f"cannot open {home / LOCK_FILE} ({error}); remove it and start again")
    if lock is None:
        return _fail(
            f"another lancefn-server (pid {holder}) is already using home {home}; stop it or pick another --home"
        )

    # Heavy imports after the cheap checks so a refused start is fast.
    import uvicorn

    from .app import DEFAULT_MAX_BODY_BYTES, ApiKeyError, create_app, load_api_keys
    from .core import ControlPlane
    from .datastore import DataStore
    from .executors import get_executor
    from .gpu_classes import ConfigError, load_gpu_classes
    from .namespaces import admin_principal
    from .store import DB_FILENAME, Store

    try:
        classes = load_gpu_classes(args.gpu_classes, executor=args.executor)
    except ConfigError as error:
        return _fail(f"invalid GPU class config: {error}")
    try:
        extra_keys = load_api_keys(args.api_keys) if args.api_keys else {}
    except ApiKeyError as error:
        return _fail(str(error))
    try:
        admin_key = _admin_key(home)
    except PermissionError as error:
        return _refuse(str(error))
    api_keys = {**extra_keys, admin_key: admin_principal()}

    try:
        # proto must be IPPROTO_TCP (not 0): asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP, and without it keep-alive responses stall ~40 ms on delayed ACKs.
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(2048)
    except OSError as error:
        return _fail(f"cannot listen on {args.host}:{args.port}: {error}")
    port = sock.getsockname()[1]
    url_host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{url_host}:{port}"

    if args.max_idle_workers < 0 or args.max_idle_per_device_set < 0:
        return _fail("--max-idle-workers and --max-idle-per-device-set must be >= 0")
    worker_user = None
    if args.executor == "local":
        from .executors.local import worker_base_env
        from .isolation import WorkerUserError, check_worker_user, resolve_worker_user

        try:
            worker_user = resolve_worker_user(args.worker_user)
        except WorkerUserError as error:
            return _fail(str(error))
        problem = check_worker_user(worker_user, worker_base_env(worker_user)) if worker_user else None
        if problem:
            return _fail(problem)
    try:
        executor = get_executor(
            args.executor,
            classes=classes,
            home=home,
            address=args.ray_address,
            worker_user=worker_user,
            max_idle_workers=args.max_idle_workers,
            max_idle_per_device_set=args.max_idle_per_device_set,
        )
    except Exception as error:  # e.g. ray not installed; say so instead of a traceback
        return _fail(f"cannot create the {args.executor!r} executor: {error}")

    try:
        store = Store(home / DB_FILENAME)
    except (sqlite3.Error, OSError) as error:
        full = shutil.disk_usage(home).free < (1 << 20)
        hint = (
            f"the disk holding {home} is full; free some space" if full else "check that the home directory is writable"
        )
        print(
            f"lancefn-server: cannot open the state database {home / DB_FILENAME} ({error}); {hint}",
            file=sys.stderr,
            flush=True,
        )
        return 1  # not EXIT_CONFIG: clients read 2 as "another server holds this home"
    data = DataStore(
        home, max_age_s=args.result_max_age_days * 86400, max_bytes=args.result_max_bytes, fsync=args.result_fsync
    )
    core = ControlPlane(store=store, classes=classes, executor=executor, version=__version__, data=data)
    # A maximum-size artifact travels base64-encoded (4/3 of its bytes) in a JSON body.
    max_body = args.max_body_bytes or max(DEFAULT_MAX_BODY_BYTES, args.max_artifact_bytes * 4 // 3 + (64 << 10))
    app = create_app(
        core,
        api_keys=api_keys,
        max_body_bytes=max_body,
        max_artifact_bytes=args.max_artifact_bytes,
        body_timeout_s=args.body_timeout_s,
        max_arrow_body_bytes=args.max_arrow_body_bytes,
    )
    server_json = home / SERVER_JSON
    info = {
        "url": url,
        "api_key": admin_key,
        "pid": os.getpid(),
        "home": str(home),
        "version": __version__,
        "executor": args.executor,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    info_text = json.dumps(info, indent=2) + "\n"
    info_bytes = info_text.encode("utf-8")
    failed_to_publish = False

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list | None = None) -> None:
            nonlocal failed_to_publish
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                try:
                    write_private(server_json, info_text)
                except OSError as error:  # e.g. a full disk, or a directory in the way
                    print(
                        f"lancefn-server: cannot write {server_json} ({error}); fix or free the home directory",
                        file=sys.stderr,
                        flush=True,
                    )
                    failed_to_publish = self.should_exit = True
                    return
                print(f"lancefn-server listening on {url}", flush=True)

        async def on_tick(self, counter: int) -> bool:
            # The lock holder is the only rightful writer of server.json: if it was deleted or
            # overwritten while we run, put it back so clients (which find us only through it) recover.
            if counter % 10 == 0 and self.started and not failed_to_publish:
                try:
                    current = server_json.read_bytes()
                except OSError:
                    current = None
                if current != info_bytes:
                    try:
                        write_private(server_json, info_text)
                        log.warning("%s was missing or changed; rewrote it", server_json)
                    except OSError:
                        pass  # e.g. the disk is full; tried again on the next tick
            return await super().on_tick(counter)

        async def shutdown(self, sockets: list | None = None) -> None:
            core.begin_shutdown()  # end SSE streams and long polls so they don't delay the stop
            await super().shutdown(sockets=sockets)

    from .connections import header_timeout_protocol

    config = uvicorn.Config(
        app,
        http=header_timeout_protocol(args.header_timeout_s),
        limit_concurrency=args.limit_concurrency,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    server = _Server(config)
    # uvicorn captures SIGTERM/SIGINT itself and re-raises them once it has stopped; make
    # that re-raise a no-op so our cleanup below runs and the exit code is 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        try:
            if server_json.exists() and json.loads(server_json.read_text()).get("pid") == os.getpid():
                server_json.unlink()
        except (OSError, ValueError):
            pass
        store.close()
        lock.close()
    return 0 if server.started and not failed_to_publish else 1


if __name__ == "__main__":
    sys.exit(main())
