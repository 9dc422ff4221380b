"""A backfill's tables (server/batches/backfill.py, ``BackfillStore``): a home an older server wrote (its spec names
the table ``table_uri``, a record_batch function's columns as a list) loads, and answers as it did; a new spec keeps
one name for the table, ``uri``, as its slices do (docs/ARCHITECTURE.md, "Backfills", "Store")."""

from __future__ import annotations

import json

import pytest

from lancefn_jupyter.server.batches.backfill import BackfillRun, BackfillStore, Fragment
from lancefn_jupyter.server.batches.store import BATCH_SCHEMA, BatchStore
from lancefn_jupyter.server.storage.store import Store
from lancefn_jupyter.wire.backfill_models import BackfillSpec
from lancefn_jupyter.wire.batch_models import BatchBackfill

pytestmark = pytest.mark.unit

OLD_SPEC = {
    "table_uri": "/data/docs.lance",
    "table_version": 3,
    "into": "n",
    "version_column": "n__lancefn_version",
    "columns": ["text", "label"],
    "where": "id > 2",
    "recompute": "stale",
    "on_error": "skip",
    "max_skip_fraction": 0.25,
    "input_types": {"batch": "arrow.record_batch"},
    "output_type": "utf8",
}


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "db.sqlite3")
    store.executescript(BATCH_SCHEMA)
    yield store
    store.close()


def test_an_older_homes_backfill_loads_and_answers_as_before(store):
    backfills = BackfillStore(store)
    with store.batch():
        store.execute(
            "INSERT INTO backfills(batch_id, table_uri, into_column, spec) VALUES(?,?,?,?)",
            ("b1", OLD_SPEC["table_uri"], "n", json.dumps(OLD_SPEC)),
        )
        store.execute("INSERT INTO backfill_fragments(batch_id, fragment, chunks) VALUES('b1', 0, '[0, 1]')")
    run = backfills.load("b1")
    assert run is not None and run.spec.uri == "/data/docs.lance"
    assert run.wire() == {
        "table_uri": "/data/docs.lance",
        "table_version": 3,
        "into": "n",
        "version_column": "n__lancefn_version",
        "columns": {"text": "text", "label": "label"},
        "where": "id > 2",
        "recompute": "stale",
        "on_error": "skip",
        "max_skip_fraction": 0.25,
        "rows_skipped": 0,
        "rows_written": 0,
        "fragments_total": 1,
        "fragments_committed": 0,
    }
    BatchBackfill.from_wire(run.wire())  # the reply's model reads it


def test_a_new_spec_names_the_table_uri_once(store):
    backfills = BackfillStore(store)
    spec = BackfillSpec.from_wire(OLD_SPEC)
    with store.batch():
        backfills.insert("b2", BackfillRun(spec, {0: Fragment([0])}))
    (stored, column), *_ = store.query("SELECT spec, table_uri FROM backfills WHERE batch_id='b2'")
    assert json.loads(stored)["uri"] == column == "/data/docs.lance" and "table_uri" not in json.loads(stored)
    loaded = backfills.load("b2")
    assert loaded is not None and loaded.spec == spec


def test_a_stored_chunk_is_read_back_as_its_slice(store):
    saved = BatchStore(store)
    piece = {"uri": "/data/docs.lance", "table_version": 3, "fragment": 0, "ranges": [[0, 4]], "columns": ["text"]}
    with store.batch():
        store.execute(
            "INSERT INTO batch_chunks(batch_id, idx, row_start, row_end, rows, state) VALUES('b3', 0, 0, 4, ?, 'PENDING')",
            (json.dumps(piece),),
        )
    table_slice = saved.chunk_slice("b3", 0)
    assert table_slice.ranges == ((0, 4),) and table_slice.columns == ("text",) and table_slice.to_wire() == piece


def test_a_home_from_before_batch_spending_was_saved_opens_and_saves_it_from_then_on(tmp_path):
    """The ``batches`` table without its ``spent`` column (an older server's) gains it on open: its batches load with
    nothing spent yet, and what their chunks spend from then on is saved and loads again."""
    from lancefn_jupyter.server.batches.state import BatchRun

    path = tmp_path / "old.sqlite3"
    store = Store(path)
    batches = BatchStore(store)
    batch = BatchRun(
        batch_id="b1",
        name="f",
        version="v",
        digest="d",
        state="IN_PROGRESS",
        parallel=None,
        retries=0,
        timeout_s=None,
        creation_ms=1_000,
        chunks=[],
    )
    with store.batch():
        batches.insert(batch)
    store.execute("ALTER TABLE batches DROP COLUMN spent")  # the table as it was
    store.close()
    store = Store(path)
    batches = BatchStore(store)
    loaded = batches.load("b1")
    assert loaded is not None and loaded.spent == {} and loaded.state == "IN_PROGRESS"
    loaded.add_spent({"held_s": 1.5, "gpu_seconds": 1.5, "cost": 0.25, "currency": "EUR"}, rows=4)
    batches.save_spent(loaded)
    store.close()
    again = BatchStore(Store(path)).load("b1")
    assert again is not None
    assert again.spent == {"held_s": 1.5, "gpu_seconds": 1.5, "cost": 0.25, "currency": "EUR", "rows": 4}
