"""Batches: fan-out speed-up, scheduling overhead per chunk, LanceDB backfill rate (issue 16).

    .venv/bin/python benchmarks/bench_batches.py [--skip-ray] [--backfill-rows 100000]

1. **Fan-out.** A class of 8 simulated GPUs, 64 rows that each sleep 0.25 s, cut into 8 chunks of 8:
   `map(parallel=8)` vs `map(parallel=1)` (the same chunks one at a time), and next to it
   `ray.get([g.remote(chunk) for chunk in chunks])` over the same chunks on a local Ray with 8 logical GPUs,
   run in its own process in the same run. Targets: parallel=8 ≥ 6× faster than parallel=1, and within 1.2× of Ray.
2. **Scheduling overhead per chunk.** 1,000 chunks of one trivial row on the same 8 GPUs: wall time from
   `map` to every result in hand, per chunk (target ≤ 2 ms), and the `batches/create` request alone per chunk.
3. **LanceDB backfill.** 100,000 rows, a trivial function (`len(text)`): `map(table, column=, into=)` rows/s next
   to a plain loop that reads the column, computes and `merge_insert`s per chunk itself. Target ≥ 0.5× the loop.

Each side warms up first (worker processes started); figures are medians of the runs. No timed asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_machine, server, summary

EIGHT_GPUS = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated GPU"
gpu_memory_bytes = 1073741824
max_gpu_count_per_worker = 8
simulated = 8
"""
SLEEP_S = 0.25
ROWS = 64
CHUNK = 8


def nap(x: int) -> int:
    import time

    time.sleep(0.25)
    return x


def inc(x: int) -> int:
    return x + 1


def text_len(text: str) -> int:
    return len(text)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def ray_side(runs: int) -> None:
    """In its own process: `ray.get([g.remote(chunk) …])` over 8 chunks of 8 sleeping rows, 8 logical GPUs."""
    import ray

    with tempfile.TemporaryDirectory(prefix="lancefn-bench-ray-") as tmp:
        ray.init(address="local", num_cpus=8, num_gpus=8, include_dashboard=False, log_to_driver=False, _temp_dir=tmp)

        @ray.remote(num_gpus=1, max_calls=0)  # reuse workers, as our warm workers do (Ray's GPU default is 1 call)
        def g_reuse(chunk: list) -> list:
            return [nap(x) for x in chunk]

        chunks = [list(range(i, i + CHUNK)) for i in range(0, ROWS, CHUNK)]
        ray.get([g_reuse.remote(c) for c in chunks])  # warm: 8 workers started
        samples = [timed(lambda: ray.get([g_reuse.remote(c) for c in chunks])) for _ in range(runs)]
        ray.shutdown()
    print("RAY " + json.dumps({"samples": samples}), flush=True)


