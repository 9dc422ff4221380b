"""`f.map(..., parallel=…)` from Python against a real control plane: the Batch handle (results in
input order and as the input's kind, as_completed, failures with the remote traceback, retry_failed,
resume by re-running, cancel), its widget and text fallback, and bad input that starts nothing.

Functions that must keep running wait for a file the test creates; nothing asserts on timing.
"""

from __future__ import annotations

import ipywidgets
import numpy as np
import pytest
from helpers import gated, wait_until

import lancefn_jupyter.kernel.session as session_module
from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.display.batch import batch_card, strip_cells
from lancefn_jupyter.kernel.handles.batch import Batch, BatchChunkError, BatchError
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.kernel.widgets import set_widgets, stop_listener


def square(x: float) -> float:
    return x * x


@pytest.fixture
def cp(control_plane_factory):
    stop_listener()
    session_module._listener = None
    set_widgets(None)
    cp = control_plane_factory()
    kernel_session.registered.clear()
    api.connect(cp.url, cp.api_key)
    yield cp
    stop_listener()
    session_module._listener = None
    ipywidgets.Widget.close_all()


@pytest.fixture
def gate(cp):
    return api.gpu_function(num_gpus=1)(gated)


def rows(tmp_path, values, gate_of=lambda i: i):
    return [(str(tmp_path / f"g{gate_of(i)}"), v) for i, v in enumerate(values)]


def open_all(tmp_path, n):
    for i in range(n):
        (tmp_path / f"g{i}").touch()


def test_default_map_is_still_one_job_and_parallel_makes_a_batch(cp, gate, tmp_path):
    open_all(tmp_path, 3)
    job = gate.map(rows(tmp_path, [1, 2, 3]))
    assert isinstance(job, api.Job) and job.result() == [10, 20, 30]
    batch = gate.map(rows(tmp_path, [1, 2, 3]), parallel="auto", chunk_size=1)
    assert isinstance(batch, Batch) and batch.result() == [10, 20, 30]
    assert batch.snapshot.chunks_total == 3 and batch.progress == (3, 3)


