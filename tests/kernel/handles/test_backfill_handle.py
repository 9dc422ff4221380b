"""`f.map(table, column=…, into=…)` against a real control plane: the `Backfill` handle (docs/ARCHITECTURE.md,
"Backfills"): values committed by the control plane match a plain loop (a per-row function, and a batched one
into a vector column that LanceDB searches), rows added later done by the default missing rule and `where=`,
a failing row skipped with `on_error="skip"` and listed by `errors()` and the card, a backfill started by a
script that exits and attached from here by its batch id, `key=` refused loudly, a map without `into`, and bad
input that starts nothing.

One control plane for the module; rows that must keep a backfill running wait for a gate file the test creates
(in a world-readable directory: the workers run as ``nobody``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from helpers import TESTS, batch_record
from numpy.typing import NDArray

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client import InvalidRequest
from lancefn_jupyter.kernel.handles.batch import Batch
from lancefn_jupyter.kernel.handles.table_map import Backfill
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.kernel.widgets import BatchWidget, set_widgets


def text_len(text: str) -> int:
    if not text:
        raise ValueError("empty text")
    return len(text) * 2


def gated_len(text: str, gate: str) -> int:
    import os
    import time

    while gate and not os.path.exists(gate):
        time.sleep(0.01)
    return len(text) * 2


def embed(text: list[str]) -> NDArray[np.float32]:
    """Each text's CRC-32 as 4 bytes: (n, 4) float32, distinct per text (so the nearest row is the text itself)."""
    import zlib

    import numpy as np

    codes = np.array([zlib.crc32(t.encode()) for t in text], dtype=np.uint32)
    return np.stack([(codes >> shift) & 0xFF for shift in (0, 8, 16, 24)], axis=1).astype(np.float32)


@pytest.fixture(scope="module")
def cp(shared_control_plane):
    set_widgets(False)  # text cards: what the tests read
    kernel_session.registered.clear()
    api.connect(shared_control_plane.url, shared_control_plane.api_key)
    yield shared_control_plane
    set_widgets(None)


@pytest.fixture
def shared_dir():
    """A directory the workers (user ``nobody``) can read."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="lancefn-backfill-"))
    path.chmod(0o755)
    return path


def make_table(path: Path, texts: list[str], **columns):
    db = lancedb.connect(str(path))
    return db.create_table("docs", pa.table({"id": list(range(len(texts))), "text": texts, **columns}))


def by_id(table, column: str) -> dict:
    data = table.to_arrow()
    return dict(zip(data["id"].to_pylist(), data[column].to_pylist(), strict=True))


def test_backfill_writes_the_column_in_the_control_plane_and_later_rows_by_missing_and_where(cp, tmp_path):
    texts = [f"row {i}" * (i % 3 + 1) for i in range(40)] + ["row 1"]  # a duplicate value too
    table = make_table(tmp_path / "db", texts)
    fn = api.gpu_function(num_gpus=1)(text_len)
    backfill = fn.map(table, column="text", into="n", parallel="auto", chunk_size=7)
    assert isinstance(backfill, Backfill) and isinstance(backfill.batch, Batch)
    result = backfill.result()
    assert result is table and backfill.rows_total == 41
    assert backfill.rows_written == 41 and backfill.rows_skipped == 0 and backfill.errors() == []
    assert by_id(result, "n") == {i: text_len(t) for i, t in enumerate(texts)}
    assert result.schema.field("n").type == pa.int64()
    assert set(result.to_arrow()["n__lancefn_version"].to_pylist()) == {fn.version.version}
    assert "41/41 rows written" in repr(backfill)

    # Nothing left to do: a DONE batch of no rows.
    again = fn.map(table, column="text", into="n", parallel="auto")
    assert again.rows_total == 0 and again.batch.snapshot.batch_state.value == "DONE"
    assert again.result() is table

    # Rows added later: the default rule ("into is null") picks exactly them; where= narrows it further.
    table.add(pa.table({"id": [100, 101, 102], "text": ["abc", "de", "f"]}))
    narrow = fn.map(table, column="text", into="n", where="id >= 101", parallel="auto")
    narrow.result()
    assert narrow.rows_total == 2
    assert table.count_rows("n IS NULL") == 1 and by_id(table, "n")[101] == 4
    rest = fn.map(table, column="text", into="n", parallel="auto")
    rest.result()
    assert rest.rows_total == 1 and table.count_rows("n IS NULL") == 0 and table.count_rows() == 44


def test_a_batched_function_fills_a_vector_column_that_search_uses(cp, tmp_path):
    texts = [f"text number {i}" for i in range(300)]
    table = make_table(tmp_path / "db", texts)
    fn = api.gpu_function(num_gpus=1, batched=True)(embed)
    fn.map(table, column="text", into="vec", parallel="auto", chunk_size=64).result()
    assert table.schema.field("vec").type == pa.list_(pa.float32(), 4)
    got = np.array(table.to_arrow().sort_by("id")["vec"].to_pylist(), dtype=np.float32)
    np.testing.assert_array_equal(got, embed(texts))
    hits = table.search(embed(["text number 7"])[0], vector_column_name="vec").limit(1).to_arrow()
    assert hits["text"].to_pylist() == ["text number 7"]


def chunk_doubled(x: NDArray[np.float32]) -> list[float]:
    """A batched function over a column of numbers: the chunk's values come as one 1-D array."""
    if x.ndim != 1 or x.dtype != np.float32:
        raise TypeError(f"expected a 1-D float32 array, got {x.ndim}-D {x.dtype}")
    return [float(v) * 2 for v in x]