def fan_out(runs: int, skip_ray: bool) -> None:
    from lancefn_jupyter.kernel import api

    with server(gpu_classes=EIGHT_GPUS) as srv:
        srv.connect()
        fn = api.gpu_function(num_gpus=1)(nap)
        items = list(range(ROWS))
        fn.map(items, parallel=8, chunk_size=CHUNK, fresh=True).result()  # warm: 8 workers started
        wide = [timed(lambda: fn.map(items, parallel=8, chunk_size=CHUNK, fresh=True).result()) for _ in range(runs)]
        narrow = [
            timed(lambda: fn.map(items, parallel=1, chunk_size=CHUNK, fresh=True).result())
            for _ in range(max(1, runs // 2))
        ]
    w, n = statistics.median(wide), statistics.median(narrow)
    print(
        f"fan-out: 64 rows × {SLEEP_S}s on 8 simulated GPUs: parallel=8 {w:.2f}s, parallel=1 {n:.2f}s (ideal {ROWS * SLEEP_S / 8:.1f}s / {ROWS * SLEEP_S:.1f}s)"
    )
    summary("bench_batches.py", "map parallel=8, 64 rows x 0.25 s (median)", round(w, 3), "s")
    summary("bench_batches.py", "map parallel=1, same chunks (median)", round(n, 3), "s")
    summary("bench_batches.py", "speed-up parallel=8 vs parallel=1", round(n / w, 2), "x", ">= 6", n / w >= 6)
    if skip_ray:
        return
    proc = subprocess.run(
        [sys.executable, __file__, "--ray-side", "--runs", str(runs)], capture_output=True, text=True, timeout=600
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RAY ")), None)
    if line is None:
        print(f"Ray side failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return
    r = statistics.median(json.loads(line[4:])["samples"])
    print(f"Ray: ray.get([g.remote(chunk) for chunk in chunks]) {r:.2f}s; ours / Ray = {w / r:.2f}×")
    summary("bench_batches.py", "Ray ray.get over the same 8 chunks, 8 logical GPUs (median)", round(r, 3), "s")
    summary("bench_batches.py", "ours parallel=8 / Ray (median ratio)", round(w / r, 2), "x", "<= 1.2", w / r <= 1.2)


def overhead(chunks: int, runs: int) -> None:
    from lancefn_jupyter.kernel import api

    with server(gpu_classes=EIGHT_GPUS) as srv:
        srv.connect()
        fn = api.gpu_function(num_gpus=1)(inc)
        items = list(range(chunks))
        fn.map(items[:64], parallel="auto", chunk_size=1, fresh=True).result()  # warm
        ends, creates = [], []
        for _ in range(runs):
            start = time.perf_counter()
            batch = fn.map(items, parallel="auto", chunk_size=1, fresh=True)
            creates.append(time.perf_counter() - start)
            batch.wait()
            ends.append(time.perf_counter() - start)
            assert batch.snapshot.batch_state.value == "DONE"
    per_chunk = statistics.median(ends) / chunks * 1000
    per_create = statistics.median(creates) / chunks * 1000
    print(
        f"{chunks} chunks of one trivial row on 8 GPUs: {statistics.median(ends):.2f}s to all done = {per_chunk:.2f} ms per chunk; "
        f"map() (cut, batches/create, every chunk job queued) returns after {per_create:.3f} ms per chunk"
    )
    summary(
        "bench_batches.py",
        f"{chunks} trivial chunks, map to all done, per chunk (median)",
        round(per_chunk, 3),
        "ms",
        "<= 2 ms",
        per_chunk <= 2,
    )
    summary(
        "bench_batches.py", "map() returning (every chunk job queued), per chunk (median)", round(per_create, 3), "ms"
    )


def backfill(rows: int, chunk: int) -> None:
    import lancedb
    import pyarrow as pa

    from lancefn_jupyter.kernel import api

    texts = [f"row {i} " * (i % 5 + 1) for i in range(rows)]
    with tempfile.TemporaryDirectory(prefix="lancefn-bench-lance-") as tmp, server(gpu_classes=EIGHT_GPUS) as srv:
        db = lancedb.connect(tmp)
        srv.connect()
        fn = api.gpu_function(num_gpus=1)(text_len)
        fn.map(texts[:64], parallel="auto", chunk_size=8).result()  # warm: workers started
        warm = db.create_table("warm", pa.table({"id": list(range(1000)), "text": texts[:1000]}), mode="overwrite")
        fn.map(
            warm, column="text", into="n", parallel="auto", chunk_size=100
        ).result()  # warm: the table path's imports

        def ours() -> None:
            table = db.create_table("ours", pa.table({"id": list(range(rows)), "text": texts}), mode="overwrite")
            backfilled = fn.map(table, column="text", into="n", parallel="auto", chunk_size=chunk, fresh=True)
            backfilled.result()
            assert table.count_rows("n IS NULL") == 0

        def loop() -> None:
            table = db.create_table("loop", pa.table({"id": list(range(rows)), "text": texts}), mode="overwrite")
            data = table.search().select(["id", "text"]).limit(None).to_arrow()
            ids, values = data["id"].to_pylist(), data["text"].to_pylist()
            table.add_columns(pa.field("n", pa.int64()))
            for start in range(0, rows, chunk):
                part = pa.table(
                    {"id": ids[start : start + chunk], "n": [text_len(t) for t in values[start : start + chunk]]}
                )
                table.merge_insert("id").when_matched_update_all().execute(part)
            assert table.count_rows("n IS NULL") == 0

        ours_s = statistics.median(timed(ours) for _ in range(3))
        loop_s = statistics.median(timed(loop) for _ in range(3))
    ratio = (rows / ours_s) / (rows / loop_s)
    print(
        f"LanceDB backfill of {rows:,} rows (chunks of {chunk:,}): ours {rows / ours_s:,.0f} rows/s, plain loop {rows / loop_s:,.0f} rows/s, ratio {ratio:.2f}"
    )
    summary("bench_batches.py", f"LanceDB backfill {rows} rows, ours (median)", round(rows / ours_s), "rows/s")
    summary("bench_batches.py", f"LanceDB backfill {rows} rows, plain loop (median)", round(rows / loop_s), "rows/s")
    summary("bench_batches.py", "backfill ours / plain loop (rate ratio)", round(ratio, 2), "x", ">= 0.5", ratio >= 0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--backfill-rows", type=int, default=100_000)
    parser.add_argument("--backfill-chunk", type=int, default=10_000)
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--only", choices=("fanout", "overhead", "backfill"))
    parser.add_argument("--ray-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ray_side:
        ray_side(args.runs)
        return
    os.environ.setdefault("LANCEFN_DISABLE_NVML", "1")
    print_machine()
    if args.only in (None, "fanout"):
        fan_out(args.runs, args.skip_ray)
    if args.only in (None, "overhead"):
        overhead(args.chunks, args.runs)
    if args.only in (None, "backfill"):
        backfill(args.backfill_rows, args.backfill_chunk)


if __name__ == "__main__":
    main()