def test_results_in_input_order_and_as_completed_as_chunks_finish(cp, gate, tmp_path):
    values = list(range(8))
    batch = gate.map(rows(tmp_path, values, gate_of=lambda i: i // 2), parallel="auto", chunk_size=2)
    seen = []
    stream = batch.as_completed()
    for chunk in (1, 2, 0, 3):  # out of order (2 GPUs: chunk 2 starts once 1 ends); each arrives as it finishes
        (tmp_path / f"g{chunk}").touch()
        seen.extend([next(stream), next(stream)])
        assert [i for i, _ in seen[-2:]] == [2 * chunk, 2 * chunk + 1]
    assert list(stream) == []
    assert sorted(seen) == [(i, 10 * i) for i in values]
    assert batch.result() == [10 * i for i in values]


def test_numpy_in_numpy_out(cp):
    sq = api.gpu_function(num_gpus=1)(square)
    data = np.arange(10, dtype=np.float64)
    out = sq.map(data, parallel=2, chunk_size=3).result()
    assert isinstance(out, np.ndarray) and out.tolist() == (data * data).tolist()


def test_failure_names_chunk_and_rows_with_traceback_then_retry_failed(cp, gate, tmp_path):
    open_all(tmp_path, 6)
    batch = gate.map(rows(tmp_path, [1, 2, 3, -4, 5, 6]), parallel="auto", chunk_size=2)
    with pytest.raises(BatchError) as raised:
        batch.result()
    text = str(raised.value)
    assert "chunk 1 (rows 2–3) failed in phase run" in text and "value -4 is negative" in text
    assert "ValueError" in raised.value.remote_traceback and "2 of 3 chunks finished" in text
    partial = batch.result(return_exceptions=True)
    assert partial[:2] == [10, 20] and partial[4:] == [50, 60]
    assert all(isinstance(v, BatchChunkError) and v.chunk == 1 for v in partial[2:4])
    assert "failed" in repr(batch) and "chunk 1 (rows 2–3)" in repr(batch)

    (tmp_path / "g3.fixed").touch()
    assert batch.retry_failed().result() == [10, 20, 30, -40, 50, 60]


def test_rerunning_the_same_map_reuses_finished_chunks_unless_fresh(cp, gate, tmp_path):
    open_all(tmp_path, 4)
    items = rows(tmp_path, [1, -2, 3, 4])
    first = gate.map(items, parallel="auto", chunk_size=2)
    assert first.wait().state == "failed"
    (tmp_path / "g1.fixed").touch()
    again = gate.map(items, parallel="auto", chunk_size=2)
    assert again.batch_id == first.batch_id and again.reused_chunks == 1
    assert again.result() == [10, -20, 30, 40]
    fresh = gate.map(items, parallel="auto", chunk_size=2, fresh=True)
    assert fresh.batch_id != first.batch_id and fresh.result() == [10, -20, 30, 40]


def test_cancel_stops_pending_and_running_chunks(cp, gate, tmp_path):
    batch = gate.map(rows(tmp_path, list(range(4))), parallel="auto", chunk_size=1)
    wait_until(lambda: batch.refresh().strip == "rrpp", "two running, two waiting")
    assert batch.cancel() is True
    assert batch.wait().state == "cancelled" and batch.snapshot.strip == "cccc"
    with pytest.raises(BatchError, match="was cancelled"):
        batch.result()


def test_bad_input_is_refused_before_anything_starts(cp, gate, tmp_path):
    cases = [
        (dict(items=[], parallel="auto"), ValueError, "at least one item"),
        (dict(items=[("p", 1)], parallel=0), ValueError, "parallel must be 'auto' or a whole number ≥ 1"),
        (dict(items=[("p", 1)], parallel="many"), ValueError, "parallel"),
        (
            dict(items=[("p", 1), ("q", 2)], parallel="auto", chunk_size=3),
            ValueError,
            "chunk_size=3 is larger than the input (2 rows)",
        ),
        (dict(items=[("p", 1)], parallel="auto", chunk_size=0), ValueError, "chunk_size"),
        (dict(items=[("p", 1)], parallel="auto", retries=-1), ValueError, "retries"),
        (dict(items=[("p", 1, 2)], parallel="auto"), TypeError, "too many positional arguments"),
    ]
    for kwargs, error, needle in cases:
        items = kwargs.pop("items")
        with pytest.raises(error) as raised:
            gate.map(items, **kwargs)
        assert needle in str(raised.value), (needle, str(raised.value))
    client = api.current_client()
    assert client.batches.list() == [] and client.jobs.list(job_type="run_function") == []


def test_batch_widget_follows_the_batch_and_text_fallback_reads_well(cp, gate, tmp_path):
    from lancefn_jupyter.kernel.widgets import BatchWidget

    batch = gate.map(rows(tmp_path, list(range(6)), gate_of=lambda i: i // 2), parallel="auto", chunk_size=2)
    widget = BatchWidget(batch.batch_id, function=gate)
    wait_until(lambda: widget.snapshot.strip == "rrp", "two chunks running")
    assert widget.state == "running" and widget.progress.max == 6
    (tmp_path / "g0").touch()
    wait_until(lambda: widget.progress.value == 2, "first chunk's rows counted")
    assert "2/6 rows (33%)" in widget.progress_label.value and "rows/s" in widget.progress_label.value
    # Row progress may arrive before the chunk's own finished state: wait for the strip too.
    wait_until(lambda: widget.strip.value.count("lancefn-chunk-finished") == 1, "first chunk shown finished")
    widget.cancel()
    wait_until(lambda: widget.state == "cancelled", "cancelled")
    assert widget.cancel_button.disabled and widget.retry_button.layout.display is None
    text = repr(widget)
    assert text.startswith(f"Batch {batch.batch_id} gated@") and "2/6 rows" in text and "chunks [dcc]" in text
    # Folding: a long strip keeps the most urgent state of each cell.
    assert strip_cells("d" * 100 + "f" + "d" * 27, 64) == "d" * 50 + "f" + "d" * 13
    text, markup = batch_card(batch.refresh())
    assert "cancelled" in text and "<progress" in markup


def test_gpu_jobs_shows_batch_rows_above_the_jobs(cp, gate, tmp_path):
    open_all(tmp_path, 2)
    batch = gate.map(rows(tmp_path, [1, -2]), parallel="auto", chunk_size=1)
    batch.wait()
    text = repr(api.list_jobs())
    assert text.startswith("GPU batches") and batch.batch_id in text and "[df]" in text
    assert "chunk 1 (rows 1–1): ValueError" in text and "GPU jobs" in text
