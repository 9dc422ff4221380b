"""SQLite persistence of function versions, jobs, job rows, job logs and the event log.

Durability: WAL journal + ``synchronous=NORMAL`` + one commit per logical change.  In WAL
mode a committed transaction survives the *process* being SIGKILLed (the OS still has the
WAL pages); only a power loss can drop the last commits, which is acceptable for a local
control plane and is what makes ~1000 commits/s cheap.  Callers group several changes into
one commit with ``with store.batch():``.  A commit only writes the WAL: checkpoints, which copy
it into the database and sync both, run on a thread of their own (``_Checkpoints``), so no
commit waits for the disk (the event loop commits a run's job: docs/ARCHITECTURE.md, "REST details").

One connection shared by all threads behind a lock: SQLite serialises writers anyway, and
every statement here is short.  The store knows nothing about job semantics; it maps
:class:`JobRecord` (owned by the job table) to rows.

Over 600 lines: one concern, the SQLite schema and its statements behind one connection and lock; the tables
refer to one another (a job's rows, logs and events) and share migrations."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.policy.namespaces import DEFAULT_NAMESPACE

log = logging.getLogger("lancefn.server")

__all__ = ["DB_FILENAME", "JobRecord", "Store", "VersionRow", "is_storage_full"]


def is_storage_full(error: BaseException) -> bool:
    """A full disk (SQLite's SQLITE_FULL or ENOSPC/EDQUOT/EFBIG from a write)."""
    if isinstance(error, sqlite3.OperationalError):
        return "full" in str(error)
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


DB_FILENAME = "lancefn.sqlite3"
CHECKPOINT_EVERY = 100  # commits between checkpoints (SQLite's own default is about every 1,000 WAL pages)
WAL_KEPT_BYTES = 8 << 20
_EVENTS_PER_INSERT = 256  # rows of one INSERT statement: well within SQLite's bound on a statement's parameters
EVENTS_KEPT = 200_000  # older events are pruned; a client further behind re-lists jobs
VERSION_CACHE_SIZE = 256  # version rows kept in memory (get_version), each at most:
VERSION_CACHE_ROW_BYTES = 256 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS function_versions(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    definition TEXT NOT NULL,          -- FunctionVersion wire JSON (canonical)
    artifact BLOB NOT NULL,
    created_at TEXT NOT NULL,
    dropped INTEGER NOT NULL DEFAULT 0,
    UNIQUE(name, version)
);
CREATE TABLE IF NOT EXISTS jobs(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    job_type TEXT NOT NULL,
    state TEXT NOT NULL,
    name TEXT,
    creation_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    spec TEXT NOT NULL,
    placement TEXT NOT NULL,           -- {gpu_class, num_gpus, devices, node}
    rows_done INTEGER NOT NULL DEFAULT 0,
    rows_total INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    failure TEXT,
    requeues INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, seq);
CREATE INDEX IF NOT EXISTS jobs_by_name ON jobs(name, seq);
CREATE TABLE IF NOT EXISTS job_rows(
    job_id TEXT PRIMARY KEY,
    rows TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_logs(
    job_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    stream TEXT NOT NULL,
    line TEXT NOT NULL,
    row INTEGER,
    PRIMARY KEY(job_id, pos)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pruned_logs(
    job_id TEXT PRIMARY KEY,
    lines INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS secrets(
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    value TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY(namespace, name)
);
"""


@dataclass
class JobRecord:
    """A job as the control plane tracks it (mutable; the wire form is built by the reports)."""

    job_id: str
    job_type: str
    state: str
    creation_ms: int
    spec: dict[str, Any] = field(default_factory=dict)
    name: str | None = None
    started_ms: int | None = None
    finished_ms: int | None = None
    gpu_class: str | None = None
    num_gpus: int = 0
    devices: tuple[str, ...] = ()
    node: str | None = None
    rows_done: int = 0
    rows_total: int = 0
    result: Any = None
    failure: dict[str, Any] | None = None
    requeues: int = 0
    seq: int | None = None  # storage order (set once inserted)
    namespace: str = DEFAULT_NAMESPACE  # the owning team (docs/ARCHITECTURE.md, "Namespaces")
    timings: dict[str, Any] | None = None  # JobTimings wire form, once it ended on a worker ("Warm state")
    # Memory only: how long the job waited for its version's environment to build ("Environments"); ends up in timings.
    environment_ms: float = 0.0


@dataclass(frozen=True)
class VersionRow:
    name: str
    version: str
    definition: str
    artifact: bytes
    dropped: bool
    seq: int
    namespace: str = DEFAULT_NAMESPACE


def _cacheable(row: VersionRow) -> bool:
    return len(row.artifact) + len(row.definition) <= VERSION_CACHE_ROW_BYTES


class _Checkpoints:
    """Checkpoints of the WAL on a thread and connection of their own, every ``CHECKPOINT_EVERY`` commits, so
    their syncs are on no commit's path. Each is a PASSIVE checkpoint beside the writers, then another with the
    store's lock held: commits go on while the first copies the bulk, and the second copies what they added
    meanwhile, so the checkpoint completes and the next commit starts the WAL over (under a steady stream of
    commits, checkpoints beside them alone never complete, and the WAL would grow without end). While that
    second one waits for the lock, writers let it go first (``make_way``; the event loop does not take the lock
    then, ``Store.acquire_now``): a thread committing back to back would take the lock again before the waiting
    one woke. The thread starts with the first checkpoint due (a store that writes little never starts it)."""

    def __init__(self, path: Path, lock: threading.RLock) -> None:
        self._path, self._lock = path, lock
        self._commits = 0
        self._due = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._turn = threading.Event()  # clear while the checkpoint waits for the store's lock
        self._turn.set()

    @property
    def waiting(self) -> bool:
        """Whether the checkpoint waits for the store's lock."""
        return not self._turn.is_set()

    def make_way(self) -> None:
        """Before a writer that does not hold the store's lock takes it: the checkpoint waiting for it goes first."""
        self._turn.wait(1.0)

    def committed(self) -> None:
        """One more commit (the store's lock held)."""
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY:
            self._commits = 0
            if self._thread is None:
                with self._start_lock:
                    if self._thread is None and not self._stopped:
                        self._thread = threading.Thread(target=self._run, name="lancefn-checkpoints", daemon=True)
                        self._thread.start()
            self._due.set()

    def _run(self) -> None:
        try:
            db = sqlite3.connect(str(self._path), check_same_thread=False, isolation_level=None)
        except sqlite3.Error as error:  # the WAL then grows until the store closes, which checkpoints it
            log.error("cannot open %s to checkpoint it: %s", self._path, error)
            return
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._stopped:
                    return
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    self._turn.clear()
                    try:
                        with self._lock:
                            self._turn.set()  # writers now wait for the lock itself
                            db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    finally:
                        self._turn.set()
                except sqlite3.Error as error:  # a full disk, say: the WAL keeps the commits; the next one retries
                    log.warning("checkpointing %s failed: %s", self._path, error)
        finally:
            db.close()

    def stop(self) -> None:
        with self._start_lock:
            self._stopped = True
            thread = self._thread
        self._due.set()
        if thread is not None:
            thread.join()


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.RLock()
        self._depth = 0  # batch nesting; commit when the outermost batch ends
        self._after_commit: list[Callable[[], None]] = []
        self._versions: OrderedDict[tuple[str, str, str | None], VersionRow] = OrderedDict()  # see get_version
        if not self.path.exists():
            # The DB holds artifacts and function env values: private from the start
            # (SQLite gives the -wal/-shm files the database file's permissions).
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        # isolation_level=None: we issue BEGIN/COMMIT ourselves so batches are explicit.
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA foreign_keys=OFF")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # ``_Checkpoints`` does them
        self._db.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")  # what a WAL started over keeps on disk
        self._checkpoints = _Checkpoints(self.path, self._lock)
        self._db.executescript(_SCHEMA)
        self._migrate_namespaces()
        self._migrate_timings()
        self._migrate_log_rows()
        self._events_since_prune = 0
        self.prune_events()
        # Job logs over all jobs (docs/ARCHITECTURE.md, "REST details"): a byte total and each job's share,
        # oldest job first, kept from ``limit_logs`` on; None: no limit.
        self._log_limit: int | None = None
        self._log_sizes: OrderedDict[str, int] = OrderedDict()
        self._log_bytes = 0

    def close(self) -> None:
        self._checkpoints.stop()
        with self._lock:
            self._db.close()  # the last connection: it checkpoints the rest

    def batch(self) -> Store:
        """Group writes into one transaction (re-entrant; commits at the outermost level): ``with store.batch():``.
        The store is the context manager itself (its depth is the batch's state): a generator's took a microsecond
        more per use, and a quick job makes ten."""
        return self

    def __enter__(self) -> None:
        # Not when this thread holds the lock already (a nested batch, the event loop's ``acquire_now``): the
        # checkpoint waits for that very lock. (``RLock._is_owned`` is what ``threading.Condition`` asks too.)
        if self._checkpoints.waiting and not self._lock._is_owned():  # type: ignore[attr-defined]  # noqa: SLF001
            self._checkpoints.make_way()
        self._lock.acquire()
        try:
            if self._depth == 0:
                self._db.execute("BEGIN IMMEDIATE")
        except BaseException:
            self._lock.release()
            raise
        self._depth += 1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            self._depth -= 1
            if self._depth:
                return
            if exc_type is not None:
                self._after_commit.clear()
                if self._db.in_transaction:  # SQLite may have rolled back itself (a full disk): keep the first error
                    self._db.execute("ROLLBACK")
                return
            try:
                self._db.execute("COMMIT")
            except BaseException:
                self._after_commit.clear()
                # e.g. SQLITE_FULL: SQLite may leave the transaction open, and a later COMMIT
                # would then save changes the caller was told failed.
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._checkpoints.committed()
            callbacks, self._after_commit = self._after_commit, []
            for callback in callbacks:
                callback()
        finally:
            self._lock.release()

    def acquire_now(self) -> bool:
        """Take the store's lock only if no other thread holds it (the event loop never waits for a commit); True
        when taken, to :meth:`release` then. Not while a checkpoint waits for it (``_Checkpoints.make_way``)."""
        return not self._checkpoints.waiting and self._lock.acquire(blocking=False)

    def release(self) -> None:
        self._lock.release()

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the current outermost batch has committed (never if it rolls
        back): events announce only what is saved, and a rolled-back sequence number, which
        SQLite hands out again, is never seen by a client."""
        with self._lock:
            if self._depth == 0:
                callback()
            else:
                self._after_commit.append(callback)

    def in_batch(self) -> bool:
        """Whether this thread is inside a batch (another thread's batch holds the lock, so
        this waits for it to end and then answers False)."""
        with self._lock:
            return self._depth > 0

    def _migrate_namespaces(self) -> None:
        """Give versions, jobs and events a ``namespace`` (rows of an older home: the default one)
        and make function names unique per namespace.  SQLite cannot change a UNIQUE constraint in
        place, so ``function_versions`` is rebuilt from its own CREATE statement (keeping any column
        others added) once, in one transaction."""

        def columns(table: str) -> list[str]:
            return [row[1] for row in self._db.execute(f"PRAGMA table_info({table})")]

        default = DEFAULT_NAMESPACE.replace("'", "")
        with self.batch():
            if "namespace" not in columns("function_versions"):
                (sql,) = self._db.execute(
                    "SELECT sql FROM sqlite_master WHERE type='table' AND name='function_versions'"
                ).fetchone()
                old = columns("function_versions")
                sql = sql.replace("function_versions", "function_versions_ns", 1)
                sql = re.sub(
                    r"UNIQUE\s*\(\s*name\s*,\s*version\s*\)",
                    f"namespace TEXT NOT NULL DEFAULT '{default}',\n    UNIQUE(namespace, name, version)",
                    sql,
                )
                self._db.execute(sql)
                listed = ", ".join(old)
                self._db.execute(f"INSERT INTO function_versions_ns({listed}) SELECT {listed} FROM function_versions")
                self._db.execute("DROP TABLE function_versions")
                self._db.execute("ALTER TABLE function_versions_ns RENAME TO function_versions")
            if "namespace" not in columns("jobs"):
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN namespace TEXT NOT NULL DEFAULT '{default}'")
            self._db.execute("CREATE INDEX IF NOT EXISTS jobs_by_namespace ON jobs(namespace, seq)")
            if "namespace" not in columns("events"):
                self._db.execute(f"ALTER TABLE events ADD COLUMN namespace TEXT NOT NULL DEFAULT '{default}'")
            self._db.execute("CREATE INDEX IF NOT EXISTS events_by_namespace ON events(namespace, seq)")

    def _migrate_timings(self) -> None:
        """Give ``jobs`` a ``timings`` column (JSON; NULL for the jobs of an older home)."""
        with self.batch():
            if "timings" not in [row[1] for row in self._db.execute("PRAGMA table_info(jobs)")]:
                self._db.execute("ALTER TABLE jobs ADD COLUMN timings TEXT")

    def _migrate_log_rows(self) -> None:
        """Give ``job_logs`` a ``row`` column (the row that printed the line; NULL for an older home's lines)."""
        with self.batch():
            if "row" not in [row[1] for row in self._db.execute("PRAGMA table_info(job_logs)")]:
                self._db.execute("ALTER TABLE job_logs ADD COLUMN row INTEGER")

    # Generic access for modules that own their own tables (server/batches/manager.py).
    def executescript(self, script: str) -> None:
        with self._lock:
            self._db.executescript(script)

    def execute(self, sql: str, args: tuple = ()) -> None:
        with self.batch():
            self._db.execute(sql, args)

    def executemany(self, sql: str, rows: list[tuple]) -> None:
        with self.batch():
            self._db.executemany(sql, rows)

    def query(self, sql: str, args: tuple = ()) -> list[tuple]:
        return self._query(sql, args)

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ---------------------------------------------------------------- versions

    def get_version(self, name: str, version: str, namespace: str | None = DEFAULT_NAMESPACE) -> VersionRow | None:
        """The version in ``namespace``; ``namespace=None``: in whichever namespace registered it first.

        Rows read outside a transaction are cached (every run reads its version twice): a version
        never changes once stored except its ``dropped`` flag, which ``set_dropped`` keeps current."""
        key = (name, version, namespace)
        with self._lock:
            cached = self._versions.get(key) if namespace is not None else None
            if cached is not None:
                self._versions.move_to_end(key)
                return cached
            row = self._read_version(name, version, namespace)
            if row is not None and namespace is not None and self._depth == 0 and _cacheable(row):
                self._versions[key] = row
                if len(self._versions) > VERSION_CACHE_SIZE:
                    self._versions.popitem(last=False)
            return row

    def _read_version(self, name: str, version: str, namespace: str | None) -> VersionRow | None:
        sql = "SELECT name, version, definition, artifact, dropped, seq, namespace FROM function_versions WHERE name=? AND version=?"
        args: tuple = (name, version)
        if namespace is not None:
            sql += " AND namespace=?"
            args += (namespace,)
        rows = self._query(sql + " ORDER BY seq LIMIT 1", args)
        if not rows:
            return None
        n, v, definition, artifact, dropped, seq, ns = rows[0]
        return VersionRow(n, v, definition, bytes(artifact), bool(dropped), seq, ns)

    def insert_version(
        self,
        name: str,
        version: str,
        definition: str,
        artifact: bytes,
        created_at: str,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        with self.batch():
            self._db.execute(
                "INSERT INTO function_versions(name, version, definition, artifact, created_at, namespace) VALUES(?,?,?,?,?,?)",
                (name, version, definition, artifact, created_at, namespace),
            )

    def set_dropped(self, name: str, version: str, dropped: bool, namespace: str = DEFAULT_NAMESPACE) -> None:
        with self.batch():
            self._versions.pop((name, version, namespace), None)  # read again (after the commit) when next asked
            self._db.execute(
                "UPDATE function_versions SET dropped=? WHERE name=? AND version=? AND namespace=?",
                (int(dropped), name, version, namespace),
            )

    def list_versions(
        self, *, name: str | None, after_seq: int, limit: int, namespace: str | None = None
    ) -> list[tuple[int, str, str, str, str]]:
        """``[(seq, name, version, definition, namespace)]`` of live versions, registration order;
        ``namespace=None``: every namespace's."""
        sql = "SELECT seq, name, version, definition, namespace FROM function_versions WHERE dropped=0 AND seq>?"
        args: tuple = (after_seq,)
        if name is not None:
            sql += " AND name=?"
            args += (name,)
        if namespace is not None:
            sql += " AND namespace=?"
            args += (namespace,)
        return self._query(sql + " ORDER BY seq LIMIT ?", (*args, limit))

    def version_ids(self, name: str, namespace: str) -> list[str]:
        """Every version id of ``name`` in ``namespace``, dropped ones too, in registration order (LanceDB's decimal
        versions are positions in this list, so they never move)."""
        sql = "SELECT version FROM function_versions WHERE name=? AND namespace=? ORDER BY seq"
        return [row[0] for row in self._query(sql, (name, namespace))]

    def load_secrets(self) -> list[tuple[str, str, str, int, int]]:
        """Every secret: ``(namespace, name, value, created_ms, updated_ms)`` (the vault keeps them in memory)."""
        return self._query("SELECT namespace, name, value, created_ms, updated_ms FROM secrets")

    def put_secret(self, namespace: str, name: str, value: str, created_ms: int, updated_ms: int) -> None:
        with self.batch():
            self._db.execute(
                "INSERT OR REPLACE INTO secrets(namespace, name, value, created_ms, updated_ms) VALUES(?,?,?,?,?)",
                (namespace, name, value, created_ms, updated_ms),
            )

    def delete_secret(self, namespace: str, name: str) -> None:
        with self.batch():
            self._db.execute("DELETE FROM secrets WHERE namespace=? AND name=?", (namespace, name))

    # -------------------------------------------------------------------- jobs

    _JOB_COLUMNS = (
        "seq, job_id, job_type, state, name, creation_ms, started_ms, finished_ms, spec, placement, "
        "rows_done, rows_total, result, failure, requeues, namespace, timings"
    )

    @staticmethod
    def _changing_params(rec: JobRecord) -> tuple:
        """What a job's later changes may alter (its type, name, creation time and spec are fixed at creation)."""
        placement = {
            "gpu_class": rec.gpu_class,
            "num_gpus": rec.num_gpus,
            "devices": list(rec.devices),
            "node": rec.node,
        }
        return (
            rec.state,
            rec.started_ms,
            rec.finished_ms,
            dumps(placement),
            rec.rows_done,
            rec.rows_total,
            None if rec.result is None else dumps(rec.result),
            None if rec.failure is None else dumps(rec.failure),
            rec.requeues,
            None if rec.timings is None else dumps(rec.timings),
        )

    @staticmethod
    def _job_from_row(row: tuple) -> JobRecord:
        (seq, job_id, job_type, state, name, creation_ms, started_ms, finished_ms, spec, placement,
         rows_done, rows_total, result, failure, requeues, namespace, timings) = row  # fmt: skip
        where = json.loads(placement)
        return JobRecord(
            job_id=job_id,
            job_type=job_type,
            state=state,
            creation_ms=creation_ms,
            spec=json.loads(spec),
            name=name,
            started_ms=started_ms,
            finished_ms=finished_ms,
            gpu_class=where.get("gpu_class"),
            num_gpus=where.get("num_gpus", 0),
            devices=tuple(where.get("devices", ())),
            node=where.get("node"),
            rows_done=rows_done,
            rows_total=rows_total,
            result=None if result is None else json.loads(result),
            failure=None if failure is None else json.loads(failure),
            requeues=requeues,
            seq=seq,
            namespace=namespace,
            timings=None if timings is None else json.loads(timings),
        )

    def insert_job(self, rec: JobRecord, rows: list[dict] | None = None) -> None:
        with self.batch():
            cur = self._db.execute(
                "INSERT INTO jobs(state, started_ms, finished_ms, placement, rows_done, rows_total, result, failure, "
                "requeues, timings, job_type, name, creation_ms, spec, job_id, namespace) "
                "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    *self._changing_params(rec),
                    rec.job_type,
                    rec.name,
                    rec.creation_ms,
                    dumps(rec.spec),
                    rec.job_id,
                    rec.namespace,
                ),
            )
            rec.seq = cur.lastrowid
            if rows is not None:
                self._db.execute("INSERT INTO job_rows(job_id, rows) VALUES(?,?)", (rec.job_id, dumps(rows)))

    def update_job(self, rec: JobRecord) -> bool:
        """Save a job's change; False when the job is not in the store (nothing written)."""
        with self.batch():
            cur = self._db.execute(
                "UPDATE jobs SET state=?, started_ms=?, finished_ms=?, placement=?, rows_done=?, rows_total=?, "
                "result=?, failure=?, requeues=?, timings=? WHERE job_id=?",
                (*self._changing_params(rec), rec.job_id),
            )
            return cur.rowcount > 0

    def save_job(self, rec: JobRecord) -> None:
        """Save a job as it is now, whether the store has it yet or not (a job whose first save a full disk
        refused: docs/ARCHITECTURE.md, "REST details")."""
        with self.batch():
            if not self.update_job(rec):
                self.insert_job(rec)

    def get_job(self, job_id: str) -> JobRecord | None:
        rows = self._query(f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE job_id=?", (job_id,))
        return self._job_from_row(rows[0]) if rows else None

    def list_jobs(
        self,
        *,
        states: tuple[str, ...] | None = None,
        name: str | None = None,
        job_type: str | None = None,
        before_seq: int | None = None,
        limit: int = 100,
        oldest_first: bool = False,
        namespace: str | None = None,
    ) -> list[JobRecord]:
        clauses: list[str] = []
        args: list[Any] = []
        if namespace is not None:
            clauses.append("namespace=?")
            args.append(namespace)
        if states:
            clauses.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if name is not None:
            clauses.append("name=?")
            args.append(name)
        if job_type is not None:
            clauses.append("job_type=?")
            args.append(job_type)
        if before_seq is not None:
            clauses.append("seq<?")
            args.append(before_seq)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        order = "ASC" if oldest_first else "DESC"
        rows = self._query(f"SELECT {self._JOB_COLUMNS} FROM jobs{where} ORDER BY seq {order} LIMIT ?", (*args, limit))
        return [self._job_from_row(row) for row in rows]

    def get_rows(self, job_id: str) -> list[dict]:
        rows = self._query("SELECT rows FROM job_rows WHERE job_id=?", (job_id,))
        return json.loads(rows[0][0]) if rows else []

    # -------------------------------------------------------------------- logs

    def next_log_pos(self, job_id: str) -> int:
        """Where the job's next log line goes: after its last kept line, or after those the log limit removed."""
        kept = self._query("SELECT COALESCE(MAX(pos) + 1, 0) FROM job_logs WHERE job_id=?", (job_id,))[0][0]
        return max(kept, self.pruned_log_lines(job_id))

    def append_logs(
        self, job_id: str, start: int, stream: str, lines: list[str], rows: Sequence[int | None] | None = None
    ) -> int:
        """Append ``lines`` at positions ``start…`` (``rows``: each line's row, "Live output"); returns the next
        position. Over the log limit, the oldest jobs' logs are removed first (``limit_logs``)."""
        tags = rows if rows is not None else (None,) * len(lines)
        with self.batch():
            self._db.executemany(
                "INSERT INTO job_logs(job_id, pos, stream, line, row) VALUES(?,?,?,?,?)",
                [(job_id, start + i, stream, line, row) for i, (line, row) in enumerate(zip(lines, tags, strict=True))],
            )
            if self._log_limit is not None:
                size = sum(len(line.encode("utf-8", "surrogatepass")) for line in lines)
                self._log_sizes[job_id] = self._log_sizes.get(job_id, 0) + size
                self._log_bytes += size
                if self._log_bytes > self._log_limit:
                    self._prune_logs(keep=job_id)
        return start + len(lines)

    def limit_logs(self, max_bytes: int) -> None:
        """Keep at most ``max_bytes`` of log lines over all jobs from now on (one scan now, then a running total):
        past it, whole jobs' logs go, oldest job first, down to 90 % of the limit (so not every write prunes)."""
        with self._lock:
            rows = self._query(
                "SELECT l.job_id, SUM(LENGTH(CAST(l.line AS BLOB))) FROM job_logs l LEFT JOIN jobs j USING(job_id) "
                "GROUP BY l.job_id ORDER BY MIN(j.creation_ms), l.job_id"
            )
            self._log_sizes = OrderedDict((job_id, size) for job_id, size in rows)
            self._log_bytes = sum(self._log_sizes.values())
            self._log_limit = max_bytes
            if self._log_bytes > max_bytes:
                with self.batch():
                    self._prune_logs(keep=None)

    def _prune_logs(self, keep: str | None) -> None:
        assert self._log_limit is not None
        target = self._log_limit * 9 // 10
        while self._log_bytes > target and self._log_sizes:
            job_id, size = next(iter(self._log_sizes.items()))
            if job_id == keep:  # the job writing now keeps its lines (its own cap bounds it)
                if len(self._log_sizes) == 1:
                    break
                self._log_sizes.move_to_end(job_id)
                continue
            del self._log_sizes[job_id]
            self._log_bytes -= size
            lines = self._db.execute("SELECT COALESCE(MAX(pos) + 1, 0) FROM job_logs WHERE job_id=?", (job_id,))
            self._db.execute(
                "INSERT INTO pruned_logs(job_id, lines) VALUES(?, ?) ON CONFLICT(job_id) DO UPDATE SET lines=excluded.lines",
                (job_id, lines.fetchone()[0]),
            )
            self._db.execute("DELETE FROM job_logs WHERE job_id=?", (job_id,))

    def pruned_log_lines(self, job_id: str) -> int:
        """How many of the job's first log lines the log limit removed (0: none)."""
        rows = self._query("SELECT lines FROM pruned_logs WHERE job_id=?", (job_id,))
        return rows[0][0] if rows else 0

    def read_logs(
        self, job_id: str, offset: int, limit: int, row: int | None = None
    ) -> list[tuple[int, str, str, int | None]]:
        """``[(pos, stream, line, row)]`` from ``offset``; only the lines of ``row`` when it is given."""
        if row is None:
            return self._query(
                "SELECT pos, stream, line, row FROM job_logs WHERE job_id=? AND pos>=? ORDER BY pos LIMIT ?",
                (job_id, offset, limit),
            )
        return self._query(
            "SELECT pos, stream, line, row FROM job_logs WHERE job_id=? AND pos>=? AND row=? ORDER BY pos LIMIT ?",
            (job_id, offset, row, limit),
        )

    # ------------------------------------------------------------------ events

    def job_events(self, job_id: str, limit: int, *, after: int = 0) -> list[tuple[int, str]]:
        """``[(seq, data)]`` of one job's events still kept, oldest first, of sequence number above ``after``."""
        return self._query(
            "SELECT seq, data FROM events WHERE job_id=? AND seq>? ORDER BY seq LIMIT ?", (job_id, after, limit)
        )

    def insert_event(self, job_id: str | None, data: str, namespace: str = DEFAULT_NAMESPACE) -> int:
        return self.insert_events(job_id, [data], namespace)[0]

    def insert_events(self, job_id: str | None, datas: list[str], namespace: str = DEFAULT_NAMESPACE) -> list[int]:
        """Append a job's events in one statement (a quick job's three); their sequence numbers, in order."""
        seqs: list[int] = []
        with self.batch():
            for start in range(0, len(datas), _EVENTS_PER_INSERT):
                part = datas[start : start + _EVENTS_PER_INSERT]
                values = ",".join(["(?,?,?)"] * len(part))
                args = [value for data in part for value in (job_id, data, namespace)]
                last = self._db.execute(f"INSERT INTO events(job_id, data, namespace) VALUES{values}", args).lastrowid
                assert last is not None  # an INSERT always sets it
                # One statement under the write lock: AUTOINCREMENT numbers its rows one after another to ``last``.
                seqs += range(last - len(part) + 1, last + 1)
        self._events_since_prune += len(datas)
        if self._events_since_prune >= 10_000:
            self.prune_events()
        return seqs

    def events_after(self, seq: int, limit: int = 1000, namespace: str | None = None) -> list[tuple[int, str]]:
        if namespace is not None:
            return self._query(
                "SELECT seq, data FROM events WHERE namespace=? AND seq>? ORDER BY seq LIMIT ?", (namespace, seq, limit)
            )
        return self._query("SELECT seq, data FROM events WHERE seq>? ORDER BY seq LIMIT ?", (seq, limit))

    def last_event_seq(self) -> int:
        # sqlite_sequence remembers the highest seq even after pruning, so ids never repeat.
        rows = self._query("SELECT seq FROM sqlite_sequence WHERE name='events'")
        return rows[0][0] if rows else 0

    def prune_events(self) -> None:
        with self.batch():
            self._db.execute("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (EVENTS_KEPT,))
        self._events_since_prune = 0