def test_a_batched_ndarray_parameter_takes_a_column_of_numbers_as_one_1d_array(cp, tmp_path):
    table = make_table(tmp_path / "db", ["a", "b", "c", "d"], score=[0.5, 1.5, 2.5, 4.0])
    fn = api.gpu_function(num_gpus=1, batched=True)(chunk_doubled)
    fn.map(table, column="score", into="twice", parallel="auto").result()
    assert by_id(table, "twice") == {0: 1.0, 1: 3.0, 2: 5.0, 3: 8.0}
    per_row = api.gpu_function(num_gpus=1, name="per_row_doubled")(chunk_doubled)
    with pytest.raises(InvalidRequest, match="an ndarray parameter needs a list or fixed_size_list column"):
        per_row.map(table, column="score", into="again", parallel="auto")


def test_on_error_skip_leaves_the_bad_row_null_and_lists_it(cp, tmp_path):
    texts = ["a", "bb", "", "dddd", "eeeee"]
    table = make_table(tmp_path / "db", texts)
    fn = api.gpu_function(num_gpus=1)(text_len)
    backfill = fn.map(table, column="text", into="n", on_error="skip", max_skip_fraction=0.5, parallel="auto")
    backfill.result()
    assert backfill.rows_written == 4 and backfill.rows_skipped == 1
    assert by_id(table, "n") == {0: 2, 1: 4, 2: None, 3: 8, 4: 10}
    (error,) = backfill.errors()
    assert (error.fragment, error.offset, error.row_id) == (0, 2, 2)
    assert "empty text" in error.message and error.version == fn.version.version
    assert "text_len" in (error.traceback or "")
    card = repr(backfill)
    assert "4/5 rows written · 1 row skipped" in card and "skipped row 2 (fragment 0, offset 2)" in card
    assert "empty text" in card
    widget = BatchWidget(backfill.batch_id, start=False)  # what the notebook (and `%gpu_jobs`) shows
    assert "4/5 rows written · 1 row skipped" in widget.backfill.value and "empty text" in widget.backfill.value
    widget.close()
    # The bound: more skipped rows than max_skip_fraction allows fail the backfill, saying why.
    strict = make_table(tmp_path / "db2", ["", "", "x", "y"])
    failing = fn.map(strict, column="text", into="n", on_error="skip", max_skip_fraction=0.1, parallel="auto")
    with pytest.raises(api.BatchError, match=r"backfill\.errors\(\)"):
        failing.result()
    assert failing.batch.snapshot.failure.phase == "skip_limit"


def embed_strict(text: list[str]) -> NDArray[np.float32]:
    """`embed`, refusing an empty text anywhere in its chunk (so the worker must bisect to the bad row)."""
    import zlib

    import numpy as np

    if any(not t for t in text):
        raise ValueError("empty text in the chunk")
    codes = np.array([zlib.crc32(t.encode()) for t in text], dtype=np.uint32)
    return np.stack([(codes >> shift) & 0xFF for shift in (0, 8, 16, 24)], axis=1).astype(np.float32)


