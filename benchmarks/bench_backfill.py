"""Backfills into LanceDB (issue 26; docs/ARCHITECTURE.md, "Backfills"), each side in its own process in one run:

    .venv/bin/python benchmarks/bench_backfill.py [--rows 100000] [--memory-rows 1000000] [--reps 3] [--skip-ray]

1. **Batched vs per row.** 100,000 rows of a float32 column `x` → a 768-float32 vector per row (a toy model:
   `tanh(x · basis) @ W`, W a fixed (768, 768) float32 layer built in `setup`, once per worker) into a new
   `fixed_size_list<float32>[768]` column: `f.map(table, column="x", into="vec", parallel="auto")` with
   the function declared `batched=True` (one call per 1024-row chunk) and the same function per row. Rows/s;
   target: batched ≥ 10× per row. Beside it, the model alone in one thread (no lancefn), batched and per row:
   their ratio is the most batching can gain for this model on a CPU (a GPU's per-call cost is far higher).
2. **A plain pylance loop.** The same table, one process, no control plane: pylance reads it 1024 rows at a time,
   applies the batched function's body, and writes the column (`LanceDataset.add_columns` with a batch UDF, one
   data file per fragment). Target: ours (batched) ≥ 0.8× its rows/s. Ours (batched) and the loop are run
   alternately `--reps` times (3), each in a fresh process: the medians are compared, and every run is printed.
3. **Ray Data.** `ray.data.read_lance` → `map_batches` (the same body, 1024-row batches, Arrow) → `write_lance`
   into a new dataset, on a local Ray with the same CPUs: rows/s and our ratio (no target; reported).
4. **Memory.** A 1,000,000-row backfill (the batched function) on a fresh control plane: the kernel's peak RSS above
   its idle RSS (a separate process that imported everything, opened the table and registered the function before
   "idle"; target ≤ 50 MB: no row passes through it), and the control plane's peak RSS over its whole life
   (`VmHWM` of /proc/<pid>/status; target ≤ 300 MB).

Tables are made with LanceDB in fragments of `--fragment-rows` (a table grown by appends), each side gets its own
copy, and table creation is not timed. Workers run on CPU (simulated GPUs, one per CPU, at most 8). Figures are
printed, targets reported, nothing asserted on time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RssSampler, print_machine, rss_mb, server, settle, summary

BENCH = "bench_backfill.py"
DIM = 768
CHUNK = 1024  # BATCHED_CHUNK_ROWS: the batched function's chunk, and the loops' batch
GPUS = max(1, min(8, os.cpu_count() or 1))
CLASSES = f"""
[[gpu_classes]]
name = "default"
gpu_model = "Simulated GPU"
gpu_memory_bytes = 1073741824
max_gpu_count_per_worker = {GPUS}
simulated = {GPUS}
"""


# ----------------------------------------------------------------------------- the model, both ways


def dense_layer():
    """The model: x spread over a fixed basis, tanh, then a fixed (768, 768) float32 layer (seeded)."""
    import numpy as np

    rng = np.random.default_rng(26)
    basis = np.linspace(-1.0, 1.0, 768, dtype=np.float32)
    return basis, (rng.standard_normal((768, 768)) / 28).astype(np.float32)


def project(x, basis, weights):
    """(n,) float32 → (n, 768) float32: one matrix product for the whole chunk."""
    import numpy as np

    return np.tanh(np.outer(np.asarray(x, dtype=np.float32), basis)) @ weights


class EmbedRows:
    """Batched: the chunk's values in, one (n, 768) float32 array out; the layer built once per worker."""

    def setup(self):
        self.basis, self.weights = dense_layer()

    def __call__(self, x: list[float]) -> NDArray[np.float32]:
        return project(x, self.basis, self.weights)


class EmbedRow:
    """The same model, one row per call."""

    def setup(self):
        self.basis, self.weights = dense_layer()

    def __call__(self, x: float) -> NDArray[np.float32]:
        return project([x], self.basis, self.weights)[0]


# ----------------------------------------------------------------------------- tables


def make_table(db_dir: str, name: str, rows: int, fragment_rows: int):
    """A LanceDB table `id, x` of `rows` rows in fragments of `fragment_rows` (created, then appended to)."""
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(db_dir)
    x = np.arange(rows, dtype=np.float32) / max(rows, 1)
    table = None
    for start in range(0, rows, fragment_rows):
        end = min(rows, start + fragment_rows)
        part = pa.table({"id": pa.array(np.arange(start, end, dtype=np.int64)), "x": pa.array(x[start:end])})
        if table is None:
            table = db.create_table(name, part, mode="overwrite")
        else:
            table.add(part)
    return table


