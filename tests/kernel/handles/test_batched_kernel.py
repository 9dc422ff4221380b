"""Batched functions from the kernel through a real control plane (docs/ARCHITECTURE.md, "Batched
functions"): `submit(batch)` is one call whose result is the batch in its declared form, `map` makes one
call per chunk, `.local(batch)` the same, and a wrong length fails in phase `result`."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import kernel_shell
from IPython.utils.capture import capture_output
from numpy.typing import NDArray

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.handles import chunking
from lancefn_jupyter.kernel.handles.job import RemoteFunctionError
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state


def scaled(x: NDArray[np.float32], factor: list[float]) -> NDArray[np.float32]:
    return x * np.asarray(factor, dtype=np.float32)[:, None]


def call_sizes(x: list[float]) -> list[float]:
    """Each row's result is the size of the call it was in: one call per chunk shows as equal runs."""
    return [float(len(x))] * len(x)


def doubled(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return x * 2.0


def one_short(x: list[float]) -> list[float]:
    return x[1:]


def upper(s: pa.Array) -> pa.Array:
    return pc.utf8_upper(s)


def products(batch: pa.RecordBatch) -> list[float]:
    return pc.multiply(batch.column("a"), batch.column("b")).to_pylist()


@pytest.fixture(scope="module")
def cp(shared_control_plane):
    kernel_session.registered.clear()
    api.connect(shared_control_plane.url, shared_control_plane.api_key)
    return shared_control_plane


def batched(fn):
    return api.gpu_function(num_gpus=1, batched=True)(fn)


def test_submit_an_ndarray_batch_is_one_call_and_returns_the_stacked_result(cp):
    fn = batched(scaled)
    assert fn.signature.batched and "batched" in repr(fn)
    data = np.arange(300 * 8, dtype=np.float32).reshape(300, 8)
    data[5, 2] = np.nan
    factor = [float(i % 3) for i in range(300)]
    want = data * np.asarray(factor, dtype=np.float32)[:, None]
    job = fn.submit(data, factor)
    got = job.result()
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (300, 8)
    assert got.tobytes() == want.tobytes()
    assert job.snapshot.spec["rows_total"] == 300
    assert fn.remote(data[:2], factor[:2]).tobytes() == want[:2].tobytes()
    with pytest.raises(TypeError, match=r"differ in length \(2, 3\)"):
        fn.submit(data[:3], factor[:2])


def test_submit_list_arrow_and_record_batch_forms(cp):
    sizes = batched(call_sizes)
    assert sizes.submit([1.0, 2.0, 3.0]).result() == [3.0, 3.0, 3.0]
    up = batched(upper).submit(pa.array(["ab", None, "cd"])).result()
    assert isinstance(up, pa.Array) and up.to_pylist() == ["AB", None, "CD"]
    table = pa.table({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    assert batched(products).submit(table).result() == [4.0, 10.0, 18.0]


def test_a_wrong_length_fails_in_phase_result_naming_expected_and_actual(cp):
    with pytest.raises(RemoteFunctionError) as error:
        batched(one_short).submit([1.0] * 1000).result()
    assert error.value.phase == "result"
    assert "the result: expected 1000 values (one per row), got 999" in str(error.value)


def test_map_makes_one_call_per_chunk(cp):
    fn = batched(call_sizes)
    items = [float(i) for i in range(10)]
    assert fn.map(items, chunk_size=4).result() == [4.0] * 8 + [2.0] * 2
    assert fn.map(items).result() == [10.0] * 10  # one job: one call over every item
    out = batched(scaled).map([(np.ones(2, np.float32), float(i)) for i in range(5)], chunk_size=2).result()
    assert [row.tolist() for row in out] == [[float(i)] * 2 for i in range(5)]
    data = np.arange(14, dtype=np.float64).reshape(7, 2)
    stacked = batched(doubled).map(data, parallel=2, chunk_size=3).result()  # an ndarray in: the stacked array
    assert isinstance(stacked, np.ndarray) and stacked.tobytes() == (data * 2.0).tobytes()
    table = pa.table({"a": [1.0, 2.0, 3.0], "b": [4.0, 5.0, 6.0]})
    by_rows = batched(products).map(table, chunk_size=2).result()  # a RecordBatch function over a table's rows
    assert by_rows.column("result").to_pylist() == [4.0, 10.0, 18.0]


def test_the_default_chunk_of_a_batched_function():
    assert chunking.cut(5000, None, slots=1, batched=True)[0] == (0, chunking.BATCHED_CHUNK_ROWS)
    assert chunking.cut(5000, None, slots=1)[0] == (0, 1250)  # per-row: about 4 chunks per slot
    assert chunking.cut(100, None, slots=2, batched=True)[0] == (0, 13)  # still ~4 chunks per slot


def test_local_runs_the_batch_in_one_call():
    fn = batched(call_sizes)
    assert fn.local([1.0, 2.0]) == [2.0, 2.0]
    data = np.ones((4, 3), np.float32)
    out = batched(scaled).local(data, [1.0, 2.0, 3.0, 4.0])
    assert isinstance(out, np.ndarray) and out[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


MAGIC_CELL = """\
import numpy as np
from numpy.typing import NDArray

def embed(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x[:, :2] + np.float32(1)
"""


def test_the_magic_and_a_profile_make_a_batched_version(cp):
    for shell in kernel_shell(cp):
        with capture_output() as out:
            shell.run_line_magic("gpu_profile", "emb num_gpus=1 batched=yes")
            shell.run_cell_magic("gpu_function", "profile=emb", MAGIC_CELL)
        handle = shell.user_ns["embed"]
        assert handle.signature.batched and handle.version.signature.batched
        assert "batched: one call per chunk of rows" in out.stdout + "".join(
            o.data.get("text/plain", "") for o in out.outputs
        )
        got = handle.submit(np.zeros((4, 3), np.float32)).result()
        assert got.shape == (4, 2) and got.tolist() == [[1.0, 1.0]] * 4
        shell.run_cell_magic("gpu_function", "num_gpus=1 batched=no", MAGIC_CELL)  # per-row: another version
        assert not shell.user_ns["embed"].signature.batched
        assert shell.user_ns["embed"].version.version != handle.version.version
