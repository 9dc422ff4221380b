"""The Arrow data plane on the Ray executor: arrays and tables in and out, exactly as on the
local executor (Arrow IPC bytes ride Ray's object store; nothing is re-encoded as JSON)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from test_dataplane_e2e import echo, keep_table, same, scale, special, wrong_dtype

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.api import RemoteFunctionError
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cp(ray_cp):
    kernel_session.registered.clear()
    for fn in (echo, scale, keep_table, special, wrong_dtype):
        fn._version = None  # registered on the other module's server, if that ran first
    api.connect(ray_cp.url, ray_cp.api_key)
    return ray_cp


def test_arrays_tables_and_special_floats_round_trip_on_ray(cp):
    cube = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    for want in (
        np.asfortranarray(cube),
        np.array([np.nan, -0.0, np.inf], np.float64),
        np.array(True),
        np.empty((0, 2), np.uint8),
    ):
        same(echo.remote(want), np.array(want, order="C"))
    got = scale.map([(cube, 2.0), (cube[:, ::2], 1.0)]).result(timeout=120)
    same(got[0], cube * 2)
    same(got[1], np.array(cube[:, ::2], order="C"))
    table = pa.table({"a": [1, None], "b": ["x", None]})
    assert keep_table.remote(table).equals(table)
    values = special.map([0.0, 3.0]).result(timeout=120)
    assert np.isnan(values[0]) and str(values[1]) == "-0.0"


def test_wrong_dtype_fails_in_phase_result_on_ray(cp):
    with pytest.raises(RemoteFunctionError, match="expected an ndarray of dtype float32") as info:
        wrong_dtype.remote(2)
    assert info.value.phase == "result"


def test_a_batch_of_arrow_chunks_runs_as_ray_tasks_and_stacks_exactly(cp):
    cube = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    cube[0, 0, 0], cube[3, 1, 1] = np.nan, -0.0
    batch = scale.map([(row, 2.0) for row in cube], parallel="auto", chunk_size=2)
    got = batch.result(timeout=120)
    assert [len(part) for part in (got[:2], got[2:4], got[4:])] == [2, 2, 1] and batch.snapshot.chunks_total == 3
    same(np.stack(got), cube * 2)
