"""Scheduler throughput: pure placement decisions, and 10,000 queued trivial jobs end to end.

    .venv/bin/python benchmarks/bench_scheduler.py [--jobs 10000] [--gpus 8] [--threads 4] [--decisions 200000]
                                                   [--namespaces 2]

Targets (2-core machine): pure decisions >= 10,000/s; 10,000 trivial 1-GPU jobs on 8 simulated
GPUs through the REST API and the local executor >= 200 jobs/s end to end, control plane
RSS <= 200 MB, nothing lost (DONE count == submitted, every result correct).

The end-to-end run first starts one "gate" job that holds all 8 GPUs until a file appears, then
submits every trivial job as its own ``POST /v1/functions/run`` (one row each) from ``--threads``
client threads with keep-alive connections (``--client``: the notebook's own client, by default, or
httpx), so all of them queue (FIFO) behind the gate; then
it opens the gate and waits until ``/v1/gpu/usage`` shows nothing pending or running, and
accounts for every job by paging ``/v1/jobs/list``.  Reported: the submit rate (with the queue
growing to 10,000), the drain rate (gate open → all DONE) and end to end (first submit → all
DONE).  ``--no-gate`` streams jobs instead (they run as they arrive).  The server's VmRSS is
sampled every 100 ms throughout.  ``--namespaces N``: N teams (keys in N namespaces) register the
same function and submit at once, so every device runs workers of N (namespace, version) pairs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import RssSampler, print_machine, register, registration, rss_mb, server, summary, trivial_registration

BENCH = "scheduler"


def pure_decisions(total: int, gpus: int) -> dict:
    """Placements per second of ``SchedulerState``: enqueue, schedule, release, FIFO on one class."""
    from lancefn_jupyter.server.policy.scheduler import SchedulerState

    devices = [f"sim{i}" for i in range(gpus)]
    results = {}
    # With a warm lookup (docs/ARCHITECTURE.md, "Warm state"): every head asks it; each of 4 versions
    # has an idle worker on 2 of the devices, so a placement takes a warm set when one is free.
    owners = [("default", f"f{i}", "v1") for i in range(4)]
    warm_sets = {owner: [(devices[i % gpus],), (devices[(i + 4) % gpus],)] for i, owner in enumerate(owners)}
    for label, depth, warm in (
        ("queue depth ~gpus", gpus, None),
        ("queue depth 10,000", 10_000, None),
        ("queue depth ~gpus, warm lookup", gpus, warm_sets.__getitem__),
        ("queue depth 10,000, warm lookup", 10_000, warm_sets.__getitem__),
    ):
        state = SchedulerState({"default": devices}, warm=warm)
        next_id = 0
        for _ in range(depth):  # pre-fill the queue
            state.enqueue(f"j{next_id}", "default", 1, owners[next_id % 4] if warm else None)
            next_id += 1
        placed = 0
        running: list[str] = []
        started = time.perf_counter()
        while placed < total:
            for placement in state.schedule():
                running.append(placement.job_id)
                placed += 1
            for job_id in running:  # every running job finishes; as many new ones arrive
                state.release(job_id)
                state.enqueue(f"j{next_id}", "default", 1, owners[next_id % 4] if warm else None)
                next_id += 1
            running.clear()
        elapsed = time.perf_counter() - started
        rate = placed / elapsed
        results[label] = rate
        print(
            f"pure decisions ({label}): {placed} placements (+ as many enqueues and releases) in {elapsed:.3f} s = {rate:,.0f}/s"
        )
    # What the core pays per PENDING job event: its 1-based queue position.
    state = SchedulerState({"default": devices})
    for i in range(10_000):
        state.enqueue(f"q{i}", "default", 1)
    started = time.perf_counter()
    for i in range(0, 10_000, 10):
        state.queue_position(f"q{i}")
    per_call = (time.perf_counter() - started) / 1000
    print(f"queue_position() at queue depth 10,000: {per_call * 1e6:.1f} us per call (averaged over positions)")
    return results


GATE_SOURCE = """from __future__ import annotations

import os
import time


def gate(path: str) -> int:
    while not os.path.exists(path):
        time.sleep(0.005)
    return 0
