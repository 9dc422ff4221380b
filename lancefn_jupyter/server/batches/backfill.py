"""Backfills: a batch whose chunks are slices of a Lance table and whose results the control plane
commits back into it, one fragment at a time (docs/ARCHITECTURE.md, "Backfills").

This module holds what a backfill adds to a batch: the request checks and the plan
(:func:`prepare`), its state in memory (:class:`BackfillRun`, ``BatchRun.backfill``) and its tables
(:class:`BackfillStore`: ``backfills``, ``backfill_fragments``, ``backfill_errors``); its chunks'
results and the fragment commits are in ``commits.py``. ``manager.BatchManager`` drives it under the
job table's lock. pylance and pyarrow are imported only by a backfill.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lancefn_jupyter.server.control.states import IN_PROGRESS, PENDING
from lancefn_jupyter.server.encoding import dumps
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.storage.store import Store
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.backfill_models import BackfillRequest, BackfillSpec, Columns, TableSlice
from lancefn_jupyter.wire.models import FunctionVersion

__all__ = ["BACKFILL_SCHEMA", "BackfillRun", "BackfillStore", "Fragment", "Prepared", "prepare", "table_key"]

# Default chunk sizes (docs/ARCHITECTURE.md, "Backfills", "Which rows").
CHUNK_ROWS = {True: 1024, False: 256}

BACKFILL_SCHEMA = """
CREATE TABLE IF NOT EXISTS backfills(
    batch_id TEXT PRIMARY KEY,
    table_uri TEXT NOT NULL,
    into_column TEXT NOT NULL,
    spec TEXT NOT NULL,                -- BackfillSpec (wire/backfill_models.py)
    failure TEXT,                      -- the batch's own failure (skip_limit, commit), JSON
    commit_failure TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS backfills_by_target ON backfills(table_uri, into_column);
CREATE TABLE IF NOT EXISTS backfill_fragments(
    batch_id TEXT NOT NULL,
    fragment INTEGER NOT NULL,
    chunks TEXT NOT NULL,              -- JSON list of the chunk indexes cut from this fragment
    committed INTEGER NOT NULL DEFAULT 0,
    rows_written INTEGER NOT NULL DEFAULT 0,
    rows_skipped INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(batch_id, fragment)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS backfill_errors(
    batch_id TEXT NOT NULL,
    row_id INTEGER NOT NULL,
    fragment INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    message TEXT NOT NULL,
    traceback TEXT,
    version TEXT NOT NULL,
    chunk INTEGER NOT NULL,
    PRIMARY KEY(batch_id, row_id)
) WITHOUT ROWID;
"""


# ------------------------------------------------------------------------- state


@dataclass
class Fragment:
    chunks: list[int]
    committed: bool = False
    rows_written: int = 0
    rows_skipped: int = 0


@dataclass
class BackfillRun:
    """A backfill's state in memory (``BatchRun.backfill``)."""

    spec: BackfillSpec
    fragments: dict[int, Fragment]
    failure: dict | None = (
        None  # {phase: skip_limit | commit, message, chunk}: the batch failed for the backfill's sake
    )
    commit_failure: str | None = None
    skipped: dict[int, int] = field(default_factory=dict)  # DONE chunk → rows it skipped (until its fragment commits)
    committing: set[int] = field(default_factory=set)  # fragments queued for (or in) a commit

    fragment_of: dict[int, int] = field(init=False)  # chunk → its fragment

    def __post_init__(self) -> None:
        self.fragment_of = {idx: fid for fid, frag in self.fragments.items() for idx in frag.chunks}

    @property
    def rows_written(self) -> int:
        return sum(f.rows_written for f in self.fragments.values())

    @property
    def rows_skipped(self) -> int:
        return sum(f.rows_skipped for f in self.fragments.values()) + sum(self.skipped.values())

    def wire(self) -> dict:
        """The ``BatchBackfill`` wire form."""
        spec = self.spec
        wire: dict[str, Any] = {
            "table_uri": spec.uri,
            "table_version": spec.table_version,
            "into": spec.into,
            "version_column": spec.version_column,
            "columns": dict(spec.column_map()),
            "recompute": spec.recompute,
            "on_error": spec.on_error,
            "max_skip_fraction": spec.max_skip_fraction,
            "rows_skipped": self.rows_skipped,
            "rows_written": self.rows_written,
            "fragments_total": len(self.fragments),
            "fragments_committed": sum(f.committed for f in self.fragments.values()),
        }
        if spec.where:
            wire["where"] = spec.where
        if self.commit_failure:
            wire["commit_failure"] = self.commit_failure
        return wire


# ------------------------------------------------------------------------- store


class BackfillStore:
    """The backfill tables, next to the batches'; writes join the store's open transaction."""

    def __init__(self, store: Store):
        self.store = store
        store.executescript(BACKFILL_SCHEMA)

    def insert(self, batch_id: str, run: BackfillRun) -> None:
        spec = run.spec
        self.store.execute(
            "INSERT INTO backfills(batch_id, table_uri, into_column, spec) VALUES(?,?,?,?)",
            (batch_id, spec.uri, spec.into, dumps(spec.to_wire())),
        )
        self.store.executemany(
            "INSERT INTO backfill_fragments(batch_id, fragment, chunks) VALUES(?,?,?)",
            [(batch_id, fid, dumps(frag.chunks)) for fid, frag in run.fragments.items()],
        )

    def save(self, batch_id: str, run: BackfillRun) -> None:
        self.store.execute(
            "UPDATE backfills SET failure=?, commit_failure=? WHERE batch_id=?",
            (None if run.failure is None else dumps(run.failure), run.commit_failure, batch_id),
        )

    def save_fragment(self, batch_id: str, fid: int, frag: Fragment, errors: list[tuple]) -> None:
        self.store.execute(
            "UPDATE backfill_fragments SET committed=?, rows_written=?, rows_skipped=? WHERE batch_id=? AND fragment=?",
            (int(frag.committed), frag.rows_written, frag.rows_skipped, batch_id, fid),
        )
        self.store.executemany(
            "INSERT OR REPLACE INTO backfill_errors(batch_id, row_id, fragment, offset, message, traceback, version, chunk) "
            "VALUES(?,?,?,?,?,?,?,?)",
            [(batch_id, *error) for error in errors],
        )

    def load(self, batch_id: str) -> BackfillRun | None:
        rows = self.store.query("SELECT spec, failure, commit_failure FROM backfills WHERE batch_id=?", (batch_id,))
        if not rows:
            return None
        spec, failure, commit_failure = rows[0]
        fragments = {
            fid: Fragment(json.loads(chunks), bool(committed), written, skipped)
            for fid, chunks, committed, written, skipped in self.store.query(
                "SELECT fragment, chunks, committed, rows_written, rows_skipped FROM backfill_fragments "
                "WHERE batch_id=? ORDER BY fragment",
                (batch_id,),
            )
        }
        return BackfillRun(
            BackfillSpec.from_json(spec), fragments, None if failure is None else json.loads(failure), commit_failure
        )

    def unfinished(self, table_uri: str, into: str) -> str | None:
        """The unfinished backfill of ``into`` in ``table_uri``, if any (one at a time per column)."""
        rows = self.store.query(
            "SELECT f.batch_id FROM backfills f JOIN batches b ON b.batch_id = f.batch_id "
            "WHERE f.table_uri=? AND f.into_column=? AND b.state IN (?,?) LIMIT 1",
            (table_uri, into, PENDING, IN_PROGRESS),
        )
        return rows[0][0] if rows else None

    def errors(self, batch_id: str, offset: int, limit: int) -> tuple[list[dict], int]:
        total = self.store.query("SELECT COUNT(*) FROM backfill_errors WHERE batch_id=?", (batch_id,))[0][0]
        rows = self.store.query(
            "SELECT row_id, fragment, offset, message, traceback, version, chunk FROM backfill_errors "
            "WHERE batch_id=? ORDER BY row_id LIMIT ? OFFSET ?",
            (batch_id, limit, offset),
        )
        keys = ("row_id", "fragment", "offset", "message", "traceback", "version", "chunk")
        return [{k: v for k, v in zip(keys, row, strict=True) if v is not None} for row in rows], total


# ------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class Prepared:
    """A checked backfill request and its plan: the run's spec and each chunk's slice."""

    spec: BackfillSpec
    fragments: dict[int, list[int]]  # fragment → chunk indexes
    slices: list[TableSlice]
    digest: str


def table_key(uri: str) -> str:
    """One spelling per table, so the one-backfill-per-column rule sees through ``./`` and links."""
    return uri if "://" in uri else os.path.realpath(uri)


def _param_columns(fv: FunctionVersion, columns: Columns | str | None, table_columns: list[str]) -> Columns:
    """The request's ``columns`` (a mapping, a list by position, one column, or None) → {param: column}, or the
    column list of a ``record_batch`` function; 400s say what to pass."""
    params = fv.signature.inputs
    names = [p.name for p in params]
    if isinstance(columns, str):
        columns = (columns,)
    if len(params) == 1 and params[0].form == "record_batch":
        # A LanceDB RecordBatch UDF's batch is its struct's fields: those columns, by name ("LanceDB 0.40 dialect").
        fields = dataplane.struct_fields(params[0].arrow_type)
        if columns is None:
            return tuple(fields if fields is not None else table_columns)
        if not isinstance(columns, tuple) or not columns:
            raise ApiError(400, "columns must list the table columns the RecordBatch parameter receives")
        if fields is not None and sorted(columns) != sorted(fields):
            raise ApiError(
                400,
                f"columns must be the columns of {fv.name}'s RecordBatch, named like the fields of its struct "
                f"input_schema ({', '.join(fields)}); got {', '.join(columns)}",
            )
        return columns
    if columns is None:
        chosen = {n: n for n in names if n in table_columns}
    elif isinstance(columns, tuple):
        if not 1 <= len(columns) <= len(names):
            raise ApiError(
                400,
                f"columns must be a list of 1 to {len(names)} column names, matched to ({', '.join(names)}) by position",
            )
        chosen = dict(zip(names, columns, strict=False))
    else:
        unknown = sorted(set(columns) - set(names))
        if unknown:
            raise ApiError(
                400,
                f"columns maps parameters to column names; {fv.name} has no parameter(s) {', '.join(unknown)} "
                f"(it takes {', '.join(names)})",
            )
        chosen = dict(columns)
    missing = [p.name for p in params if p.name not in chosen and p.default is None]
    if missing:
        raise ApiError(
            400,
            f"no column for parameter(s) {', '.join(missing)} of {fv.name}; pass columns= "
            f"(the table has {', '.join(table_columns)})",
        )
    return chosen


def prepare(
    fv: FunctionVersion,
    request: BackfillRequest,
    uri: str,
    *,
    open_source: Callable[[str], Any] | None = None,
    root: str | None = None,
) -> Prepared:
    """Check a ``backfills/create`` request (its options checked already, as it was parsed) against the function
    and the table ``uri`` (its :func:`table_key`) and plan its rows. Every problem is an ApiError 400 saying what
    to change; nothing is created. ``open_source(uri)``: the table as a ``tables.plan.PlanSource`` (default: opened
    here); ``root``: the namespace's table root whose owner's agent does the I/O, kept in the spec and the slices
    ("Which tables"; None: the control plane does it)."""
    from lancefn_jupyter.tables.plan import PlanSource, TableError, sidecar_column
    from lancefn_jupyter.tables.types import input_problem, into_problem

    into = request.into
    output = fv.signature.output
    if output.kind != "scalar" or not output.arrow_type:
        raise ApiError(400, f"{fv.name} returns nothing a column can hold; give it a return annotation")
    chunk_size = request.chunk_size or CHUNK_ROWS[bool(fv.signature.batched)]
    try:
        source = (open_source or PlanSource)(uri)
        schema = source.schema
        columns = _param_columns(fv, request.columns, schema.names)
        used = list(columns.values()) if isinstance(columns, dict) else list(columns)
        sidecar = sidecar_column(into)
        unknown = [c for c in used if c not in schema.names]
        if unknown:
            raise ApiError(
                400, f"no column {', '.join(map(repr, unknown))} in the table; it has {', '.join(schema.names)}"
            )
        if into in used or sidecar in used:
            raise ApiError(400, f"into={into!r} is also an input column; write the results to another column")
        types = {p.name: p.arrow_type for p in fv.signature.inputs}
        if isinstance(columns, dict):
            for param, column in columns.items():
                problem = input_problem(param, types[param], column, schema.field(column).type, fv.signature.batched)
                if problem:
                    raise ApiError(400, problem)
        if into in schema.names:
            problem = into_problem(into, schema.field(into).type, output.arrow_type)
            if problem:
                raise ApiError(400, problem)
        if sidecar in schema.names and str(schema.field(sidecar).type) not in ("string", "large_string"):
            raise ApiError(400, f"column {sidecar!r} is not utf8; it is the backfill's version column: drop it")
        plan = source.plan(
            into=into, version=fv.version, recompute=request.recompute, where=request.where, chunk_size=chunk_size
        )
    except TableError as error:
        raise ApiError(400, str(error)) from None
    spec = BackfillSpec(
        uri=uri,
        table_version=plan.table_version,
        into=into,
        version_column=sidecar,
        columns=columns,
        where=request.where,
        recompute=request.recompute,
        on_error=request.on_error,
        max_skip_fraction=request.max_skip_fraction,
        input_types=types,
        output_type=output.arrow_type,
        table_root=root,
    )
    slices = [
        TableSlice(uri=uri, table_version=plan.table_version, columns=columns, root=root, **chunk)
        for chunk in plan.chunks
    ]
    fragments: dict[int, list[int]] = {}
    for idx, chunk in enumerate(plan.chunks):
        fragments.setdefault(chunk["fragment"], []).append(idx)
    digest = hashlib.sha256(dumps({"spec": spec.to_wire(), "slices": [s.to_wire() for s in slices]}).encode())
    return Prepared(spec, fragments, slices, "sha256:" + digest.hexdigest())
