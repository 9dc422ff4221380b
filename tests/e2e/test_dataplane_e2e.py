"""Arrays in, arrays out, end to end on a real control plane (local executor, real workers):
`.submit`, `.map`, `.remote`, `.local` give the same values and types; Arrow over REST; result
files on disk survive SIGKILL; retention."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from conftest import python_body, register, registration_body
from helpers import wait_done
from numpy.typing import NDArray

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.api import RemoteFunctionError
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.wire import dataplane

DEADLINE_S = 120.0
ARROW = dataplane.MEDIA_TYPE


@api.gpu_function(num_gpus=1)
def echo(x: np.ndarray) -> np.ndarray:
    return x


@api.gpu_function()
def scale(x: NDArray[np.float32], k: float) -> NDArray[np.float32]:
    return x * np.float32(k)


@api.gpu_function()
def keep_table(t: pa.Table) -> pa.Table:
    return t


@api.gpu_function()
def special(x: float) -> float:
    return {0: float("nan"), 1: float("inf"), 2: float("-inf")}.get(int(x), -0.0)


@api.gpu_function()
def nested(x: list[list[float]]) -> list[list[float]]:
    return x


@api.gpu_function()
def wrong_dtype(n: int) -> NDArray[np.float32]:
    return np.zeros(n)


@api.gpu_function()
def wrong_type(n: int) -> pa.Table:
    return [n]


def same(got: Any, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray), type(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.ascontiguousarray(got).tobytes() == np.array(want, order="C").tobytes()


@pytest.fixture(scope="module")
def cp(shared_control_plane):
    kernel_session.registered.clear()
    api.connect(shared_control_plane.url, shared_control_plane.api_key)
    return shared_control_plane


def values_of_every_kind() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    cube = rng.standard_normal((3, 4, 5)).astype(np.float32)
    values = [
        np.array(dtype_value, dtype=dtype)
        for dtype, dtype_value in [
            (np.bool_, [True, False]),
            (np.int8, [-128, 127]),
            (np.int16, [1]),
            (np.int32, [7]),
            (np.int64, [2**62]),
            (np.uint8, [255, 0]),
            (np.float16, [1.5, np.nan]),
            (np.float32, [-0.0, np.inf]),
            (np.float64, [np.nan, -np.inf, -0.0]),
        ]
    ]
    return [*values, np.array(3.5), np.empty((0, 3)), cube, cube[:, ::2], np.asfortranarray(cube)]


def test_arrays_round_trip_through_submit_map_remote_and_local(cp):
    values = values_of_every_kind()
    jobs = [echo.submit(value) for value in values]  # every dtype and shape, one job each
    for job, want in zip(jobs, values, strict=False):
        same(job.result(timeout=DEADLINE_S), np.array(want, order="C"))
    cubes = values[-3:]  # one job over rows of one dtype: contiguous, strided, Fortran-ordered
    for got, want in zip(echo.map(cubes).result(timeout=DEADLINE_S), cubes, strict=False):
        same(got, np.array(want, order="C"))
    for want in (values[8], values[-1], values[9]):  # specials, Fortran order, 0-d
        same(echo.remote(want), np.array(want, order="C"))
        same(echo.local(want), np.array(want, order="C"))


def test_declared_dtype_and_list_inputs(cp):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    same(scale.remote(x, 2.0), x * 2)
    same(scale.remote([1, 2, 3], 0.5), np.array([0.5, 1, 1.5], np.float32))  # array-likes are converted
    same(scale.local(x, -1.0), -x)
    assert [r.shape for r in scale.map([(x, 1.0), (x[:, :1], 1.0)]).result(timeout=DEADLINE_S)] == [(3, 4), (3, 1)]


def test_tables_with_nulls_and_nested_lists_and_special_floats(cp):
    table = pa.table(
        {"id": [1, None, 3], "name": ["a", None, "c"], "v": pa.array([[1.0], None, []], pa.list_(pa.float64()))}
    )
    assert keep_table.remote(table).equals(table)
    assert keep_table.local(table).equals(table)
    assert nested.remote([[1.0, 2.0], []]) == [[1.0, 2.0], []]
    got = special.map([0.0, 1.0, 2.0, 3.0]).result(timeout=DEADLINE_S)
    assert np.isnan(got[0]) and got[1:3] == [float("inf"), float("-inf")] and str(got[3]) == "-0.0"
    assert np.isnan(special.local(0.0))
    nan_in = scale.remote(np.array([np.nan, -0.0], np.float32), 1.0)  # NaN in an argument, too
    assert np.isnan(nan_in[0]) and np.signbit(nan_in[1])


def test_wrong_result_type_fails_in_phase_result_naming_expected_and_actual(cp):
    with pytest.raises(RemoteFunctionError) as info:
        wrong_dtype.remote(3)
    assert info.value.phase == "result"
    assert "expected an ndarray of dtype float32, got ndarray of dtype float64 and shape (3,)" in str(info.value)
    with pytest.raises(RemoteFunctionError, match="expected a pyarrow.Table, got list") as info:
        wrong_type.remote(1)
    assert info.value.phase == "result"
    with pytest.raises(api.LancefnError, match="phase result"):
        wrong_dtype.local(2)


def test_rest_shape_summary_and_arrow_result_route(cp):
    job = scale.submit(np.ones((1000, 768), np.float32), 3.0)
    job.wait(timeout=DEADLINE_S)
    with cp.http() as client:
        wire = client.post("/v1/jobs/describe", json={"job_id": job.job_id}).json()
        assert wire["result_format"] == "arrow" and "result" not in wire
        assert wire["result_summary"] == {
            "type": "ndarray",
            "dtype": "float32",
            "shape": [1000, 768],
            "nbytes": 3072000,
        }
        reply = client.get("/v1/jobs/result", params={"job_id": job.job_id})
        assert reply.headers["content-type"] == ARROW
        (value,) = dataplane.decode_results(dataplane.read_ipc(reply.content))
        same(value, np.full((1000, 768), 3.0, np.float32))
        assert (
            client.get("/v1/jobs/result", params={"job_id": job.job_id}, headers={"x-api-key": "nope"}).status_code
            == 401
        )


def test_json_clients_keep_working_and_arrow_bodies_are_checked(cp):
    version = scale.version
    with cp.http() as client:
        # Today's JSON API, for an array function: lists in, the result over the new route.
        reply = client.post(
            "/v1/functions/run",
            json={"name": version.name, "version": version.version, "rows": [{"x": [1, 2], "k": 2.0}]},
        )
        job_id = reply.json()["job_id"]
        wire = client.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
        assert wire["job_state"] == "DONE", wire
        (value,) = dataplane.decode_results(
            dataplane.read_ipc(client.get("/v1/jobs/result", params={"job_id": job_id}).content)
        )
        same(value, np.array([2, 4], np.float32))
        # An Arrow body whose columns do not match the signature.
        body = dataplane.to_ipc_bytes(dataplane.encode_rows([{"y": [1.0]}], {"y": "tensor<float32>"}))
        reply = client.post(
            "/v1/functions/run",
            params={"name": version.name, "version": version.version},
            content=body,
            headers={"content-type": ARROW},
        )
        assert reply.status_code == 400
        assert "missing column(s) x, k and unknown column(s) y" in reply.json()["error"]["message"]
        reply = client.post(
            "/v1/functions/run",
            params={"name": version.name, "version": version.version},
            content=b"not arrow",
            headers={"content-type": ARROW},
        )
        assert reply.status_code == 400 and "not an Arrow IPC stream" in reply.json()["error"]["message"]
        # Query-string numbers are JSON values: a timeout and an inline wait on the Arrow path.
        body = dataplane.to_ipc_bytes(
            dataplane.encode_rows([{"x": [1, 2], "k": 3.0}], {"x": "tensor<float32>", "k": "float64"})
        )
        reply = client.post(
            "/v1/functions/run",
            params={"name": version.name, "version": version.version, "timeout_s": "60", "wait_s": "30"},
            content=body,
            headers={"content-type": ARROW},
        )
        assert reply.status_code == 202, reply.text
        inline = reply.json()["job"]
        assert inline["job_state"] == "DONE" and inline["spec"]["timeout_s"] == 60, inline
        (value,) = dataplane.decode_results(
            dataplane.read_ipc(client.get("/v1/jobs/result", params={"job_id": inline["job_id"]}).content)
        )
        same(value, np.array([3, 6], np.float32))
        reply = client.post(
            "/v1/functions/run",
            params={"name": version.name, "version": version.version, "timeout_s": "soon"},
            content=body,
            headers={"content-type": ARROW},
        )
        assert reply.status_code == 400 and "timeout_s='soon' is not a JSON value" in reply.json()["error"]["message"]
        # Plain JSON results still come inline.
        plain = register(client, registration_body(num_gpus=None))
        job_id = client.post(
            "/v1/functions/run", json={"name": plain["name"], "version": plain["version"], "rows": [{"x": 4}]}
        ).json()["job_id"]
        wire = client.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
        assert wire["result"] == [8] and "result_format" not in wire
    assert not list((cp.home / "data" / "rows").glob("*")), "rows files are removed once their job ends"


BIG_SOURCE = """from __future__ import annotations

