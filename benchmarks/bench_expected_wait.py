"""Honesty of the expected start shown for pending jobs (`placement.expected_start_ms`).

    .venv/bin/python benchmarks/bench_expected_wait.py [--jobs 50] [--gpus 2] [--interval 0.3] [--seed 17] [--new-versions 8]

A steady synthetic workload on a real control plane with ``--gpus`` simulated GPUs: three versions of
one function that sleep 0.2 s, 0.6 s and 1.2 s, each run ×U(0.7, 1.3) (mixed durations); each version first runs twice so it has
history. Then ``--jobs`` one-row jobs of randomly chosen versions arrive every ``--interval`` s (a bit
faster than the GPUs drain them, so the queue grows); ``--new-versions`` of them, spread evenly, are the
first job of a version never run before that sleeps 2.4 s (issue 29: no history, longer than the class's
runs), so the jobs queued behind it exercise the estimate of a running job without history. For every job still pending right after its submit,
the estimate read then (``jobs/describe``) is compared with the job's actual start:

    error = |estimated wait - actual wait| / actual wait     (wait = start - submit)

Reported: the median (target <= 25 %) and 90th percentile of that error, and how many jobs had an
estimate, and how many of those the control plane flagged uncertain (``expected_start_uncertain``) with
their median error apart. Jobs that started at once carry no estimate and are not counted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import percentile, print_machine, register, registration, server, summary

BENCH = "expected_wait"
DURATIONS_S = (0.2, 0.6, 1.2)
NEW_VERSION_S = 2.4  # the versions with no history
JITTER = 0.3  # each run takes its version's duration × a uniform factor in [0.7, 1.3]


def _registration(seconds: float, tag: int = 0) -> dict:
    source = (
        "from __future__ import annotations\n\nimport time\n\n\n"
        f"def nap(x: float) -> float:\n    time.sleep({seconds} * x)\n    return x + {tag}\n"
    )
    return registration("nap", source, "nap", "float64")


def _wait_all(http, job_ids: list[str]) -> dict[str, dict]:
    done = {}
    for job_id in job_ids:
        job = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
        while job["job_state"] in ("PENDING", "IN_PROGRESS"):
            job = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60}).json()
        done[job_id] = job
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.3, help="seconds between submits")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--new-versions", type=int, default=8, help="jobs that are a new version's first run")
    args = parser.parse_args()
    print_machine()
    classes = (
        '[[gpu_classes]]\nname = "default"\ngpu_model = "Simulated GPU"\ngpu_memory_bytes = 17179869184\n'
        f"max_gpu_count_per_worker = {args.gpus}\nsimulated = {args.gpus}\n"
    )
    rng = random.Random(args.seed)
    with server(gpu_classes=classes) as srv, srv.http() as http:
        versions = [register(http, _registration(s))["version"] for s in DURATIONS_S]
        warmup = [
            http.post("/v1/functions/run", json={"name": "nap", "version": v, "rows": [{"x": 1.0}]}).json()["job_id"]
            for v in versions
            for _ in range(2)
        ]
        _wait_all(http, warmup)
        fresh = [register(http, _registration(NEW_VERSION_S, tag + 1))["version"] for tag in range(args.new_versions)]
        every = max(1, args.jobs // max(1, args.new_versions))

        submitted: list[tuple[str, float, int | None]] = []  # (job id, submit ms, expected start ms)
        uncertain: set[str] = set()
        next_at = time.monotonic()
        for index in range(args.jobs):
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += args.interval
            submit_ms = time.time() * 1000
            version = fresh.pop() if fresh and index % every == every // 2 else rng.choice(versions)
            job_id = http.post(
                "/v1/functions/run",
                json={"name": "nap", "version": version, "rows": [{"x": rng.uniform(1 - JITTER, 1 + JITTER)}]},
            ).json()["job_id"]
            job = http.post("/v1/jobs/describe", json={"job_id": job_id}).json()
            expected = job["placement"].get("expected_start_ms") if job["job_state"] == "PENDING" else None
            if expected is not None and job["placement"].get("expected_start_uncertain"):
                uncertain.add(job_id)
            submitted.append((job_id, submit_ms, expected))
        finished = _wait_all(http, [job_id for job_id, _, _ in submitted])

    errors, unknown, immediate, vague = [], 0, 0, []
    for job_id, submit_ms, expected in submitted:
        job = finished[job_id]
        if expected is None:
            if job.get("started_ms") is not None and job["started_ms"] - submit_ms < 50:
                immediate += 1
            else:
                unknown += 1
            continue
        actual_wait = job["started_ms"] - submit_ms
        estimated_wait = expected - submit_ms
        errors.append(abs(estimated_wait - actual_wait) / max(actual_wait, 1.0))
        if job_id in uncertain:
            vague.append(errors[-1])
    waits = [finished[j]["started_ms"] - s for j, s, e in submitted if e is not None]
    print(
        f"{args.jobs} jobs ({', '.join(f'{d:g}s' for d in DURATIONS_S)} versions ×U(0.7, 1.3), random; {args.new_versions} first runs"
        f" of new {NEW_VERSION_S:g}s versions) on {args.gpus} simulated GPUs, one every {args.interval:g}s"
    )
    print(
        f"  estimated at submit: {len(errors)}   started at once (no estimate): {immediate}   pending without estimate: {unknown}"
    )
    if not errors:
        print("  no pending job had an estimate: nothing to measure")
        summary(BENCH, "median_abs_error", float("nan"), "%", "<= 25 %", False)
        return
    median, p90 = statistics.median(errors) * 100, percentile(errors, 90) * 100
    print(f"  actual wait: median {statistics.median(waits) / 1000:.2f}s, max {max(waits) / 1000:.2f}s")
    print(f"  |estimated - actual| / actual wait: median {median:.1f} %  p90 {p90:.1f} %  (target: median <= 25 %)")
    if vague:
        print(f"  flagged uncertain: {len(vague)}, their median error {statistics.median(vague) * 100:.1f} %")
    summary(BENCH, "median_abs_error", round(median, 1), "%", "<= 25 %", median <= 25, n=len(errors))
    summary(BENCH, "p90_abs_error", round(p90, 1), "%", n=len(errors))
    summary(BENCH, "uncertain_estimates", len(vague), "jobs", n=len(errors))


if __name__ == "__main__":
    main()
