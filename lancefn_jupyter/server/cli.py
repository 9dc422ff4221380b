"""``lancefn-server``: run the control plane for one home directory.

    lancefn-server [--home DIR] [--host 127.0.0.1] [--port 0] [--unix-socket PATH|off] [--gpu-classes FILE]
                   [--executor NAME] [--api-keys FILE]
                   [--max-body-bytes N] [--max-artifact-bytes N] [--body-timeout-s S]
                   [--header-timeout-s S] [--limit-concurrency N] [--max-idle-per-peer N]
                   [--max-bodies-per-key N] [--max-bodies-per-peer N] [--max-streams-per-key N]
                   [--max-streams-per-peer N] [--max-requests-per-key N] [--log-level warning]
                   [--worker-user USER] [--worker-max-rss-mb MB]
                   [--env-cache DIR] [--env-cache-max-bytes N] [--allow-direct-references] [--max-job-run-s S]
                   [--max-queued-jobs-per-namespace N] [--max-queued-chunks-per-namespace N]
                   [--max-batches-per-namespace N]
                   [the executors' own flags: local's --worker-uids FIRST-LAST, --worker-max-procs N,
                    --max-idle-workers N, --max-idle-per-device-set N; ray's --ray-address ADDR; …]

Env equivalents: ``LANCEFN_HOME``, ``LANCEFN_GPU_CLASSES``, ``LANCEFN_API_KEY``, ``LANCEFN_ENV_CACHE``,
``LANCEFN_ENV_CACHE_MAX_BYTES``, ``LANCEFN_WORKER_USER``, ``LANCEFN_WORKER_UIDS``,
``LANCEFN_ALLOW_DIRECT_REFERENCES``, ``LANCEFN_MAX_JOB_RUN_S``, ``LANCEFN_MAX_QUEUED_JOBS_PER_NAMESPACE``,
``LANCEFN_MAX_QUEUED_CHUNKS_PER_NAMESPACE``, ``LANCEFN_MAX_BATCHES_PER_NAMESPACE``.

``--executor NAME`` names an executor registered under the entry-point group ``lancefn.executors``
(``server/executors/plugins.py``: local, ray, and any an installed distribution adds); each adds its own flags.

Startup order matters (``main``, one step per function): lock the home (one server per home),
validate config (exit 2 with a readable message), bind the socket (so ``--port 0`` resolves to a
real port), then import and build the executor, store and app, start serving, and only then write
``server.json`` — its existence means "ready".  The local executor's spare workers start a moment later
(``local_plugin.PREWARM_DELAY_S``).  SIGTERM/SIGINT
stop gracefully: streams and long polls end, the executor shuts down, ``server.json`` is
removed.  After a SIGKILL a stale ``server.json`` may remain; its pid is dead and the lock
is free, which is how clients (and the next server) tell.

Over 600 lines: one concern, the command line (flags, their checks and help, and the process's start and
stop); the executors' own flags come from their plug-ins (``executors/plugins.py``)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import math
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

from lancefn_jupyter._version import __version__
from lancefn_jupyter.wire.homefs import home_problem, open_private, private_file_problem, write_private

__all__ = ["API_KEY_FILE", "LOCK_FILE", "SERVER_JSON", "UNIX_SOCKET", "default_home", "main"]

SERVER_JSON = "server.json"
UNIX_SOCKET = "server.sock"  # in the home, unless --unix-socket says otherwise
LOCK_FILE = "server.lock"
API_KEY_FILE = "api_key"  # the generated admin key, reused across restarts so clients keep working
# The secret env values are keyed with in version ids and runtime digests (docs/ARCHITECTURE.md, "Function
# versions"): kept, so a version's id stays the same across restarts; never sent anywhere.
DIGEST_KEY_FILE = "digest_key"
EXIT_CONFIG = 2

log = logging.getLogger("lancefn.server")


def default_home() -> Path:
    """``$LANCEFN_HOME``, else the per-user data dir (``platformdirs``)."""
    if os.environ.get("LANCEFN_HOME"):
        return Path(os.environ["LANCEFN_HOME"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("lancefn-jupyter"))


# Numeric tuning flags: (flag, type, default, help). Each is `--flag N` with that default.
_NUMERIC_FLAGS: tuple[tuple[str, type, Any, str], ...] = (
    (
        "--max-body-bytes",
        int,
        None,
        "largest accepted request body (default 8 MiB, or enough for a --max-artifact-bytes artifact if larger)",
    ),
    ("--max-artifact-bytes", int, 4 * 1024 * 1024, "largest accepted function artifact (default 4 MiB)"),
    ("--body-timeout-s", float, 30.0, "a request body must arrive within this many seconds (default 30)"),
    (
        "--header-timeout-s",
        float,
        10.0,
        "a request's line and headers must arrive within this many seconds (default 10)",
    ),
    (
        "--limit-concurrency",
        int,
        256,
        "most requests in progress at once; more get 503, never /v1/health (default 256)",
    ),
)
# Per-client caps (docs/ARCHITECTURE.md, "REST details", the limits): (flag, ``ClientCaps`` field, help). A peer is a
# client's address and, on this machine, the user owning the client's socket.
_CLIENT_CAP_FLAGS: tuple[tuple[str, str, str], ...] = (
    (
        "--max-idle-per-peer",
        "idle_per_peer",
        "kept-alive connections a peer holds between requests; its next one past this closes its oldest",
    ),
    (
        "--max-bodies-per-key",
        "bodies_per_key",
        "request bodies an API key has being received at once (and large registrations waiting for their "
        "syntax check); more get 429",
    ),
    ("--max-bodies-per-peer", "bodies_per_peer", "request bodies a peer has being received at once; more get 429"),
    ("--max-streams-per-key", "streams_per_key", "event streams an API key has open at once; more get 429"),
    ("--max-streams-per-peer", "streams_per_peer", "event streams a peer has open at once; more get 429"),
    (
        "--max-requests-per-key",
        "requests_per_key",
        "requests an API key has in progress at once (long polls and streams included); more get 429",
    ),
)
# What every executor's workers honour (its own flags are its plug-in's: ``add_options``).
_WORKER_FLAGS: tuple[tuple[str, type, Any, str], ...] = (
    (
        "--worker-max-rss-mb",
        float,
        None,
        "a worker whose resident memory after a job exceeds this many MiB is retired, not reused (default: no limit)",
    ),
)
_DATA_FLAGS: tuple[tuple[str, type, Any, str], ...] = (
    (
        "--max-arrow-body-bytes",
        int,
        4 * 1024**3,
        "largest accepted Arrow IPC rows body, streamed to disk (default 4 GiB)",
    ),
    (
        "--max-arrow-result-bytes",
        int,
        4 * 1024**3,
        "largest accepted Arrow result of one job; a larger one fails the job in phase result (default 4 GiB)",
    ),
    ("--result-max-age-days", float, 7.0, "Arrow result files older than this are removed (default 7)"),
    (
        "--result-max-bytes",
        int,
        5 * 1024**3,
        "Arrow result files beyond this total are removed, oldest first (default 5 GiB)",
    ),
    (
        "--log-max-bytes",
        int,
        1024**3,
        "job logs (all jobs together) beyond this many bytes are removed, oldest jobs' first (default 1 GiB)",
    ),
)
# The server-wide limits (docs/ARCHITECTURE.md, "Scheduling", "Batches"): (flag, env var, type, help); a value of 0
# means no limit. Defaults: policy/limits.py (the run time's only on a server whose keys name several namespaces).
_LIMIT_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    (
        "--max-job-run-s",
        "LANCEFN_MAX_JOB_RUN_S",
        float,
        "the longest a job may run: a job without timeout_s gets it, a longer timeout_s is refused (default 86400, "
        "a day, on a server whose keys name several namespaces, else no limit; 0: no limit)",
    ),
    (
        "--max-queued-jobs-per-namespace",
        "LANCEFN_MAX_QUEUED_JOBS_PER_NAMESPACE",
        int,
        "unfinished jobs (not a batch's chunks) a namespace may have at once; more are refused with 429 "
        "(default 20000; 0: no limit)",
    ),
    (
        "--max-queued-chunks-per-namespace",
        "LANCEFN_MAX_QUEUED_CHUNKS_PER_NAMESPACE",
        int,
        "chunks a namespace's unfinished batches and backfills may hold in all; a batch past it is refused with 429 "
        "(default 100000; 0: no limit)",
    ),
    (
        "--max-batches-per-namespace",
        "LANCEFN_MAX_BATCHES_PER_NAMESPACE",
        int,
        "unfinished batches and backfills a namespace may have at once; more are refused with 429 "
        "(default 1000; 0: no limit)",
    ),
)


def _parser() -> argparse.ArgumentParser:
    from lancefn_jupyter.server.executors.plugins import add_options, registered

    p = argparse.ArgumentParser(
        prog="lancefn-server", description="lancefn control plane (REST API for GPU function versions and jobs)"
    )
    p.add_argument(
        "--home", help="state directory (SQLite, server.json, logs); default $LANCEFN_HOME or the per-user data dir"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: only this machine)")
    p.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default)")
    p.add_argument(
        "--unix-socket",
        default=None,
        metavar="PATH|off",
        help="also serve on this Unix socket, private to the server's user, for clients on this machine (the "
        "embedded server's notebooks); default <home>/server.sock, 'off' for none (docs/ARCHITECTURE.md, \"Local "
        'clients")',
    )
    p.add_argument(
        "--gpu-classes", help="GPU class TOML config; default $LANCEFN_GPU_CLASSES, else NVML, else simulated"
    )
    p.add_argument(
        "--executor",
        choices=tuple(registered()),
        default="local",
        help="where workers run: an executor registered under the entry-point group lancefn.executors (default local)",
    )
    p.add_argument(
        "--api-keys", help="TOML file of extra API keys with privileges ([[api_keys]] key=..., privileges=[...])"
    )
    p.add_argument(
        "--idle-exit-s",
        type=float,
        default=0.0,
        metavar="S",
        help="stop the server once it has had no connection (no kernel's event stream, no request) and no job pending "
        "or running for S seconds (default 0: never; the embedded server runs with 1800: 30 minutes)",
    )
    for flag, kind, default, text in _NUMERIC_FLAGS:
        p.add_argument(flag, type=kind, default=default, help=text)
    from lancefn_jupyter.server.http.caps import ClientCaps  # plain bookkeeping: a cheap import

    defaults = ClientCaps()
    for flag, field, text in _CLIENT_CAP_FLAGS:
        p.add_argument(flag, type=int, default=getattr(defaults, field), help=f"{text} (default %(default)s)")
    p.add_argument(
        "--worker-user",
        default=os.environ.get("LANCEFN_WORKER_USER") or None,
        help="OS user local workers run as when the server runs as root (default: a uid per namespace from "
        "60600-60855 when the keys name several namespaces, else nobody; env LANCEFN_WORKER_USER); a non-root server "
        "runs workers as itself. Versions' environments are built as that user too, and with --executor ray the "
        "control plane resolves their packages as it",
    )
    for flag, kind, default, text in _WORKER_FLAGS + _DATA_FLAGS:
        p.add_argument(flag, type=kind, default=default, help=text)
    for flag, env, _kind, text in _LIMIT_FLAGS:
        p.add_argument(flag, help=f"{text}; env {env}")
    p.add_argument(
        "--env-cache",
        help="where versions' Python environments are built and kept (default $LANCEFN_ENV_CACHE, else "
        "/var/cache/lancefn/envs for a root server whose workers run as another user, else ~/.cache/lancefn/envs)",
    )
    p.add_argument(
        "--env-cache-max-bytes",
        help="environments nobody uses are removed, least recently used first, beyond this many bytes "
        "(default $LANCEFN_ENV_CACHE_MAX_BYTES, else 20 GiB)",
    )
    p.add_argument(
        "--allow-direct-references",
        action="store_true",
        default=os.environ.get("LANCEFN_ALLOW_DIRECT_REFERENCES", "").strip().lower() in ("1", "true", "yes", "on"),
        help="accept pip entries 'NAME @ URL' (local paths, file://, VCS and archive URLs) on a server whose keys span "
        "several namespaces (built as the namespace's worker user like any package); a server of one namespace always "
        "accepts them (env LANCEFN_ALLOW_DIRECT_REFERENCES)",
    )
    p.add_argument(
        "--result-fsync",
        action="store_true",
        help="fsync each Arrow result file before the job is DONE (survives power loss; slower); results are then "
        "written to the home directly, never staged in memory first",
    )
    p.add_argument(
        "--table-roots",
        default=os.environ.get("LANCEFN_TABLE_ROOTS") or None,
        help="directories (or object-store prefixes), comma-separated, under which backfills may open tables; "
        "{namespace} stands for the caller's, e.g. '/data/{namespace}' (env LANCEFN_TABLE_ROOTS; default: any table "
        "for a server whose keys are all in one namespace, none for a shared one)",
    )
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    add_options(p)
    return p


class _Refused(Exception):
    """A start-up step could not go on: the message is printed and the process exits with `code`.

    EXIT_CONFIG (2) is for bad configuration and a home held by another server (clients read 2 as
    "another server holds this home"); 1 is for an unsafe home or state that cannot be opened."""

    def __init__(self, message: str, code: int = EXIT_CONFIG):
        super().__init__(message)
        self.code = code


def _admin_key(home: Path) -> str:
    """The admin key; raises ``PermissionError`` (message says the fix) for an untrustworthy file."""
    if os.environ.get("LANCEFN_API_KEY"):
        return os.environ["LANCEFN_API_KEY"]
    return _home_secret(home / API_KEY_FILE, "admin key")


def _home_secret(path: Path, what: str) -> str:
    """The secret kept in the home's private file ``path``, generated on first start and reused; raises
    ``PermissionError`` (message says the fix) for an untrustworthy file."""
    problem = private_file_problem(path)
    if problem:
        raise PermissionError(f"refusing the {what} file: {problem}")
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), encoding="utf-8") as f:
            secret = f.read().strip()
        if secret:
            return secret
    except FileNotFoundError:
        pass
    secret = secrets.token_urlsafe(32)
    write_private(path, secret + "\n")
    return secret


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


def _plugin(name: str) -> Any:
    """Step 1 too: the plug-in of ``--executor`` (its default, ``local``, is not checked by argparse)."""
    from lancefn_jupyter.server.executors.plugins import GROUP, registered

    plugins = registered()
    if name not in plugins:
        raise _Refused(
            f"no executor is registered as {name!r} (entry-point group {GROUP}: {', '.join(plugins) or 'none'}); "
            "reinstall lancefn-jupyter (pip install -e . in a checkout) so its metadata lists its executors"
        )
    return plugins[name]


def _claim_home(args: argparse.Namespace) -> tuple[Path, Any]:
    """Step 1: the home directory, checked and locked (one server per home)."""
    home = Path(args.home).expanduser() if args.home else default_home()
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise _Refused(f"cannot create home directory {home}: {error}") from None
    home = home.resolve()
    problem = home_problem(home)
    if problem:
        raise _Refused(problem, 1)
    try:
        lock, holder = _lock_home(home)
    except OSError as error:  # e.g. a symlink planted at server.lock (never followed)
        raise _Refused(f"cannot open {home / LOCK_FILE} ({error}); remove it and start again", 1) from None
    if lock is None:
        raise _Refused(
            f"another lancefn-server (pid {holder}) is already using home {home}; stop it or pick another --home"
        )
    return home, lock


def _load_config(args: argparse.Namespace, home: Path, plugin: Any) -> tuple[Any, dict[str, Any], str, bytes]:
    """Step 2: GPU classes (checked with the executor's plug-in's class rules) and API keys (the admin key,
    generated on first start, plus --api-keys), and the home's digest key."""
    from lancefn_jupyter.server.policy.gpu_classes import ConfigError, load_gpu_classes
    from lancefn_jupyter.server.policy.namespaces import ApiKeyError, admin_principal, load_api_keys

    try:
        classes = load_gpu_classes(args.gpu_classes, rules=plugin)
    except ConfigError as error:
        raise _Refused(f"invalid GPU class config: {error}") from None
    try:
        extra_keys = load_api_keys(args.api_keys) if args.api_keys else {}
    except ApiKeyError as error:
        raise _Refused(str(error)) from None
    try:
        admin_key = _admin_key(home)
        digest_key = _home_secret(home / DIGEST_KEY_FILE, "digest key").encode("ascii")
    except PermissionError as error:
        raise _Refused(str(error), 1) from None
    return classes, {**extra_keys, admin_key: admin_principal()}, admin_key, digest_key


