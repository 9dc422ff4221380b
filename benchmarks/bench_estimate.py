"""A batch's estimate before it runs, against what it then took (docs/ARCHITECTURE.md, "Cost").

    .venv/bin/python benchmarks/bench_estimate.py

A class of 4 simulated GPUs priced at 2.5 USD per GPU-hour. A function whose row sleeps 20 ms; 8 chunks of 10 rows
run first (the version's history), then `map(..., dry_run=True)` estimates a 64-chunk batch of the same chunk size,
which then runs. Target: the estimate's time and cost within ±25 % of the batch's (its wall time from `map` to every
result; its jobs' summed cost from `GET /v1/jobs/usage?by=batch`). No timed asserts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_machine, server, summary

PRICED = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated GPU"
gpu_memory_bytes = 1073741824
max_gpu_count_per_worker = 4
simulated = 4
price_per_gpu_hour = 2.5
"""
CHUNK = 10


def pace(x: int) -> int:
    import time

    time.sleep(0.02)
    return x


def main() -> None:
    from lancefn_jupyter.kernel import api, session

    print_machine()
    with server(gpu_classes=PRICED) as srv:
        srv.connect()
        fn = api.gpu_function(num_gpus=1)(pace)
        fn.map(list(range(8 * CHUNK)), chunk_size=CHUNK).result()  # the history: 8 chunks
        estimate = fn.map(list(range(64 * CHUNK)), chunk_size=CHUNK, dry_run=True)
        print(f"estimate: {estimate!r}")
        started = time.perf_counter()
        batch = fn.map(list(range(64 * CHUNK)), chunk_size=CHUNK)
        batch.result()
        took = time.perf_counter() - started
        rows = session.current_client().jobs.usage("batch")["rows"]
        cost = next(row["cost"] for row in rows if row["key"] == batch.batch_id)
    time_ratio, cost_ratio = estimate.expected_s / took, estimate.cost / cost
    print(f"actual: {took:.2f} s, {cost:.5f} USD; estimate/actual: time {time_ratio:.2f}, cost {cost_ratio:.2f}")
    summary("estimate", "time_ratio", round(time_ratio, 3), "x", "0.75-1.25", 0.75 <= time_ratio <= 1.25)
    summary("estimate", "cost_ratio", round(cost_ratio, 3), "x", "0.75-1.25", 0.75 <= cost_ratio <= 1.25)


if __name__ == "__main__":
    main()
