"""One key cannot stall the server: `/v1/health` and another team's jobs while a big batch is created, cancelled,
retried and cancelled again (issue 27).

    .venv/bin/python benchmarks/bench_cancel_stall.py [--chunks 20000]

Team A creates a batch of ``--chunks`` one-row chunks on the class's two simulated GPUs (each chunk waits for a
file that never appears, so all stay queued or running), cancels it, retries it (every chunk submitted again) and
cancels it again.  Meanwhile a thread polls `/v1/health` and another submits team B's CPU job and waits for its
result, one after the other.  Printed: the wall time of each step, `/v1/health` p99 and team B's submit → result median and p99 during it (target < 50 ms
each).  No timed asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import percentile, print_machine, register, registration, server, summary, two_teams

HOLD = "import os\nimport time\n\n\ndef hold(path: str) -> str:\n    while not os.path.exists(path):\n        time.sleep(0.05)\n    return path\n"
DOUBLE = "def double(x: int) -> int:\n    return 2 * x\n"
A_KEY, B_KEY = "bench-team-a-key-000001", "bench-team-b-key-000002"
KEYS = two_teams(A_KEY, B_KEY)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=20000)
    args = parser.parse_args()
    print_machine()
    with tempfile.TemporaryDirectory(prefix="lancefn-bench-stall-") as tmp:
        keys = Path(tmp) / "api_keys.toml"
        keys.write_text(KEYS)
        os.chmod(keys, 0o600)
        with server(args=["--api-keys", str(keys)]) as s:
            a = s.http(headers={"x-api-key": A_KEY}, timeout=600)
            b = s.http(headers={"x-api-key": B_KEY}, timeout=60)
            hold = register(a, registration("hold", HOLD, "hold", arrow_type="utf8", arg=("path", None)))["version"]
            double = register(b, registration("double", DOUBLE, "double", num_gpus=None))["version"]
            never = str(Path(tmp) / "never")
            chunks = [[{"path": never}] for _ in range(args.chunks)]
            health: list[tuple[float, float]] = []  # (when it was sent, how long it took)
            jobs: list[tuple[float, float]] = []
            done = threading.Event()

            def poll_health() -> None:
                while not done.is_set():
                    start = time.perf_counter()
                    b.get("/v1/health").raise_for_status()
                    health.append((start, time.perf_counter() - start))
                    time.sleep(0.005)

            def other_team() -> None:
                while not done.is_set():
                    start = time.perf_counter()
                    job = b.post("/v1/functions/run", json={"name": "double", "version": double, "rows": [{"x": 2}]})
                    job_id = job.json()["job_id"]
                    result = b.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 50}).json()
                    assert result["job_state"] == "DONE" and result["result"] == [4], result
                    jobs.append((start, time.perf_counter() - start))

            for _ in range(3):  # warm: team B's worker started
                warm = b.post("/v1/functions/run", json={"name": "double", "version": double, "rows": [{"x": 1}]})
                b.post("/v1/jobs/wait", json={"job_id": warm.json()["job_id"], "timeout_s": 50})
            threads = [threading.Thread(target=poll_health), threading.Thread(target=other_team)]
            for thread in threads:
                thread.start()
            windows: dict[str, tuple[float, float]] = {}

            last_job: list[str] = [""]

            def all_submitted() -> None:
                # The reply comes after the first slice; chunks are submitted in order, so the newest job of
                # team A is the last chunk's once every chunk is (another one than last time: after a retry).
                while True:
                    newest = a.post("/v1/jobs/list", json={"job_type": "run_function", "limit": 1}).json()["jobs"]
                    if (
                        newest
                        and newest[0]["spec"].get("chunk") == args.chunks - 1
                        and newest[0]["job_id"] != last_job[0]
                    ):
                        last_job[0] = newest[0]["job_id"]
                        return
                    time.sleep(0.05)

            def timed(phase: str, path: str, body: dict, until: Any = None) -> dict:
                time.sleep(0.5)
                start = time.perf_counter()
                reply = a.post(path, json=body)
                reply.raise_for_status()
                if until is not None:
                    until()
                windows[phase] = (start, time.perf_counter())
                return reply.json()

            create = {"name": "hold", "version": hold, "chunks": chunks}
            batch_id = timed("create", "/v1/batches/create", create, all_submitted)["batch_id"]
            timed("cancel", "/v1/batches/cancel", {"batch_id": batch_id})
            # Every chunk submitted again: the newest job is the last chunk's once more.
            timed("retry", "/v1/batches/retry", {"batch_id": batch_id}, all_submitted)
            timed("cancel again", "/v1/batches/cancel", {"batch_id": batch_id})
            time.sleep(0.5)
            done.set()
            for thread in threads:
                thread.join()
            state = a.post("/v1/batches/describe", json={"batch_id": batch_id}).json()
            print(f"{args.chunks} chunks; at the end {state['batch_state']} {state['chunk_counts']}")
            for phase, (start, end) in windows.items():
                print(f"{phase}: {end - start:.2f} s", flush=True)
                for label, metric, samples in (
                    ("/v1/health", "health p99", health),
                    ("team B submit -> result", "other team p99", jobs),
                ):
                    during = [took for sent, took in samples if sent + took >= start and sent <= end] or [0.0]
                    p99_ms = round(percentile(during, 99) * 1000, 1)
                    print(
                        f"  {label} during the {phase}: n={len(during)} median {statistics.median(during) * 1000:.1f}"
                        f" ms p99 {p99_ms} ms max {max(during) * 1000:.1f} ms",
                        flush=True,
                    )
                    summary("cancel_stall", f"{metric} during {phase}", p99_ms, "ms", "< 50 ms", p99_ms < 50)
                summary("cancel_stall", f"{phase} wall time", round(end - start, 2), "s", chunks=args.chunks)


if __name__ == "__main__":
    main()
