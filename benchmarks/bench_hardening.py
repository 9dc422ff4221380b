"""Does one heavy or hostile client stall the control plane for everyone else?

* **health p99 under load** — ``GET /v1/health`` latency, one request after another, while one
  client registers maximum-size artifacts (just under ``--max-artifact-bytes``, a list literal:
  the worst case for ``ast.parse``) and another posts maximum-size ``rows`` bodies (just under
  ``--max-body-bytes``; each job is cancelled at once).  Target: p99 ≤ 50 ms.
* **RSS under unauthenticated floods** — the server's peak resident memory while 8 clients at
  once POST maximum-size bodies without an API key, a few times each.  Target: ≤ 150 MB.

Default server flags (4 MiB artifacts, 8 MiB bodies).  Never asserts on time.

    .venv/bin/python benchmarks/bench_hardening.py [--artifacts 3] [--row-posts 3] [--floods 3]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import threading
import time

import httpx
from _common import describe, percentile, print_machine, rss_mb, server, summary, trivial_registration

MAX_ARTIFACT = 4 * 1024 * 1024
MAX_BODY = 8 * 1024 * 1024
BENCH = "bench_hardening.py"


def big_artifact_registration(seed: int) -> dict:
    body = trivial_registration(f"big{seed}", num_gpus=None)
    head = f"# {seed}\ndef inc(x: int) -> int:\n    return x + 1\n\nX = ["
    count = (MAX_ARTIFACT - len(head) - 64) // 2
    data = (head + "0," * count + "0]\n").encode()
    body["artifact"]["content"]["data"] = base64.b64encode(data).decode()
    body["artifact"]["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
    return body


def big_rows(name: str, version: str) -> bytes:
    head = json.dumps({"name": name, "version": version, "rows": []})[:-2].encode()
    row = b'{"x":1234567},'
    count = (MAX_BODY - len(head) - 64) // len(row)
    return head + row * (count - 1) + b'{"x":1}]}'


def health_under_load(s, artifacts: int, row_posts: int) -> None:
    with s.http() as http:
        created = http.post("/v1/functions/create", json=trivial_registration("inc", num_gpus=None)).json()
        version = http.post("/v1/jobs/describe", json={"job_id": created["job_id"]}).json()["result"]["version"]
    rows_body = big_rows("inc", version)
    bodies = [big_artifact_registration(i) for i in range(artifacts)]
    outcomes: dict[str, list] = {"artifact": [], "rows": []}

    def register_artifacts() -> None:
        with s.http(timeout=300) as http:
            for body in bodies:
                started = time.perf_counter()
                reply = http.post("/v1/functions/create", json=body)
                outcomes["artifact"].append((reply.status_code, time.perf_counter() - started))

    def post_rows() -> None:
        with s.http(timeout=300) as http:
            for _ in range(row_posts):
                started = time.perf_counter()
                reply = http.post("/v1/functions/run", content=rows_body, headers={"content-type": "application/json"})
                outcomes["rows"].append((reply.status_code, time.perf_counter() - started))
                if reply.status_code == 202:
                    http.post("/v1/jobs/cancel", json={"job_id": reply.json()["job_id"]})

    workers = [threading.Thread(target=register_artifacts), threading.Thread(target=post_rows)]
    samples: list[float] = []
    peak = 0.0
    with httpx.Client(base_url=s.url, timeout=60) as health:
        health.get("/v1/health")
        for worker in workers:
            worker.start()
        while any(worker.is_alive() for worker in workers):
            started = time.perf_counter()
            assert health.get("/v1/health").status_code == 200
            samples.append(time.perf_counter() - started)
            if len(samples) % 50 == 0:
                peak = max(peak, rss_mb(s.pid))
    for worker in workers:
        worker.join()
    d = describe(samples)
    p99 = percentile(samples, 99)
    print(f"artifact registrations (status, s): {[(c, round(t, 2)) for c, t in outcomes['artifact']]}")
    print(
        f"max-size rows posts (status, s):     {[(c, round(t, 2)) for c, t in outcomes['rows']]}  body {len(rows_body)} bytes"
    )
    print(
        f"/v1/health under load: n={d['n']} median {d['median'] * 1000:.2f} ms  p95 {d['p95'] * 1000:.2f} ms  "
        f"p99 {p99 * 1000:.2f} ms  max {d['max'] * 1000:.2f} ms; server RSS peak seen {peak:.0f} MiB"
    )
    summary(
        BENCH,
        "/v1/health p99 while a max-size artifact and max-size rows are posted",
        round(p99 * 1000, 2),
        "ms",
        "<= 50 ms",
        p99 <= 0.050,
        p50_ms=round(d["median"] * 1000, 2),
        max_ms=round(d["max"] * 1000, 2),
        n=d["n"],
    )


def rss_under_unauthenticated_floods(s, floods: int) -> None:
    body = b"x" * MAX_BODY
    baseline = rss_mb(s.pid)
    peak = baseline
    done = threading.Event()
    statuses: list = []

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb(s.pid))
            time.sleep(0.005)

    def flood() -> None:
        with httpx.Client(base_url=s.url, timeout=60) as http:
            for _ in range(floods):
                try:
                    statuses.append(http.post("/v1/functions/create", content=body).status_code)
                except httpx.HTTPError as error:  # the server may close before the body is sent
                    statuses.append(type(error).__name__)

    sampler = threading.Thread(target=sample)
    sampler.start()
    clients = [threading.Thread(target=flood) for _ in range(8)]
    started = time.perf_counter()
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    after = rss_mb(s.pid)
    counts = {str(k): statuses.count(k) for k in sorted(set(statuses), key=str)}
    print(
        f"8 clients x {floods} unauthenticated {MAX_BODY >> 20} MiB POSTs in {elapsed:.2f} s: replies {counts}; "
        f"server RSS {baseline:.0f} MiB before, peak {peak:.0f} MiB, {after:.0f} MiB after"
    )
    summary(
        BENCH,
        "server RSS peak during 8 concurrent unauthenticated max-size POSTs",
        round(peak, 1),
        "MiB",
        "<= 150 MB",
        peak * 1.048576 <= 150,
        before_mib=round(baseline, 1),
        after_mib=round(after, 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--artifacts", type=int, default=3, help="max-size artifacts registered during the health probe"
    )
    parser.add_argument("--row-posts", type=int, default=3, help="max-size rows bodies posted during the health probe")
    parser.add_argument("--floods", type=int, default=3, help="unauthenticated POSTs per client (8 clients)")
    args = parser.parse_args()
    print_machine()
    with server() as s:
        health_under_load(s, args.artifacts, args.row_posts)
    with server() as s:
        rss_under_unauthenticated_floods(s, args.floods)


if __name__ == "__main__":
    main()