def _shared(api_keys: dict[str, Any]) -> bool:
    """Whether the keys name several namespaces (teams): such a server's defaults keep them apart."""
    return len({p.namespace for p in api_keys.values()}) > 1


def _table_roots(args: argparse.Namespace, api_keys: dict[str, Any]) -> Any:
    """Where backfills may open tables: ``--table-roots``, and whether keys span several namespaces."""
    from lancefn_jupyter.server.policy.table_roots import TableRoots, parse_table_roots

    try:
        roots = parse_table_roots(args.table_roots)
    except ValueError as error:
        raise _Refused(str(error)) from None
    return TableRoots(roots, shared=_shared(api_keys))


def _listen(host: str, port: int) -> tuple[socket.socket, str]:
    """Step 3: bind the socket now, so ``--port 0`` resolves to a real port; returns it and the URL."""
    try:
        # proto must be IPPROTO_TCP (not 0): asyncio only sets TCP_NODELAY on accepted sockets whose
        # proto says TCP, and without it keep-alive responses stall ~40 ms on delayed ACKs.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        raise _Refused(f"cannot listen on {host}:{port}: {error}") from None
    url_host = f"[{host}]" if ":" in host else host
    return sock, f"http://{url_host}:{sock.getsockname()[1]}"


# The longest path a Unix socket may have (sun_path, its terminating NUL excluded).
_UNIX_PATH_MAX = 107