def test_one_bad_row_in_ten_thousand_is_skipped_by_a_batched_function(cp, tmp_path):
    texts = [f"text number {i}" for i in range(10_000)]
    texts[6_543] = ""
    table = make_table(tmp_path / "db", texts)
    fn = api.gpu_function(num_gpus=1, batched=True)(embed_strict)
    backfill = fn.map(table, column="text", into="vec", on_error="skip", parallel="auto")
    backfill.result()
    assert (backfill.rows_total, backfill.rows_written, backfill.rows_skipped) == (10_000, 9_999, 1)
    (error,) = backfill.errors()
    assert (error.fragment, error.offset, error.row_id) == (0, 6_543, 6_543)
    assert "empty text in the chunk" in error.message and error.version == fn.version.version
    data = table.to_arrow().sort_by("id")
    vectors = data["vec"].to_pylist()
    assert vectors[6_543] is None and sum(v is None for v in vectors) == 1
    good = [i for i in range(10_000) if i != 6_543]
    got = np.array([vectors[i] for i in good], dtype=np.float32)
    np.testing.assert_array_equal(got, embed([texts[i] for i in good]))


STARTER = """
import sys, lancedb
from lancefn_jupyter.kernel import api
sys.path[:0] = [{here!r}, {tests!r}]  # this module, and the helpers it imports
from test_backfill_handle import gated_len
api.connect({url!r}, {key!r})
table = lancedb.connect({db!r}).open_table("docs")
fn = api.gpu_function(num_gpus=1)(gated_len)
backfill = fn.map(table, column=["text", "gate"], into="n", parallel="auto", chunk_size=5)
print("BATCH", backfill.batch_id, flush=True)
"""