def check_vectors(table, rows: int) -> None:
    """Every row written, and sampled rows hold the right vector (a wrong result is a bug, not a figure)."""
    table.checkout_latest()
    assert table.count_rows("vec IS NULL") == 0, "rows left unwritten"
    picks = [0, rows // 2, rows - 1]
    got = table.search().where(f"id IN ({', '.join(map(str, picks))})").select(["id", "x", "vec"]).limit(None)
    layer = dense_layer()
    for row in got.to_list():
        np.testing.assert_allclose(row["vec"], project([row["x"]], *layer)[0], rtol=1e-4, atol=1e-5)


def side_result(name: str, **figures) -> None:
    print(f"SIDE {name} " + json.dumps(figures), flush=True)


# ----------------------------------------------------------------------------- the sides (own processes)


def ours_side(rows: int, fragment_rows: int, tmp: str, labels: list[str]) -> None:
    """Backfills through a real control plane (this process is the kernel): ``labels`` among batched, per_row."""
    from lancefn_jupyter.kernel import api

    with server(gpu_classes=CLASSES) as srv:
        srv.connect()
        batched = api.gpu_function(num_gpus=1, batched=True)(EmbedRows)
        per_row = api.gpu_function(num_gpus=1)(EmbedRow)
        for fn in (batched, per_row):  # warm: workers started, versions registered, the table path's imports
            fn.map(make_table(tmp, "warm", 4 * CHUNK, 2 * CHUNK), column="x", into="vec", parallel="auto").result()
        figures = {}
        for label, fn in ((label, {"batched": batched, "per_row": per_row}[label]) for label in labels):
            table = make_table(tmp, label, rows, fragment_rows)
            settle(srv.pid)  # the spares the warm-up started have done their imports
            start = time.perf_counter()
            fn.map(table, column="x", into="vec", parallel="auto").result()
            figures[label] = time.perf_counter() - start
            check_vectors(table, rows)
    side_result("ours", **figures)


def loop_side(rows: int, fragment_rows: int, tmp: str) -> None:
    """One process, no control plane: pylance reads 1024 rows at a time, applies the body, writes the column."""
    import lance
    import pyarrow as pa

    table = make_table(tmp, "loop", rows, fragment_rows)
    dataset = lance.dataset(table.uri)
    schema = pa.schema([pa.field("vec", pa.list_(pa.float32(), DIM))])
    layer = dense_layer()

    @lance.batch_udf(output_schema=schema)
    def vectors(batch: pa.RecordBatch) -> pa.RecordBatch:
        values = project(batch.column("x").to_numpy(), *layer)
        return pa.RecordBatch.from_arrays([pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), DIM)], ["vec"])

    start = time.perf_counter()
    dataset.add_columns(vectors, read_columns=["x"], batch_size=CHUNK)
    elapsed = time.perf_counter() - start
    assert lance.dataset(table.uri).count_rows("vec IS NULL") == 0
    side_result("loop", seconds=elapsed)


def model_side(rows: int, fragment_rows: int, tmp: str) -> None:
    """The model alone, one thread (as each worker runs it): rows/s as one call per 1024 rows and one call per
    row. Their ratio is the most batching can gain for this model on a CPU, whatever runs it."""
    layer = dense_layer()
    x = np.arange(CHUNK, dtype=np.float32) / CHUNK
    project(x, *layer)
    start = time.perf_counter()
    for _ in range(20):
        project(x, *layer)
    batched = 20 * CHUNK / (time.perf_counter() - start)
    start = time.perf_counter()
    for value in x:
        project([value], *layer)[0]
    side_result("model", batched=batched, per_row=CHUNK / (time.perf_counter() - start))


def _lance_for_ray() -> None:
    """Ray 2.60's `write_lance` passes `storage_options_provider`, which pylance 14's `write_fragments` and
    `LanceDataset.commit` no longer take (a TypeError): drop it when unset (in each Ray worker and the driver)."""
    import functools

    import lance
    import lance.fragment

    def without_provider(call):
        @functools.wraps(call)
        def wrapped(*args, storage_options_provider=None, **kwargs):
            return call(*args, **kwargs)

        return wrapped

    lance.fragment.write_fragments = without_provider(lance.fragment.write_fragments)
    lance.LanceDataset.commit = staticmethod(without_provider(lance.LanceDataset.commit))


