"""Batches in SQLite: the ``batches`` and ``batch_chunks`` tables, next to the store's own
(docs/ARCHITECTURE.md, "Batches").  Writes join the store's open transaction (``Store.batch``)."""

from __future__ import annotations

import json
import time
from typing import Any

from lancefn_jupyter.server.batches.state import BatchRun, Chunk
from lancefn_jupyter.server.control.states import DONE, IN_PROGRESS, PENDING
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.wire.backfill_models import TableSlice

BATCH_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL UNIQUE,
    namespace TEXT,                    -- the function's namespace: its chunk jobs run there, callers see it by scope
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    input_digest TEXT NOT NULL,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,                -- {parallel, retries, timeout_s, rows_total, chunks_total}
    creation_ms INTEGER NOT NULL,
    started_ms INTEGER,
    finished_ms INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    spent TEXT                         -- BatchRun.spent: its ended chunk jobs' usage summed (BatchUsage)
);
CREATE INDEX IF NOT EXISTS batches_by_input ON batches(name, version, input_digest, seq);
CREATE INDEX IF NOT EXISTS batches_by_state ON batches(state, seq);
CREATE TABLE IF NOT EXISTS batch_chunks(
    batch_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    row_start INTEGER NOT NULL,
    row_end INTEGER NOT NULL,
    rows TEXT NOT NULL,
    state TEXT NOT NULL,
    job_id TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    failure TEXT,
    PRIMARY KEY(batch_id, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batch_events(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    batch_id TEXT NOT NULL,
    data TEXT NOT NULL                 -- {state, at_ms, by, rows, chunk?, job_id?}: dialect.batch_event_row
);
CREATE INDEX IF NOT EXISTS batch_events_by_batch ON batch_events(batch_id, seq);
"""


class BatchStore:
    def __init__(self, store: Store):
        self.store = store
        store.executescript(BATCH_SCHEMA)
        if "spent" not in [row[1] for row in store.query("PRAGMA table_info(batches)")]:  # a home from before it
            store.execute("ALTER TABLE batches ADD COLUMN spent TEXT")

    def insert_chunks(self, batch: BatchRun, encoded: list, first: int, end: int) -> None:
        """Chunks ``first``..``end`` of a new batch with their rows (JSON text or Arrow IPC bytes), written
        before the batch itself (``insert``): until then nothing reads them, and ``drop_orphans`` removes them
        if the server stops before."""
        self.store.executemany(
            "INSERT INTO batch_chunks(batch_id, idx, row_start, row_end, rows, state) VALUES(?,?,?,?,?,?)",
            [(batch.batch_id, c.idx, c.row_start, c.row_end, encoded[c.idx], c.state) for c in batch.chunks[first:end]],
        )

    def delete_chunks(self, batch_id: str) -> None:
        """The chunks of a batch that was refused after they were written."""
        self.store.execute("DELETE FROM batch_chunks WHERE batch_id=?", (batch_id,))

    def drop_orphans(self) -> None:
        """Chunks whose batch was never recorded (the server stopped while writing them): on start."""
        self.store.execute("DELETE FROM batch_chunks WHERE batch_id NOT IN (SELECT batch_id FROM batches)")

    def insert(self, batch: BatchRun) -> None:
        """A new batch, once its chunks are written (``insert_chunks``)."""
        self.store.execute(
            "INSERT INTO batches(batch_id, namespace, name, version, input_digest, state, spec, creation_ms) "
            "VALUES(?,?,?,?,?,?,?,?)",
            (
                batch.batch_id,
                batch.namespace,
                batch.name,
                batch.version,
                batch.digest,
                batch.state,
                dumps(batch.spec()),
                batch.creation_ms,
            ),
        )
        self.record(batch, batch.state, "created", at_ms=batch.creation_ms)

    def record(
        self,
        batch: BatchRun,
        state: str,
        by: str,
        *,
        at_ms: int | None = None,
        chunk: Chunk | None = None,
        job: JobRecord | None = None,
    ) -> None:
        """One change of the batch (``by``: what changed it), or of a ``chunk``'s ``job``, into its durable event
        log (``POST /v1/jobs/query_events`` on the batch's id; docs/ARCHITECTURE.md, "LanceDB 0.40 dialect")."""
        event: dict[str, Any] = {"state": state, "at_ms": at_ms or int(time.time() * 1000), "by": by}
        if chunk is None or job is None:
            event["rows"] = batch.rows_finished
        else:
            rows = chunk.rows if job.state == DONE else job.rows_done or 0
            event.update(rows=rows, chunk=chunk.idx, job_id=job.job_id)
        self.store.execute("INSERT INTO batch_events(batch_id, data) VALUES(?,?)", (batch.batch_id, dumps(event)))

    def events(self, batch_id: str, limit: int, *, after: int = 0) -> list[tuple[int, str]]:
        """``[(seq, data)]`` of a batch's recorded changes above sequence number ``after``, oldest first."""
        return self.store.query(
            "SELECT seq, data FROM batch_events WHERE batch_id=? AND seq>? ORDER BY seq LIMIT ?",
            (batch_id, after, limit),
        )

    def namespace(self, batch_id: str) -> tuple[bool, str | None]:
        """Whether the batch exists, and its namespace."""
        rows = self.store.query("SELECT namespace FROM batches WHERE batch_id=?", (batch_id,))
        return (True, rows[0][0]) if rows else (False, None)

    def save_batch(self, batch: BatchRun) -> None:
        self.store.execute(
            "UPDATE batches SET state=?, started_ms=?, finished_ms=?, cancel_requested=? WHERE batch_id=?",
            (batch.state, batch.started_ms, batch.finished_ms, int(batch.cancel_requested), batch.batch_id),
        )

    def save_spent(self, batch: BatchRun) -> None:
        """What the batch's ended chunk jobs spent, so a restart goes on counting from there."""
        self.store.execute("UPDATE batches SET spent=? WHERE batch_id=?", (dumps(batch.spent), batch.batch_id))

    def save_spec(self, batch: BatchRun) -> None:
        """The batch's spec again (it carries ``paused``, so a paused batch stays paused across a restart)."""
        self.store.execute("UPDATE batches SET spec=? WHERE batch_id=?", (dumps(batch.spec()), batch.batch_id))

    def save_chunk(self, batch: BatchRun, chunk: Chunk) -> None:
        self.store.execute(
            "UPDATE batch_chunks SET state=?, job_id=?, attempts=?, failure=? WHERE batch_id=? AND idx=?",
            (
                chunk.state,
                chunk.job_id,
                chunk.attempts,
                None if chunk.failure is None else dumps(chunk.failure),
                batch.batch_id,
                chunk.idx,
            ),
        )

    def save_chunks(self, batch: BatchRun, chunks: list[Chunk]) -> None:
        """``save_chunk`` of many chunks in one statement."""
        self.store.executemany(
            "UPDATE batch_chunks SET state=?, job_id=?, attempts=?, failure=? WHERE batch_id=? AND idx=?",
            [
                (c.state, c.job_id, c.attempts, None if c.failure is None else dumps(c.failure), batch.batch_id, c.idx)
                for c in chunks
            ],
        )

    def chunk_rows(self, batch_id: str, idx: int) -> list | bytes:
        """A chunk's rows as stored: JSON rows, or Arrow IPC bytes."""
        rows = self._rows(batch_id, idx)
        return rows if isinstance(rows, bytes) else json.loads(rows)

    def chunk_slice(self, batch_id: str, idx: int) -> TableSlice:
        """A backfill chunk's rows as stored: its slice of the table."""
        return TableSlice.from_json(self._rows(batch_id, idx))

    def _rows(self, batch_id: str, idx: int) -> str | bytes:
        return self.store.query("SELECT rows FROM batch_chunks WHERE batch_id=? AND idx=?", (batch_id, idx))[0][0]

    def find(self, namespace: str | None, name: str, version: str, digest: str) -> str | None:
        """The latest batch of this version over the same input, if any."""
        rows = self.store.query(
            "SELECT batch_id FROM batches WHERE name=? AND version=? AND input_digest=? AND namespace IS ? ORDER BY seq DESC LIMIT 1",
            (name, version, digest, namespace),
        )
        return rows[0][0] if rows else None

    def ids(self, *, scope: str | None, state: str | None, name: str | None, limit: int) -> list[str]:
        """Batch ids, newest first (``scope``: a namespace's key sees its own batches only)."""
        states = (state,) if state else None
        return [batch_id for _, batch_id in self.page(scope=scope, states=states, name=name, before=None, limit=limit)]

    def page(
        self, *, scope: str | None, states: tuple[str, ...] | None, name: str | None, before: int | None, limit: int
    ) -> list[tuple[int, str]]:
        """``(seq, batch_id)`` newest first, of sequence number below ``before`` when given (a page token's)."""
        clauses: list[str] = []
        args: list[Any] = []
        if scope is not None:
            clauses.append("namespace=?")
            args.append(scope)
        if states:
            clauses.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if name:
            clauses.append("name=?")
            args.append(name)
        if before is not None:
            clauses.append("seq<?")
            args.append(before)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        query = f"SELECT seq, batch_id FROM batches{where} ORDER BY seq DESC LIMIT ?"
        return [(row[0], row[1]) for row in self.store.query(query, (*args, limit))]

    def unfinished_ids(self) -> list[str]:
        rows = self.store.query(
            "SELECT batch_id FROM batches WHERE state IN (?,?) ORDER BY seq", (PENDING, IN_PROGRESS)
        )
        return [row[0] for row in rows]

    def ending(self, batch_id: str) -> tuple[str, int | None] | None:
        """``(state, finished_ms)`` as stored: whether a copy loaded earlier is still current."""
        rows = self.store.query("SELECT state, finished_ms FROM batches WHERE batch_id=?", (batch_id,))
        return (rows[0][0], rows[0][1]) if rows else None

    def load(self, batch_id: str) -> BatchRun | None:
        rows = self.store.query(
            "SELECT namespace, name, version, input_digest, state, spec, creation_ms, started_ms, finished_ms, "
            "cancel_requested, spent FROM batches WHERE batch_id=?",
            (batch_id,),
        )
        if not rows:
            return None
        namespace, name, version, digest, state, spec, creation_ms, started_ms, finished_ms, cancel_requested, spent = (
            rows[0]
        )
        spec = json.loads(spec)
        batch = BatchRun(
            batch_id=batch_id,
            name=name,
            version=version,
            digest=digest,
            state=state,
            parallel=spec.get("parallel"),
            retries=spec.get("retries", 0),
            timeout_s=spec.get("timeout_s"),
            creation_ms=creation_ms,
            chunks=[],
            namespace=namespace,
            started_ms=started_ms,
            finished_ms=finished_ms,
            cancel_requested=bool(cancel_requested),
            paused=bool(spec.get("paused")),
            init=spec.get("init"),
            spent=json.loads(spent) if spent else {},
            # Revisions only live in memory; starting from the clock keeps a client's last seen
            # revision older than any after a restart, so its long poll still returns on change.
            revision=time.time_ns() // 1000,
        )
        for idx, row_start, row_end, state, job_id, attempts, failure in self.store.query(
            "SELECT idx, row_start, row_end, state, job_id, attempts, failure FROM batch_chunks WHERE batch_id=? ORDER BY idx",
            (batch_id,),
        ):
            failure = None if failure is None else json.loads(failure)
            batch.add_chunk(Chunk(idx, row_start, row_end, state, job_id, attempts, 0, failure))
        return batch