import numpy as np


def big(n: int):
    return np.full(n, 1.5, dtype=np.float32)
"""


BIG_BODY = python_body("big", BIG_SOURCE, output_type="tensor<float32>")


def test_sigkill_while_a_large_result_is_written_never_leaves_a_truncated_result(control_plane_factory):
    cp = control_plane_factory()
    n = 25_000_000  # 100 MB of float32
    results = cp.home / "data" / "results"
    with cp.http() as client:
        version = register(client, BIG_BODY)
        job_id = client.post(
            "/v1/functions/run", json={"name": "big", "version": version["version"], "rows": [{"n": n}]}
        ).json()["job_id"]
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:  # kill while the worker writes (or as close as polling gets)
            if any(".tmp-" in p.name for p in results.glob("*")) or (results / f"{job_id}.arrow").exists():
                break
            time.sleep(0.002)
    cp.kill()
    cp.start()
    with cp.http() as client:
        wire = wait_done(client, job_id, DEADLINE_S)
        assert wire["job_state"] == "DONE", wire
        reply = client.get("/v1/jobs/result", params={"job_id": job_id})
        (value,) = dataplane.decode_results(dataplane.read_ipc(reply.content))
    assert value.shape == (n,) and value.dtype == np.float32 and float(value[-1]) == 1.5
    assert not [p for p in results.iterdir() if ".tmp-" in p.name]


def test_results_staged_in_memory_survive_a_sigkill_of_the_server(control_plane_factory):
    """DONE jobs whose 8 MB results may still be staged in memory when the server is killed: the next start
    moves them to the home, and each is served whole (docs/ARCHITECTURE.md, "Result staging")."""
    cp = control_plane_factory()
    n = 2_000_000  # 8 MB of float32: staged
    with cp.http() as client:
        version = register(client, BIG_BODY)["version"]
        jobs = [
            client.post("/v1/functions/run", json={"name": "big", "version": version, "rows": [{"n": n + i}]}).json()[
                "job_id"
            ]
            for i in range(6)
        ]
        for job_id in jobs:
            assert wait_done(client, job_id, DEADLINE_S)["job_state"] == "DONE"
    staged_dir = (cp.home / "data" / "staged").resolve()
    assert staged_dir.parent.name == "shm"
    cp.kill()  # the spooler may not have moved the last ones yet
    cp.start()
    results = cp.home / "data" / "results"
    with cp.http() as client:
        for i, job_id in enumerate(jobs):
            reply = client.get("/v1/jobs/result", params={"job_id": job_id})
            assert reply.status_code == 200, reply.text
            (value,) = dataplane.decode_results(dataplane.read_ipc(reply.content))
            assert value.shape == (n + i,) and float(value[-1]) == 1.5
    cp.stop()
    assert sorted(p.stem for p in results.glob("*.arrow")) == sorted(jobs)  # all in the home after a stop
    assert not [p for p in results.iterdir() if ".tmp-" in p.name]
    assert not staged_dir.exists()


def test_retention_removes_results_and_the_job_says_so(control_plane_factory):
    cp = control_plane_factory(args=["--result-max-bytes", "1"])
    with cp.http() as client:
        version = register(client, BIG_BODY)
        job_id = client.post(
            "/v1/functions/run", json={"name": "big", "version": version["version"], "rows": [{"n": 10}]}
        ).json()["job_id"]
        assert wait_done(client, job_id, DEADLINE_S)["job_state"] == "DONE"
        wire = client.post("/v1/jobs/describe", json={"job_id": job_id}).json()
        assert wire["result_summary"]["expired"] is True and wire["result_summary"]["shape"] == [10]
        reply = client.get("/v1/jobs/result", params={"job_id": job_id})
        assert reply.status_code == 410 and "retention" in reply.json()["error"]["message"]


def test_embedded_server_hands_rows_and_results_over_as_files(cp, tmp_path, monkeypatch):
    monkeypatch.setenv("LANCEFN_DISABLE_NVML", "1")
    kernel_session.registered.clear()
    home = tmp_path / "home"
    api.use_local(home=str(home))
    try:
        scale._version = None  # registered on the module's other server
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        job = scale.submit(x, 2.0)
        same(job.result(), x * 2)
        # The result is a file the kernel maps: staged in memory, or in the home once the spooler moved it
        # (docs/ARCHITECTURE.md, "Result staging"); a second read gets the same values wherever it is.
        name = f"{job.job_id}.arrow"
        assert (home / "data" / "staged").resolve().parent == Path("/dev/shm")
        assert (home / "data" / "staged" / name).exists() or (home / "data" / "results" / name).exists()
        (again,) = api.Job.attach(job.job_id).result()  # attached: the list of the job's results
        same(again, x * 2)
        assert not list((home / "data" / "uploads").iterdir()) and not list((home / "data" / "rows").iterdir())
        client = api.current_client()
        version = scale.version
        for bad in ("../../etc/passwd", "0" * 32 + ".arrow"):
            with pytest.raises(api.LancefnError, match="rows_file"):
                client.functions.run(version.name, version.version, None, rows_file=bad)
    finally:
        api.stop_local(home=str(home))
        scale._version = None
        api.connect(cp.url, cp.api_key)  # back to the module's server for the tests after this one
    # A graceful stop leaves every result in the home and no memory behind.
    assert dataplane.read_ipc(home / "data" / "results" / name).num_rows == 1
    assert not (home / "data" / "staged").exists()


@api.gpu_function()
def in_place(x: NDArray[np.float64]) -> NDArray[np.float64]:
    x *= 2  # arguments are writable (numba kernels copy results back into host arrays too)
    return x


def test_array_arguments_are_writable_in_the_function(cp):
    same(in_place.remote(np.arange(3.0)), np.arange(3.0) * 2)
    same(in_place.local(np.arange(3.0)), np.arange(3.0) * 2)


@api.gpu_function()
def scale_default(x: NDArray[np.float32], k: float = 3.0) -> NDArray[np.float32]:
    return x * np.float32(k)


def test_parameters_with_defaults_on_the_arrow_path(cp):
    x = np.ones(2, np.float32)
    same(scale_default.remote(x), x * 3)
    got = scale_default.map([{"x": x}, {"x": x, "k": 5.0}]).result(timeout=DEADLINE_S)
    same(got[0], x * 3)
    same(got[1], x * 5)