def ray_side(rows: int, fragment_rows: int, tmp: str) -> None:
    """Ray Data: read_lance → map_batches (the same body, Arrow batches of 1024) → write_lance.
    Ray Data needs pandas (`pip install pandas`)."""
    import pyarrow as pa
    import ray

    table = make_table(tmp, "ray", rows, fragment_rows)
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ray.init(
        num_cpus=GPUS,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=ray_tmp,
        runtime_env={"worker_process_setup_hook": _lance_for_ray},
    )
    _lance_for_ray()  # the driver commits the fragments

    layer = dense_layer()

    def vectors(batch: pa.Table) -> pa.Table:
        values = project(batch.column("x").to_numpy(), *layer)
        flat = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), DIM)
        return pa.table({"id": batch.column("id"), "vec": flat})

    def run(out: str) -> float:
        start = time.perf_counter()
        data = ray.data.read_lance(table.uri, columns=["id", "x"])
        data.map_batches(vectors, batch_format="pyarrow", batch_size=CHUNK).write_lance(out)
        return time.perf_counter() - start

    run(str(Path(tmp) / "ray-warm.lance"))  # warm: Ray's workers and Data's operators started
    elapsed = run(str(Path(tmp) / "ray-out.lance"))
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)
    side_result("ray", seconds=elapsed)


def kernel_side(url: str, key: str, db_dir: str, rows: int) -> None:
    """The kernel of the 1M-row backfill: its own RSS, idle (everything imported, table open, version
    registered) and at its peak while the control plane runs the backfill."""
    import lancedb

    from lancefn_jupyter.kernel import api

    api.connect(url, key)
    table = lancedb.connect(db_dir).open_table("big")
    fn = api.gpu_function(num_gpus=1, batched=True)(EmbedRows)
    fn.map(lancedb.connect(db_dir).open_table("warm"), column="x", into="vec", parallel="auto").result()
    gc.collect()
    idle = rss_mb(os.getpid())
    sampler = RssSampler(os.getpid(), 0.02)
    start = time.perf_counter()
    backfill = fn.map(table, column="x", into="vec", parallel="auto")
    backfill.result()
    elapsed = time.perf_counter() - start
    peak = sampler.stop()
    check_vectors(table, rows)
    side_result("kernel", idle_mb=idle, peak_mb=peak, seconds=elapsed, rows_written=backfill.rows_written)


def vm_hwm_mb(pid: int) -> float:
    """Peak resident set size of `pid` over its life (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ----------------------------------------------------------------------------- the run


def run_side(name: str, *args: str, timeout: float = 3600, env: dict | None = None) -> dict | None:
    """Run one side in its own process; its figures, or None (printed why) if it failed."""
    proc = subprocess.run(
        [sys.executable, __file__, "--side", name, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(f"SIDE {name} ")), None)
    if line is None:
        print(f"{name} side failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return None
    return json.loads(line.split(" ", 2)[2])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _interleaved(common: list[str], reps: int) -> tuple[dict | None, dict | None]:
    """Ours (batched) and the plain loop, alternated ``reps`` times, each in a fresh process on fresh tables: a
    run is 2-3 s, so one slow phase of the host would otherwise decide the ratio. Per row is timed once, in the
    first of ours. The medians, and every run printed."""
    ours_runs: list[dict] = []
    loop_runs: list[float] = []
    for rep in range(reps):
        with tempfile.TemporaryDirectory(prefix="lancefn-bench-backfill-") as tmp:
            ours = run_side("ours", *common, "--tmp", tmp, "--labels", "batched,per_row" if rep == 0 else "batched")
            loop = run_side("loop", *common, "--tmp", tmp)
        if ours is not None:
            ours_runs.append(ours)
        if loop is not None:
            loop_runs.append(loop["seconds"])
        print(
            f"run {rep + 1}/{reps}: ours batched "
            + (f"{ours['batched']:.2f} s" if ours else "failed")
            + ", plain loop "
            + (f"{loop['seconds']:.2f} s" if loop else "failed"),
            flush=True,
        )
    per_row = next((run["per_row"] for run in ours_runs if "per_row" in run), None)
    ours = {"batched": _median([run["batched"] for run in ours_runs]), "per_row": per_row} if per_row else None
    return ours, ({"seconds": _median(loop_runs)} if loop_runs else None)


def speed(rows: int, fragment_rows: int, skip_ray: bool, reps: int) -> None:
    common = ["--rows", str(rows), "--fragment-rows", str(fragment_rows)]
    ours, loop = _interleaved(common, reps)
    with tempfile.TemporaryDirectory(prefix="lancefn-bench-backfill-") as tmp:
        model = run_side("model", *common, "--tmp", tmp, env={"OMP_NUM_THREADS": "1"})
        ray = None if skip_ray else run_side("ray", *common, "--tmp", tmp)
    what = f"{rows:,} rows x {DIM} float32"
    if ours is not None:
        b, p = rows / ours["batched"], rows / ours["per_row"]
        print(
            f"{what}: batched {b:,.0f} rows/s ({ours['batched']:.2f} s, median), per row {p:,.0f} rows/s, "
            f"ratio {b / p:.1f}×"
        )
        summary(BENCH, f"backfill {what}, batched", round(b), "rows/s")
        summary(BENCH, f"backfill {what}, per row", round(p), "rows/s")
        summary(BENCH, "batched / per row (rows/s)", round(b / p, 2), "x", ">= 10", b / p >= 10)
    if model is not None:
        ceiling = model["batched"] / model["per_row"]
        print(
            f"the model alone, one thread: {model['batched']:,.0f} rows/s batched, {model['per_row']:,.0f} rows/s "
            f"per row: batching can gain at most {ceiling:.1f}× for it on a CPU"
        )
        summary(BENCH, "the model alone: batched / per row (one thread)", round(ceiling, 2), "x")
    batched = rows / ours["batched"] if ours is not None else None
    if loop is not None:
        lr = rows / loop["seconds"]
        print(f"plain pylance loop (one process, add_columns UDF): {lr:,.0f} rows/s ({loop['seconds']:.2f} s, median)")
        _versus("plain pylance loop", what, lr, batched, at_least=0.8)
    if ray is not None:
        rr = rows / ray["seconds"]
        print(f"Ray Data read_lance → map_batches → write_lance: {rr:,.0f} rows/s ({ray['seconds']:.2f} s)")
        _versus("Ray Data", what, rr, batched)


def _versus(other: str, what: str, theirs: float, ours: float | None, at_least: float | None = None) -> None:
    """`other`'s rows/s, and ours (batched) over it: the target is `at_least` when given."""
    summary(BENCH, f"{other}, {what}", round(theirs), "rows/s")
    if ours is None:
        return
    ratio = ours / theirs
    print(f"ours (batched) / {other}: {ratio:.2f}×")
    target = (f">= {at_least}", ratio >= at_least) if at_least is not None else ()
    summary(BENCH, f"ours batched / {other} (rows/s)", round(ratio, 2), "x", *target)


