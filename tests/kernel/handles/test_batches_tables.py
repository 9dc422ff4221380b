"""`f.map(table, column=..., into=...)` over an embedded LanceDB table against a real control plane:
a backfill committed per chunk, resumed after the writing kernel is SIGKILLed (row count and values
checked against a plain loop), a map over a column without `into`, and bad input refused before
anything starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import lancedb
import pyarrow as pa
import pytest
from helpers import TESTS, wait_until

from lancefn_jupyter import api
from lancefn_jupyter.handles.table_map import TableMap
from lancefn_jupyter.session import _session as kernel_session  # tests reset the kernel's state


def text_len(text: str) -> int:
    import os

    gate = os.environ.get("LANCEFN_TEST_GATE")
    while gate and text.startswith("late") and not os.path.exists(gate):
        time.sleep(0.01)
    return len(text) * 2


def make_table(path, texts):
    db = lancedb.connect(str(path))
    return db.create_table("docs", pa.table({"id": list(range(len(texts))), "text": texts}))


@pytest.fixture
def cp(control_plane_factory, tmp_path):
    gate = tmp_path / "gate"
    cp = control_plane_factory(env={"LANCEFN_TEST_GATE": str(gate)})
    kernel_session.registered.clear()
    api.connect(cp.url, cp.api_key)
    cp.gate = gate
    return cp


def test_backfill_writes_a_new_column_matching_a_plain_loop(cp, tmp_path):
    texts = [f"row {i}" * (i % 3 + 1) for i in range(40)] + ["row 1"]  # a duplicate value too
    table = make_table(tmp_path / "db", texts)
    fn = api.gpu_function(num_gpus=1)(text_len)
    backfill = fn.map(table, column="text", into="n", parallel="auto", chunk_size=7)
    assert isinstance(backfill, TableMap)
    result = backfill.result()
    assert backfill.rows_written == 41 and result.count_rows() == 41
    got = dict(zip(*[result.to_arrow()[c].to_pylist() for c in ("id", "n")], strict=False))
    assert got == {i: text_len(t) for i, t in enumerate(texts)}
    assert result.schema.field("n").type == pa.int64()
    # Nothing left to write: a second map starts nothing.
    again = fn.map(table, column="text", into="n", parallel="auto")
    assert again.batch is None and again.result() is table


def test_map_over_a_column_without_into_returns_the_results(cp, tmp_path):
    table = make_table(tmp_path / "db", ["a", "bb", "ccc"])
    fn = api.gpu_function(num_gpus=1)(text_len)
    assert fn.map(table, column="text", parallel=2, chunk_size=1).result() == [2, 4, 6]
    assert "n" not in table.schema.names


def test_bad_table_input_is_refused_before_anything_starts(cp, tmp_path):
    table = make_table(tmp_path / "db", ["a", "bb"])
    table.add_columns(pa.field("label", pa.string()))
    fn = api.gpu_function(num_gpus=1)(text_len)
    with pytest.raises(ValueError, match="no column 'body'; its columns are id, text, label"):
        fn.map(table, column="body", into="n", parallel="auto")
    with pytest.raises(TypeError, match="column 'label' holds string but text_len returns int64"):
        fn.map(table, column="text", into="label", parallel="auto")
    with pytest.raises(ValueError, match="pass column="):
        fn.map(table, into="n", parallel="auto")
    with pytest.raises(TypeError, match="LanceDB table"):
        fn.map([1, 2], column="text", into="n")
    client = api.current_client()
    assert client.batches.list() == [] and client.jobs.list(job_type="run_function") == []
    assert table.schema.names == ["id", "text", "label"]


def written(db) -> int:
    table = lancedb.connect(str(db)).open_table("docs")
    return table.count_rows("n IS NOT NULL") if "n" in table.schema.names else 0


WRITER = """
import sys, lancedb
from lancefn_jupyter import api
sys.path[:0] = [{here!r}, {tests!r}]  # this module, and the helpers it imports
from test_batches_tables import text_len
api.connect({url!r}, {key!r})
table = lancedb.connect({db!r}).open_table("docs")
fn = api.gpu_function(num_gpus=1)(text_len)
fn.map(table, column="text", into="n", parallel="auto", chunk_size=5).result()
"""


def test_backfill_resumes_after_the_writer_is_killed(cp, tmp_path):
    texts = [f"early {i}" for i in range(10)] + [f"late {i}" for i in range(10)]
    table = make_table(tmp_path / "db", texts)
    script = WRITER.format(
        here=os.path.dirname(__file__), tests=str(TESTS), url=cp.url, key=cp.api_key, db=str(tmp_path / "db")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANCEFN_")}
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=env)
    try:
        # The two "early" chunks are committed; the "late" ones wait for the gate.
        wait_until(lambda: written(tmp_path / "db") == 10, "early chunks written")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    cp.gate.touch()
    fn = api.gpu_function(num_gpus=1)(text_len)
    resumed = fn.map(table, column="text", into="n", parallel="auto", chunk_size=5)
    assert resumed.rows_to_write == 10 and resumed.batch.snapshot.rows_total == 10
    resumed.result()
    assert table.count_rows() == 20 and table.count_rows("n IS NULL") == 0
    got = dict(zip(*[table.to_arrow()[c].to_pylist() for c in ("id", "n")], strict=False))
    assert got == {i: text_len(t) for i, t in enumerate(texts)}