def _listen_unix(path: Path) -> socket.socket | None:
    """Step 3 too: the Unix socket at ``path``, mode 0600 from its creation (docs/ARCHITECTURE.md, "Local clients"),
    replacing a socket nothing listens on any more (what a killed server left). None, with a warning, where it cannot
    be made (or another process listens there): clients then use the TCP port, as all remote ones do."""
    if not hasattr(socket, "AF_UNIX") or len(os.fsencode(path)) > _UNIX_PATH_MAX:
        log.warning("no Unix socket: %s is longer than a socket path may be; clients use the TCP port", path)
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if path.is_socket():
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                if probe.connect_ex(str(path)) == 0:
                    raise OSError("another process listens on it; give --unix-socket another path, or 'off'")
            path.unlink()
        old_umask = os.umask(0o177)  # still one thread: no other file is being created meanwhile
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        log.warning("no Unix socket at %s (%s); clients use the TCP port", path, error)
        return None
    return sock


def _env_cache_max_bytes(args: argparse.Namespace) -> int:
    """``--env-cache-max-bytes`` / ``LANCEFN_ENV_CACHE_MAX_BYTES``: a whole number of bytes > 0."""
    from lancefn_jupyter.environments.cache import DEFAULT_MAX_BYTES

    flag = args.env_cache_max_bytes
    text = flag if flag is not None else os.environ.get("LANCEFN_ENV_CACHE_MAX_BYTES")
    if text is None or not str(text).strip():
        return DEFAULT_MAX_BYTES
    where = "--env-cache-max-bytes" if flag is not None else "LANCEFN_ENV_CACHE_MAX_BYTES"
    try:
        value = int(str(text).strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise _Refused(f"{where} must be a whole number of bytes > 0 (got {text!r}); e.g. {DEFAULT_MAX_BYTES}")
    return value


def _limits(args: argparse.Namespace, shared: bool) -> Any:
    """The ``_LIMIT_FLAGS`` (flag, else env var, else the default; a bad value exits 2 saying so)."""
    from lancefn_jupyter.server.policy import limits

    defaults = (
        limits.DEFAULT_MAX_JOB_RUN_S if shared else None,
        limits.DEFAULT_MAX_QUEUED_JOBS,
        limits.DEFAULT_MAX_QUEUED_CHUNKS,
        limits.DEFAULT_MAX_BATCHES,
    )
    values: list[Any] = []
    for (flag, env, kind, _text), default in zip(_LIMIT_FLAGS, defaults, strict=True):
        given = getattr(args, flag.removeprefix("--").replace("-", "_"))
        text = given if given is not None else os.environ.get(env)
        if text is None or not text.strip():
            values.append(default)
            continue
        try:
            value = kind(text.strip())
        except ValueError:
            value = -1
        if not (math.isfinite(value) and value >= 0):
            what = "a number of seconds" if kind is float else "a whole number"
            raise _Refused(f"{flag if given is not None else env} must be {what} >= 0, 0 for no limit (got {text!r})")
        values.append(value or None)
    return limits.Limits(*values)


def _make_environments(args: argparse.Namespace, worker_user: Any) -> Any:
    """The environment cache versions' environments are built in (docs/ARCHITECTURE.md, "Environments"):
    shared (reachable by the worker user, who builds and runs them) when workers run as another user."""
    from lancefn_jupyter.environments.cache import EnvironmentCache, default_cache_dir

    max_bytes = _env_cache_max_bytes(args)
    shared = worker_user is not None
    chosen = args.env_cache or os.environ.get("LANCEFN_ENV_CACHE")
    root = Path(chosen).expanduser() if chosen else default_cache_dir(shared)
    try:
        cache = EnvironmentCache(root.resolve(), max_bytes=max_bytes, shared=shared)
    except (OSError, ValueError) as error:
        raise _Refused(f"cannot use the environment cache {root} ({error}); fix it or pass --env-cache DIR") from None
    if shared:
        from lancefn_jupyter.server.executors.isolation import check_env_cache

        problem = check_env_cache(worker_user, root.resolve())
        if problem:
            raise _Refused(problem)
    return cache


def _make_executor(args: argparse.Namespace, plugin: Any, classes: Any, home: Path, shared: bool) -> Any:
    """Step 4: the executor its plug-in builds (``executors.plugins.Built``: with the environment cache), once every
    plug-in accepts its own flags for this executor."""
    from lancefn_jupyter.server.executors.plugins import ExecutorContext, ExecutorRefused, registered

    if args.worker_max_rss_mb is not None and not (
        math.isfinite(args.worker_max_rss_mb) and args.worker_max_rss_mb > 0
    ):
        raise _Refused(
            f"--worker-max-rss-mb must be a number of MiB > 0 (got {args.worker_max_rss_mb:g}); leave it out for no limit"
        )
    for each in registered().values():
        problem = each.refuse(args, plugin.name)
        if problem:
            raise _Refused(problem)
    context = ExecutorContext(classes, home, shared, lambda worker_user: _make_environments(args, worker_user))
    try:
        return plugin.build(args, context)
    except ExecutorRefused as refused:
        raise _Refused(str(refused)) from None
    except _Refused:
        raise
    except Exception as error:  # e.g. ray not installed; say so instead of a traceback
        raise _Refused(f"cannot create the {plugin.name!r} executor: {error}") from None


def _open_store(home: Path) -> Any:
    """Step 5: the SQLite state (exit 1, not EXIT_CONFIG: this is not "another server holds this home")."""
    from lancefn_jupyter.server.storage.store import DB_FILENAME, Store

    try:
        return Store(home / DB_FILENAME)
    except (sqlite3.Error, OSError) as error:
        full = shutil.disk_usage(home).free < (1 << 20)
        hint = (
            f"the disk holding {home} is full; free some space" if full else "check that the home directory is writable"
        )
        raise _Refused(f"cannot open the state database {home / DB_FILENAME} ({error}); {hint}", 1) from None


def _client_caps(args: argparse.Namespace) -> Any:
    """Step 2 too: the per-client caps, each a whole number >= 1."""
    from lancefn_jupyter.server.http.caps import ClientCaps

    values = {field: getattr(args, flag[2:].replace("-", "_")) for flag, field, _ in _CLIENT_CAP_FLAGS}
    for flag, field, _ in _CLIENT_CAP_FLAGS:
        if values[field] < 1:
            raise _Refused(f"{flag} must be a whole number >= 1 (got {values[field]}); leave it out for the default")
    return ClientCaps(**values)


def _make_app(args: argparse.Namespace, plane: Any, api_keys: dict[str, Any], caps: Any) -> Any:
    """Step 6: the ASGI app with the request limits."""
    from lancefn_jupyter.server.http.app import create_app
    from lancefn_jupyter.server.http.guard import DEFAULT_MAX_BODY_BYTES

    # A maximum-size artifact travels base64-encoded (4/3 of its bytes) in a JSON body.
    max_body = args.max_body_bytes or max(DEFAULT_MAX_BODY_BYTES, args.max_artifact_bytes * 4 // 3 + (64 << 10))
    return create_app(
        plane,
        api_keys=api_keys,
        max_body_bytes=max_body,
        max_artifact_bytes=args.max_artifact_bytes,
        body_timeout_s=args.body_timeout_s,
        max_arrow_body_bytes=args.max_arrow_body_bytes,
        caps=caps,
    )


def _serve(
    args: argparse.Namespace,
    app: Any,
    plane: Any,
    sockets: list[socket.socket],
    server_json: Path,
    info: dict,
    caps: Any,
) -> int:
    """Step 7: serve until SIGTERM/SIGINT; ``server.json`` is written once serving (it means "ready")."""
    import uvicorn

    from lancefn_jupyter.server.http.connections import header_timeout_protocol

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
                print(f"lancefn-server listening on {info['url']}", flush=True)

        async def on_tick(self, counter: int) -> bool:
            if counter % 10 == 0 and self.started and args.idle_exit_s > 0 and self._idle_past(args.idle_exit_s):
                print(
                    f"lancefn-server idle for {args.idle_exit_s:g} s: no connection and no job; stopping (--idle-exit-s)"
                )
                self.should_exit = True
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

        busy_at = time.monotonic()

        def _idle_past(self, seconds: float) -> bool:
            """No connection open (a kernel's event stream, a request, a kept-alive client) and no job pending or
            running (docs/ARCHITECTURE.md, "Embedded server idle exit") since ``seconds`` ago."""
            now = time.monotonic()
            if self.server_state.connections or plane.has_work():
                self.busy_at = now
            return now - self.busy_at > seconds

        async def shutdown(self, sockets: list | None = None) -> None:
            plane.begin_shutdown()  # end SSE streams and long polls so they don't delay the stop
            await super().shutdown(sockets=sockets)

    config = uvicorn.Config(
        app,
        http=header_timeout_protocol(args.header_timeout_s, args.limit_concurrency, caps),
        limit_concurrency=args.limit_concurrency,
        log_level=args.log_level,
        access_log=False,
        # No X-Forwarded-* rewriting: the server binds to loopback by default and trusts no proxy's word
        # about the client (each address's share of pending connections reads the socket's own peer).
        proxy_headers=False,
        server_header=False,  # which server software answers is no client's business
        ws="none",  # no websocket routes: nor their protocol's import at start
        timeout_graceful_shutdown=5,
        lifespan="on",
    )
    server = _Server(config)
    # uvicorn captures SIGTERM/SIGINT itself and re-raises them once it has stopped; make
    # that re-raise a no-op so our cleanup runs and the exit code is 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    # The event loop shares the GIL with the threads that follow jobs and batches: a shorter switch
    # interval (default 5 ms) lets it in sooner, so one busy thread adds little to every reply.
    sys.setswitchinterval(float(os.environ.get("LANCEFN_SWITCH_INTERVAL_S", "0.001")))
    try:
        server.run(sockets=sockets)
    finally:
        try:
            if server_json.exists() and json.loads(server_json.read_text()).get("pid") == os.getpid():
                server_json.unlink()
        except (OSError, ValueError):
            pass
    return 0 if server.started and not failed_to_publish else 1


def _safe_children() -> None:
    """Every child the server runs (workers, the artifact checker, environment builds, the Ray bridge) starts with
    no cwd or script directory on ``sys.path`` (docs/ARCHITECTURE.md, "Isolation"); a package found only through
    the cwd (a source checkout started with ``python -m``) is passed on ``PYTHONPATH`` instead."""
    os.environ["PYTHONSAFEPATH"] = "1"
    root = str(Path(__file__).resolve().parents[2])
    if root == os.getcwd() and root not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _safe_children()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        plugin = _plugin(args.executor)
        home, lock = _claim_home(args)
    except _Refused as refused:
        return _say(refused)
    store, unix_path = None, None
    try:
        # Heavy imports (the app, the executor) come after the cheap checks, so a refused start is fast.
        classes, api_keys, admin_key, digest_key = _load_config(args, home, plugin)
        caps = _client_caps(args)
        sock, url = _listen(args.host, args.port)
        sockets = [sock]
        if args.unix_socket != "off":
            wanted = Path(args.unix_socket).expanduser().absolute() if args.unix_socket else home / UNIX_SOCKET
            unix = _listen_unix(wanted)
            if unix is not None:
                sockets.append(unix)
                unix_path = wanted
        shared = _shared(api_keys)
        limits = _limits(args, shared)
        built = _make_executor(args, plugin, classes, home, shared)
        if args.log_max_bytes < 1:
            raise _Refused(f"--log-max-bytes must be a whole number of bytes > 0 (got {args.log_max_bytes})")
        if args.max_arrow_result_bytes < 1:
            raise _Refused(
                f"--max-arrow-result-bytes must be a whole number of bytes > 0 (got {args.max_arrow_result_bytes})"
            )
        store = _open_store(home)
        store.limit_logs(args.log_max_bytes)
        if built.on_store is not None:
            built.on_store(store)  # e.g. namespaces keep the uids recorded in this home
        from lancefn_jupyter.server.plane import ControlPlane
        from lancefn_jupyter.server.policy.namespaces import budgets, gpu_caps
        from lancefn_jupyter.server.storage.files import DataStore

        data = DataStore(
            home,
            max_age_s=args.result_max_age_days * 86400,
            max_bytes=args.result_max_bytes,
            max_result_bytes=args.max_arrow_result_bytes,
            fsync=args.result_fsync,
        )
        plane = ControlPlane(
            store=store,
            classes=classes,
            executor=built.executor,
            version=__version__,
            data=data,
            environments=built.environments,
            table_roots=_table_roots(args, api_keys),
            digest_key=digest_key,
            gpu_caps=gpu_caps(api_keys.values()),
            budgets=budgets(api_keys.values()),
            allow_direct_references=args.allow_direct_references or not _shared(api_keys),
            limits=limits,
        )
        app = _make_app(args, plane, api_keys, caps)
        info = {
            "url": url,
            "api_key": admin_key,
            "pid": os.getpid(),
            "home": str(home),
            "version": __version__,
            "executor": args.executor,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if unix_path is not None:
            info["unix_socket"] = str(unix_path)
        return _serve(args, app, plane, sockets, home / SERVER_JSON, info, caps)
    except _Refused as refused:
        return _say(refused)
    finally:
        if store is not None:
            store.close()
        if unix_path is not None:
            with contextlib.suppress(OSError):
                unix_path.unlink()
        lock.close()


def _say(refused: _Refused) -> int:
    print(f"lancefn-server: {refused}", file=sys.stderr, flush=True)
    return refused.code


if __name__ == "__main__":
    sys.exit(main())