"""


def _gate_registration(gpus: int) -> dict:
    return registration("gate", GATE_SOURCE, "gate", num_gpus=gpus, arg=("path", "utf8"))


def _team_keys(namespaces: int, work: Path) -> tuple[list[str], list[str]]:
    """``--api-keys`` args and one key per namespace (team0, team1, …) for a multi-team run."""
    keys = [f"bench-team{i}-key-{i:08d}" for i in range(namespaces)]
    path = work / "api_keys.toml"
    path.write_text(
        "".join(
            f'[[api_keys]]\nname = "team{i}"\nkey = "{key}"\nprivileges = ["functions", "jobs", "system_usage"]\n\n'
            for i, key in enumerate(keys)
        )
    )
    path.chmod(0o600)  # the server refuses a key file others can read
    return ["--api-keys", str(path)], keys


def end_to_end(
    jobs: int, gpus: int, threads: int, gate: bool, namespaces: int = 1, client_kind: str = "lancefn"
) -> dict:
    classes = f'[[gpu_classes]]\nname = "default"\nsimulated = {gpus}\nmax_gpu_count_per_worker = {gpus}\n'
    work = Path(tempfile.mkdtemp(prefix="lancefn-bench-keys-"))
    args, team_keys = _team_keys(namespaces, work) if namespaces > 1 else ([], [])
    with server(gpu_classes=classes, args=args) as srv, srv.http() as http:
        version = register(http, trivial_registration())["version"]
        for key in team_keys:  # the same function in each team's namespace (same version id)
            with srv.http(headers={"x-api-key": key}) as team:
                assert register(team, trivial_registration())["version"] == version
        gate_version = register(http, _gate_registration(gpus))["version"] if gate else None
        # Where the gate job can see it: a root server runs workers as an unprivileged user
        # (--worker-user), who cannot look into the server's private temp dir.
        gate_dir = Path(tempfile.mkdtemp(prefix="lancefn-bench-gate-"))
        gate_dir.chmod(0o755)
        gate_file = gate_dir / "gate-open"
        # Let the pre-started workers come up so the run measures scheduling, not forks.
        time.sleep(2.0)
        baseline_rss = rss_mb(srv.pid)

        rss = RssSampler(srv.pid, 0.1)

        submitted: list[list[tuple[str, int]]] = [[] for _ in range(threads)]
        errors: list[str] = []

        def submit(index: int) -> None:
            # Teams submit at once: thread i uses team i % namespaces (the admin for one namespace).
            key = team_keys[index % namespaces] if team_keys else srv.api_key
            if client_kind == "lancefn":  # the notebook's own client (what `f.submit` sends through)
                from lancefn_jupyter.client import Client, LancefnError

                ours = Client(srv.url, key)
                try:
                    for x in range(index, jobs, threads):
                        try:
                            submitted[index].append((ours.functions.run("inc", version, [{"x": x}]), x))
                        except LancefnError as error:
                            errors.append(str(error))
                finally:
                    ours.close()
                return
            with srv.http(headers={"x-api-key": key}) as client:
                for x in range(index, jobs, threads):
                    reply = client.post(
                        "/v1/functions/run", json={"name": "inc", "version": version, "rows": [{"x": x}]}
                    )
                    if reply.status_code != 202:
                        errors.append(reply.text)
                        continue
                    submitted[index].append((reply.json()["job_id"], x))

        started = time.perf_counter()
        if gate:
            reply = http.post(
                "/v1/functions/run",
                json={"name": "gate", "version": gate_version, "rows": [{"path": str(gate_file)}]},
            )
            gate_job = reply.json()["job_id"]
            while http.post("/v1/jobs/describe", json={"job_id": gate_job}).json()["job_state"] != "IN_PROGRESS":
                time.sleep(0.01)
        workers = [threading.Thread(target=submit, args=(i,)) for i in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        submit_done = time.perf_counter()
        (usage,) = http.get("/v1/gpu/usage").json()["classes"]
        max_pending = usage["jobs_pending"]
        gate_file.touch()
        while True:
            (usage,) = http.get("/v1/gpu/usage").json()["classes"]
            max_pending = max(max_pending, usage["jobs_pending"])
            if usage["jobs_pending"] == 0 and usage["jobs_running"] == 0:
                break
            time.sleep(0.05)
        finished = time.perf_counter()
        rss.stop()
        final_rss = rss_mb(srv.pid)

        # Account for every job: page through DONE run_function jobs and check each result.
        expected = {job_id: x + 1 for part in submitted for job_id, x in part}
        seen: dict[str, int] = {}
        body = {"state": "DONE", "name": "inc", "job_type": "run_function", "limit": 1000}
        while True:
            page = http.post("/v1/jobs/list", json=body).json()
            for job in page["jobs"]:
                seen[job["job_id"]] = job["result"][0]
            if not page.get("page_token"):
                break
            body["page_token"] = page["page_token"]
        correct = sum(1 for job_id, value in expected.items() if seen.get(job_id) == value)
        (usage,) = http.get("/v1/gpu/usage").json()["classes"]

    total_s = finished - started
    return {
        "drain_s": finished - submit_done,
        "drain_per_s": len(expected) / (finished - submit_done),
        "submitted": len(expected),
        "rejected": len(errors),
        "done": len(seen),
        "correct": correct,
        "submit_s": submit_done - started,
        "total_s": total_s,
        "jobs_per_s": len(expected) / total_s,
        "submit_per_s": len(expected) / (submit_done - started),
        "max_pending": max_pending,
        "rss_baseline": baseline_rss,
        "rss_peak": max([*rss.samples, final_rss]),
        "rss_final": final_rss,
        "gpus_busy_after": usage["gpus_busy"],
        "namespaces": namespaces,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--skip-e2e", action="store_true")
    parser.add_argument(
        "--no-gate",
        action="store_true",
        help="stream jobs (they run as they arrive) instead of queueing them all first",
    )
    parser.add_argument(
        "--client",
        choices=("lancefn", "httpx"),
        default="lancefn",
        help="what submits: the notebook's own client (lancefn_jupyter.client, default) or httpx, which costs "
        "as much CPU per request as the server does on a 2-core machine",
    )
    parser.add_argument(
        "--namespaces",
        type=int,
        default=1,
        help="teams submitting at once, each with its own key and namespace (default 1: the admin)",
    )
    args = parser.parse_args(argv)
    print_machine()

    rates = pure_decisions(args.decisions, args.gpus)
    worst = min(rates.values())
    summary(BENCH, "pure scheduler decisions", round(worst), "/s", ">= 10,000/s", worst >= 10_000)
    if args.skip_e2e:
        return 0

    r = end_to_end(
        args.jobs, args.gpus, args.threads, gate=not args.no_gate, namespaces=args.namespaces, client_kind=args.client
    )
    print(
        f"end to end: {r['submitted']} jobs submitted ({r['rejected']} rejected) in {r['submit_s']:.1f} s "
        f"({r['submit_per_s']:.0f}/s, {r['max_pending']} queued when submission ended); "
        f"queue drained in {r['drain_s']:.1f} s ({r['drain_per_s']:.0f} jobs/s); first submit to all DONE "
        f"{r['total_s']:.1f} s = {r['jobs_per_s']:.0f} jobs/s; DONE {r['done']}, correct results {r['correct']}; "
        f"GPUs busy after: {r['gpus_busy_after']}"
    )
    summary(BENCH, "submit rate (POST functions/run, queue growing)", round(r["submit_per_s"], 1), "jobs/s")
    summary(BENCH, "drain rate of the queued jobs", round(r["drain_per_s"], 1), "jobs/s")
    print(
        f"control plane RSS: {r['rss_baseline']:.0f} MB idle, peak {r['rss_peak']:.0f} MB, {r['rss_final']:.0f} MB after"
    )
    teams = f", {args.namespaces} namespaces at once" if args.namespaces > 1 else ""
    summary(
        BENCH,
        f"{args.jobs} jobs on {args.gpus} simulated GPUs{teams}, end to end",
        round(r["jobs_per_s"], 1),
        "jobs/s",
        ">= 200 jobs/s",
        r["jobs_per_s"] >= 200,
    )
    summary(
        BENCH, "control plane peak RSS during the run", round(r["rss_peak"], 1), "MB", "<= 200 MB", r["rss_peak"] <= 200
    )
    lost = r["submitted"] - r["correct"]
    summary(
        BENCH, "jobs lost or wrong", lost, "jobs", "0", lost == 0 and r["rejected"] == 0 and r["gpus_busy_after"] == 0
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