def memory(rows: int, fragment_rows: int) -> None:
    with tempfile.TemporaryDirectory(prefix="lancefn-bench-backfill-") as tmp, server(gpu_classes=CLASSES) as srv:
        make_table(tmp, "warm", 4 * CHUNK, 2 * CHUNK)
        make_table(tmp, "big", rows, fragment_rows)
        gc.collect()
        before = rss_mb(srv.pid)
        sampler = RssSampler(srv.pid, 0.05)  # how it moves: a steady level, or spikes (at commits)
        kernel = run_side("kernel", "--url", srv.url, "--key", srv.api_key, "--tmp", tmp, "--memory-rows", str(rows))
        sampler.stop()
        server_peak = vm_hwm_mb(srv.pid)
    samples = sorted(sampler.samples)
    print(
        f"control plane RSS: {before:.0f} MB before the backfill; during it median {samples[len(samples) // 2]:.0f} MB, "
        f"p95 {samples[int(len(samples) * 0.95)]:.0f} MB, peak sampled {samples[-1]:.0f} MB"
    )
    if kernel is not None:
        above = kernel["peak_mb"] - kernel["idle_mb"]
        print(
            f"{rows:,}-row backfill ({rows / kernel['seconds']:,.0f} rows/s): kernel idle {kernel['idle_mb']:.0f} MB, "
            f"peak {kernel['peak_mb']:.0f} MB (+{above:.1f} MB)"
        )
        summary(BENCH, f"kernel peak RSS above idle, {rows}-row backfill", round(above, 1), "MB", "<= 50", above <= 50)
        summary(BENCH, f"backfill {rows} rows x {DIM} float32, batched", round(rows / kernel["seconds"]), "rows/s")
    print(f"control plane peak RSS over its life (VmHWM): {server_peak:.0f} MB")
    summary(BENCH, "control plane peak RSS (VmHWM)", round(server_peak), "MB", "<= 300", server_peak <= 300)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--memory-rows", type=int, default=1_000_000)
    parser.add_argument("--fragment-rows", type=int, default=25_000)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--reps", type=int, default=3, help="alternated runs of ours (batched) and the plain loop")
    parser.add_argument("--labels", default="batched,per_row", help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=("speed", "memory"))
    parser.add_argument("--side", choices=("ours", "model", "loop", "ray", "kernel"), help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("LANCEFN_DISABLE_NVML", "1")
    if args.side == "kernel":
        kernel_side(args.url, args.key, args.tmp, args.memory_rows)
        return
    if args.side == "ours":
        ours_side(args.rows, args.fragment_rows, args.tmp, args.labels.split(","))
        return
    if args.side is not None:
        sides = {"model": model_side, "loop": loop_side, "ray": ray_side}
        sides[args.side](args.rows, args.fragment_rows, args.tmp)
        return
    print_machine()
    print(f"{GPUS} simulated GPUs (workers on CPU); tables in fragments of {args.fragment_rows:,} rows")
    if args.only in (None, "speed"):
        speed(args.rows, args.fragment_rows, args.skip_ray, max(1, args.reps))
    if args.only in (None, "memory"):
        memory(args.memory_rows, args.fragment_rows)


if __name__ == "__main__":
    main()