def test_a_backfill_outlives_the_script_that_started_it_and_is_attached_by_id(cp, tmp_path, shared_dir):
    gate = str(shared_dir / "gate")
    texts = [f"text {i}" for i in range(20)]
    make_table(tmp_path / "db", texts, gate=[gate] * 20)
    script = STARTER.format(
        here=os.path.dirname(__file__), tests=str(TESTS), url=cp.url, key=cp.api_key, db=str(tmp_path / "db")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANCEFN_")}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    batch_id = done.stdout.split("BATCH ")[1].split()[0]
    attached = Backfill.attach(batch_id)
    assert attached.into == "n" and attached.rows_total == 20 and attached.state in ("pending", "running")
    Path(gate).touch()
    table = attached.result(timeout=120)
    assert table.count_rows("n IS NULL") == 0
    assert by_id(table, "n") == {i: len(t) * 2 for i, t in enumerate(texts)}
    with pytest.raises(ValueError, match="is not a backfill; attach to it with Batch.attach"):
        Backfill.attach(api.gpu_function(num_gpus=1)(text_len).map(["x"], parallel=2).batch_id)


def test_key_is_ignored_with_a_warning_and_a_map_without_into_returns_values(cp, tmp_path):
    table = make_table(tmp_path / "db", ["a", "bb", "ccc"])
    fn = api.gpu_function(num_gpus=1)(text_len)
    with pytest.warns(FutureWarning, match=r"key='id'\) is ignored: a backfill matches rows by their row id"):
        batch = fn.map(table, column="text", key="id", parallel=2, chunk_size=1)
    assert isinstance(batch, Batch) and batch.result() == [2, 4, 6]
    assert "n" not in table.schema.names


def test_bad_input_is_refused_before_anything_starts(cp, tmp_path):
    table = make_table(tmp_path / "db", ["a", "bb"], label=["x", "y"])
    fn = api.gpu_function(num_gpus=1)(text_len)
    client = api.current_client()
    before = len(client.batches.list())
    with pytest.raises(ValueError, match="no column 'body'; its columns are id, text, label"):
        fn.map(table, column="body", into="n")
    with pytest.raises(ValueError, match="into='text' is also an input column"):
        fn.map(table, column="text", into="text")
    with pytest.raises(ValueError, match="recompute must be one of 'missing', 'stale', 'all'"):
        fn.map(table, column="text", into="n", recompute="some")
    with pytest.raises(ValueError, match="on_error must be 'fail'"):
        fn.map(table, column="text", into="n", on_error="ignore")
    with pytest.raises(ValueError, match="max_skip_fraction must be a number from 0 to 1"):
        fn.map(table, column="text", into="n", max_skip_fraction=2)
    with pytest.raises(ValueError, match="column= lists 2 column"):
        fn.map(table, column=["text", "label"], into="n")
    with pytest.raises(ValueError, match="no column named like parameter 'gate' of gated_len"):
        api.gpu_function(num_gpus=1)(gated_len).map(table, into="n")
    with pytest.raises(TypeError, match="takes a LanceDB table"):
        fn.map([1, 2], column="text", into="n")
    # What only the control plane checks: the result type against an existing column.
    with pytest.raises(InvalidRequest, match="label"):
        fn.map(table, column="text", into="label")
    assert len(client.batches.list()) == before
    assert table.schema.names == ["id", "text", "label"]


@pytest.mark.parametrize(
    "bad",
    [{"recompute": "some"}, {"on_error": "ignore"}, {"max_skip_fraction": 2.0}, {"retries": 11}, {"chunk_size": 0}],
)
def test_the_kernel_and_the_server_refuse_a_bad_option_in_the_same_words(cp, tmp_path, bad):
    """One check of the options (wire/backfill_models.py): before anything is sent, and on a body sent as it is."""
    table = make_table(tmp_path / "db", ["a"])
    fn = api.gpu_function(num_gpus=1)(text_len)
    with pytest.raises(ValueError) as kernel:
        fn.map(table, column="text", into="n", **bad)
    version = fn.register()
    body = {"name": version.name, "version": version.version, "table_uri": table.uri, "into": "n", **bad}
    with pytest.raises(InvalidRequest) as server:
        api.current_client().backfills.create(body)
    assert server.value.message == f"invalid request: {kernel.value}"


def text_and_label(batch: pa.RecordBatch) -> pa.Array:
    """The record-batch form: the chunk's named columns in, one utf8 value per row out."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(batch.column("text"), batch.column("label"), pa.scalar("/"))


def shout(text: pa.Array) -> pa.Array:
    """The Arrow form: the column as a `pyarrow.Array`, out as one."""
    import pyarrow.compute as pc

    return pc.utf8_upper(text)


def test_record_batch_and_arrow_forms_backfill_a_column(cp, tmp_path):
    texts = [f"t{i}" for i in range(40)]
    table = make_table(tmp_path / "db", texts, label=[f"l{i % 3}" for i in range(40)])
    joined = api.gpu_function(num_gpus=1, batched=True)(text_and_label)
    joined.map(table, column=["text", "label"], into="joined", parallel="auto", chunk_size=16).result()
    assert by_id(table, "joined") == {i: f"t{i}/l{i % 3}" for i in range(40)}
    upper = api.gpu_function(num_gpus=1, batched=True)(shout)
    upper.map(table, column="text", into="upper", parallel="auto", chunk_size=16).result()
    assert table.schema.field("upper").type == pa.string()
    assert by_id(table, "upper") == {i: f"T{i}" for i in range(40)}


class BrokenModel:
    """A model whose weights never load: `setup` fails on every worker."""

    def setup(self):
        raise RuntimeError("the weights file is missing")

    def __call__(self, text: str) -> int:
        return len(text)


def test_a_failing_setup_fails_the_backfill_with_the_setup_error(cp, tmp_path):
    table = make_table(tmp_path / "db", [f"t{i}" for i in range(12)])
    fn = api.gpu_function(num_gpus=1)(BrokenModel)
    backfill = fn.map(table, column="text", into="n", parallel="auto", chunk_size=3)
    with pytest.raises(api.BatchError) as raised:
        backfill.result(timeout=120)
    message = str(raised.value)
    assert "the weights file is missing" in message and "phase setup" in message, message
    assert "was cancelled" not in message.split(";")[0]
    assert "n" not in table.schema.names or table.count_rows("n IS NOT NULL") == 0


def test_the_failure_named_is_the_failed_chunk_not_one_cancelled_after_it(cp):
    """Chunk 0 was cancelled because chunk 1 failed: the message names chunk 1's error (a race otherwise decides)."""
    from lancefn_jupyter.wire.batch_models import BatchChunk
    from lancefn_jupyter.wire.models import JobState

    chunks = (
        BatchChunk(index=0, row_start=0, row_end=3, state=JobState.CANCELLED),
        BatchChunk(
            index=1,
            row_start=3,
            row_end=6,
            state=JobState.FAILED,
            failure={"phase": "setup", "message": "RuntimeError: the weights file is missing"},
        ),
    )
    snapshot = batch_record(batch_state=JobState.FAILED, chunks_total=2, chunks=chunks)
    with pytest.raises(api.BatchError, match=r"chunk 1 \(rows 3–5\) failed in phase setup: RuntimeError: the weights"):
        Batch("b1", client=api.current_client(), snapshot=snapshot).raise_failure(snapshot)


def test_a_commit_waiting_for_its_fragments_chunks_lets_a_cancel_through(cp, tmp_path, shared_dir):
    """The commit of a fragment starts with its first chunk and takes the others as they finish; cancelled
    while it waits for a gated chunk, the backfill ends CANCELLED with nothing half-written, and a later map
    of the same column does every row."""
    gate = str(shared_dir / "gate")
    texts = [f"text {i}" for i in range(20)]
    table = make_table(tmp_path / "db", texts, gate=[""] * 10 + [gate] * 10)  # one fragment
    fn = api.gpu_function(num_gpus=1)(gated_len)
    backfill = fn.map(table, column=["text", "gate"], into="n", parallel="auto", chunk_size=5)
    client = api.current_client()

    def first_chunks_done() -> bool:
        chunks = client.batches.describe(backfill.batch_id).chunks or ()
        return sum(c.state.value == "DONE" for c in chunks) >= 2

    from helpers import wait_until

    wait_until(first_chunks_done, "the ungated chunks to finish")
    backfill.cancel()
    with pytest.raises(api.BatchError, match="cancelled"):
        backfill.result(timeout=60)
    assert backfill.rows_written == 0
    table.checkout_latest()
    assert "n" not in table.schema.names or table.count_rows("n IS NOT NULL") == 0
    Path(gate).touch()
    again = fn.map(table, column=["text", "gate"], into="n", parallel="auto", chunk_size=5).result(timeout=120)
    assert by_id(again, "n") == {i: len(t) * 2 for i, t in enumerate(texts)}


def test_a_backfill_pauses_keeps_its_written_rows_and_resumes(cp, tmp_path):
    from helpers import wait_until

    gate = str(tmp_path / "gate")
    table = make_table(tmp_path / "db", [f"t{i}" for i in range(4)], gate=[gate] * 4)
    fn = api.gpu_function(num_gpus=1)(gated_len)
    backfill = fn.map(table, column=["text", "gate"], into="n", parallel=1, chunk_size=1)
    wait_until(lambda: backfill.batch.refresh().chunk_counts.get("IN_PROGRESS") == 1, "the first chunk runs")
    assert backfill.pause() is True
    Path(gate).touch()
    wait_until(lambda: backfill.batch.refresh().chunk_counts.get("DONE") == 1, "the running chunk ends")
    snapshot = backfill.batch.refresh()
    assert snapshot.paused and snapshot.chunk_counts == {"DONE": 1, "PENDING": 3} and backfill.batch.state == "paused"
    assert backfill.resume() is True
    backfill.result()
    assert by_id(table, "n") == {i: 4 for i in range(4)}


def weighted(batch: pa.RecordBatch) -> pa.Array:
    """A LanceDB 0.40 RecordBatch UDF: the chunk's columns as one RecordBatch."""
    import pyarrow.compute as pc

    return pc.multiply(batch.column("x"), batch.column("w"))


def test_a_lancedb_record_batch_udf_backfills_from_its_structs_columns(cp, tmp_path):
    from lancedb.functions import udf

    struct = pa.struct([pa.field("x", pa.float64()), pa.field("w", pa.float64())])
    client = lancedb.connect("db://lancefn", api_key=cp.api_key, host_override=cp.url)
    fv = client.create_function(
        udf(weighted, input_schema=pa.schema([pa.field("batch", struct)]), output_schema=pa.float64())
    )
    function = api.lookup(f"weighted@{fv.metadata['lancefn.version']}")
    table = make_table(tmp_path / "db", [f"t{i}" for i in range(10)], x=[float(i) for i in range(10)], w=[2] * 10)
    function.map(table, into="xw", chunk_size=4).result()  # the struct's fields are the columns read, cast to float64
    assert by_id(table, "xw") == {i: 2.0 * i for i in range(10)}
    with pytest.raises(InvalidRequest, match=r"columns must be the columns of weighted's RecordBatch, named like the"):
        function.map(table, column=["x", "text"], into="bad")
