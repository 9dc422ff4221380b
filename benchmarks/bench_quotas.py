"""What a namespace's quotas bound: the control plane's memory with one team at its quota of queued batch chunks (and,
with ``--jobs``, of queued plain jobs), and what a refused request costs (docs/ARCHITECTURE.md, "Scheduling",
"Batches").

    .venv/bin/python benchmarks/bench_quotas.py [--batches 3] [--chunks 100000] [--jobs 0]
                                                [--quota-chunks N] [--quota-jobs N]

A server whose keys name two namespaces (so the shared defaults hold: 100,000 queued chunks, 20,000 queued jobs per
namespace, unless ``--quota-chunks`` / ``--quota-jobs`` set others: a busy machine submits 100,000 chunks slowly, and
the memory per chunk and per job is the same at a smaller scale).  Team A creates ``--batches`` batches of ``--chunks`` one-row chunks, every chunk submitted at once
(``parallel`` "auto") and each waiting for a file that never appears, so all stay queued; after each the server's
RSS once every chunk is a job.  Past the quota the create is refused (429) and the RSS is the same.  Then, with
``--jobs N``, team B queues N plain jobs the same way and the N+1st is refused.  Printed: RSS after each step, its
growth, and the refusal's message and reply time.  No timed asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_machine, register, registration, rss_mb, server, settle, summary, two_teams

HOLD = "import os\nimport time\n\n\ndef hold(path: str) -> str:\n    while not os.path.exists(path):\n        time.sleep(0.05)\n    return path\n"
A_KEY, B_KEY = "bench-quota-a-key-000001", "bench-quota-b-key-000002"
KEYS = two_teams(A_KEY, B_KEY)


def _all_queued(admin, jobs: int) -> None:
    """Wait until ``jobs`` jobs are pending or running: ``gpu/usage`` is O(classes), so asking once a second does not
    slow the batch's submissions, as a listing of its jobs would (each takes the job table's lock)."""
    while True:
        classes = admin.get("/v1/gpu/usage").json()["classes"]
        if sum(c["jobs_pending"] + c["jobs_running"] for c in classes) >= jobs:
            return
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=0, help="then queue this many plain jobs of team B (0: none)")
    parser.add_argument("--quota-chunks", type=int, help="--max-queued-chunks-per-namespace (default: the server's)")
    parser.add_argument("--quota-jobs", type=int, help="--max-queued-jobs-per-namespace (default: the server's)")
    args = parser.parse_args()
    quotas = [*(["--max-queued-chunks-per-namespace", str(args.quota_chunks)] if args.quota_chunks else [])]
    quotas += ["--max-queued-jobs-per-namespace", str(args.quota_jobs)] if args.quota_jobs else []
    print_machine()
    with tempfile.TemporaryDirectory(prefix="lancefn-bench-quotas-") as tmp:
        keys = Path(tmp) / "api_keys.toml"
        keys.write_text(KEYS)
        os.chmod(keys, 0o600)
        never = str(Path(tmp) / "never")
        with server(args=["--api-keys", str(keys), "--max-body-bytes", str(64 << 20), *quotas]) as s:
            admin = s.http()
            a = s.http(headers={"x-api-key": A_KEY}, timeout=600)
            b = s.http(headers={"x-api-key": B_KEY}, timeout=60)
            body = registration("hold", HOLD, "hold", arrow_type="utf8", arg=("path", None))
            hold_a, hold_b = register(a, body)["version"], register(b, body)["version"]
            settle(s.pid)
            start_mb = rss_mb(s.pid)
            print(f"server RSS at start: {start_mb:.0f} MB", flush=True)
            chunks = [[{"path": never}] for _ in range(args.chunks)]
            queued = 0
            for index in range(args.batches):
                began = time.perf_counter()
                reply = a.post(
                    "/v1/batches/create", json={"name": "hold", "version": hold_a, "chunks": chunks, "fresh": True}
                )
                took_ms = (time.perf_counter() - began) * 1000
                if reply.status_code == 429:
                    message = reply.json()["error"]["message"]
                    print(f"batch {index + 1}: refused (429) in {took_ms:.0f} ms: {message}", flush=True)
                else:
                    reply.raise_for_status()
                    queued += args.chunks
                    _all_queued(admin, queued)
                settle(s.pid)
                mb = rss_mb(s.pid)
                print(f"after batch {index + 1} ({args.chunks} chunks): RSS {mb:.0f} MB (+{mb - start_mb:.0f} MB)")
                if reply.status_code != 429:
                    print(f"  per queued chunk: {(mb - start_mb) * 2**20 / queued:.0f} bytes", flush=True)
            batches_mb = rss_mb(s.pid) - start_mb
            summary("quotas", f"RSS growth, {args.batches} batches of {args.chunks} chunks", round(batches_mb), "MB")
            if args.jobs:
                before = rss_mb(s.pid)
                run = {"name": "hold", "version": hold_b, "rows": [{"path": never}]}
                refused = None
                for _ in range(args.jobs + 1):
                    reply = b.post("/v1/functions/run", json=run)
                    if reply.status_code == 429:
                        refused = reply.json()["error"]["message"]
                        break
                    reply.raise_for_status()
                settle(s.pid)
                jobs_mb = rss_mb(s.pid) - before
                print(f"{args.jobs} queued jobs of team B: RSS +{jobs_mb:.0f} MB", flush=True)
                print(f"  per queued job: {jobs_mb * 2**20 / args.jobs:.0f} bytes; the next: {refused}", flush=True)
                summary("quotas", f"RSS growth, {args.jobs} queued jobs", round(jobs_mb), "MB")


if __name__ == "__main__":
    main()
