"""Batches on the Arrow data plane: rows of numpy / pyarrow types (and NaN/Inf values) travel as
Arrow chunks (one record batch per chunk in `batches/create`, a rows file per chunk job), and the
results come back stacked exactly (a numpy array in → the stacked array out, a table in → a table
out), also after `retry_failed` and when re-running the same map reuses finished chunks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from numpy.typing import NDArray

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.handles.batch import Batch, BatchError
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.wire import dataplane


def doubled(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x * np.float32(2)


def gated_total(path: str, x: NDArray[np.float64]) -> float:
    import os

    if x.sum() < 0 and not os.path.exists(path):
        raise ValueError("negative row")
    return float(x.sum())


def col_sum(t: pa.Table) -> float:
    return float(sum(t.column(0).to_pylist()))


def halve(x: float) -> float:
    return x / 2


def exact(got, want) -> None:
    assert isinstance(got, np.ndarray), type(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()  # NaN and -0.0 bit for bit


@pytest.fixture(scope="module")
def cp(shared_control_plane):
    kernel_session.registered.clear()
    api.connect(shared_control_plane.url, shared_control_plane.api_key)
    return shared_control_plane


def data_2d() -> np.ndarray:
    data = np.arange(7 * 3 * 2, dtype=np.float32).reshape(7, 3, 2) - 20
    data[1, 0, 0], data[4, 2, 1], data[6, 1, 0] = np.nan, -0.0, np.inf
    return data


def test_numpy_rows_go_as_arrow_chunks_and_come_back_as_the_stacked_array(cp):
    fn = api.gpu_function(num_gpus=1)(doubled)
    data = data_2d()
    batch = fn.map(data, parallel=2, chunk_size=3)
    exact(batch.result(), data * np.float32(2))
    snapshot = batch.refresh()
    assert (snapshot.chunks_total, snapshot.rows_total) == (3, 7)
    assert [(c.row_start, c.row_end) for c in snapshot.chunks] == [(0, 3), (3, 6), (6, 7)]
    job = api.current_client().jobs.describe(snapshot.chunks[0].job_id)
    assert job.spec["rows_format"] == "arrow" and job.spec["rows_total"] == 3
    seen = dict(batch.as_completed())
    assert sorted(seen) == list(range(7))
    exact(np.stack([seen[i] for i in range(7)]), data * np.float32(2))


def test_nan_and_inf_rows_of_plain_floats_are_batched(cp):
    fn = api.gpu_function(num_gpus=1)(halve)
    values = [1.0, float("nan"), float("inf"), -0.0, 5.0]
    out = fn.map(values, parallel="auto", chunk_size=2).result()
    assert out[0] == 0.5 and np.isnan(out[1]) and out[2] == float("inf") and out[4] == 2.5
    assert np.signbit(out[3]) and out[3] == 0.0


def test_table_in_table_out(cp):
    fn = api.gpu_function(num_gpus=1)(halve)
    table = pa.table({"x": [2.0, 4.0, float("nan"), 8.0, 10.0]})
    out = fn.map(table, parallel=2, chunk_size=2).result()
    assert isinstance(out, pa.Table) and out.num_rows == 5
    got = out.column("result").to_pylist()
    assert got[:2] == [1.0, 2.0] and np.isnan(got[2]) and got[3:] == [4.0, 5.0]


def test_table_typed_parameters_ride_in_chunks(cp):
    fn = api.gpu_function(num_gpus=1)(col_sum)
    tables = [pa.table({"v": list(range(i + 1))}) for i in range(5)]
    assert fn.map(tables, parallel="auto", chunk_size=2).result() == [0.0, 1.0, 3.0, 6.0, 10.0]


def test_retry_failed_and_resume_with_arrow_chunks(cp, tmp_path):
    fn = api.gpu_function(num_gpus=1)(gated_total)
    fixed = str(tmp_path / "fixed")
    arrays = [np.full(2, v, dtype=np.float64) for v in (1, 2, -3, 4, 5)]
    items = [(fixed, a) for a in arrays]
    batch = fn.map(items, parallel="auto", chunk_size=2)
    with pytest.raises(BatchError, match=r"chunk 1 \(rows 2–3\) failed in phase run: .*negative row"):
        batch.result()
    again = fn.map(items, parallel="auto", chunk_size=2)  # same input digest: finished chunks reused
    assert again.batch_id == batch.batch_id and again.reused_chunks == 2
    assert again.wait().state == "failed"
    open(fixed, "w").close()
    assert batch.retry_failed().result() == [2.0, 4.0, -6.0, 8.0, 10.0]
    fresh = fn.map(items, parallel="auto", chunk_size=2, fresh=True)
    assert fresh.batch_id != batch.batch_id and fresh.result() == [2.0, 4.0, -6.0, 8.0, 10.0]


def test_arrow_body_over_rest_and_bad_bodies_start_nothing(cp):
    """Another machine's client: the chunks as an Arrow IPC body, one record batch per chunk."""
    fn = api.gpu_function(num_gpus=1)(doubled)
    version = fn.register()
    data = data_2d()
    rows = dataplane.encode_rows([{"x": row} for row in data], {"x": "tensor<float32>"})
    (whole,) = rows.to_batches()
    body = dataplane.to_ipc_bytes(pa.Table.from_batches([whole.slice(0, 4), whole.slice(4, 3)]))
    client = api.current_client()
    before = len(client.batches.list())
    reply = client.batches.create(version.name, version.version, None, parallel=2, arrow=body)
    batch = Batch(reply["batch_id"], client=client, function=fn, kind="numpy")
    exact(batch.result(), data * np.float32(2))
    assert [(c.row_start, c.row_end) for c in batch.snapshot.chunks] == [(0, 4), (4, 7)]
    wrong = dataplane.to_ipc_bytes(dataplane.encode_rows([{"y": 1.0}], {"y": "float64"}))
    with pytest.raises(api.LancefnError, match=r"missing column\(s\) x and unknown column\(s\) y"):
        client.batches.create(version.name, version.version, None, arrow=wrong)
    with pytest.raises(api.LancefnError, match="not an Arrow IPC stream"):
        client.batches.create(version.name, version.version, None, arrow=b"not arrow")
    assert len(client.batches.list()) == before + 1


def test_rows_file_hand_off_on_the_servers_machine(cp):
    """A client on the server's machine writes the chunks into $HOME/data/uploads (no bytes over HTTP)."""
    fn = api.gpu_function(num_gpus=1)(doubled)
    version = fn.register()
    data = data_2d()[:4]
    rows = dataplane.encode_rows([{"x": row} for row in data], {"x": "tensor<float32>"})
    (whole,) = rows.to_batches()
    name = "ab" * 16 + ".arrow"
    uploads = cp.home / "data" / "uploads"
    dataplane.write_ipc_file(uploads / name, pa.Table.from_batches([whole.slice(0, 1), whole.slice(1, 3)]))
    client = api.current_client()
    reply = client.batches.create(version.name, version.version, None, rows_file=name, fresh=True)
    batch = Batch(reply["batch_id"], client=client, function=fn, kind="numpy")
    exact(batch.result(), data * np.float32(2))
    assert [(c.row_start, c.row_end) for c in batch.snapshot.chunks] == [(0, 1), (1, 4)]
    assert not (uploads / name).exists()  # its chunks are kept with the batch
