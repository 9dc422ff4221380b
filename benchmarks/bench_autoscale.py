"""Scaling with the queue (docs/ray.md): a GPU class at zero nodes on a cluster with an autoscaler, a burst of jobs.

    .venv/bin/python benchmarks/bench_autoscale.py [--jobs 16] [--seconds 2] [--max-nodes 4] [--idle-timeout 10]

Ray's fake multi-node autoscaler (each node it adds is a raylet on this machine, one GPU of class ``t4`` each, at most
``--max-nodes``, removed when idle ``--idle-timeout`` s) under two control planes run one after the other on the same
cluster, each from zero nodes:

* **before** — the class without ``max_nodes``: today's behaviour, where only the head of the class's queue is
  handed to Ray while no node fits it, so the autoscaler sees one job's worth of demand at a time;
* **queue demand** — the same class with ``max_nodes``: the queue is asked of the autoscaler as node bundles.

``--jobs`` one-row jobs that sleep ``--seconds`` are submitted at once. Printed for each: the time from the submit to
the last job done, the peak of nodes up (the class's GPUs in ``/v1/gpu/usage``, one per node), and the time from the
last job done to the class back at zero nodes. No target: the figures are for people (timings on a loaded 2-core
machine are mostly node start-up).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import print_machine, register, server, summary

BENCH = "autoscale"
NAP = "from __future__ import annotations\n\nimport time\n\n\ndef nap(seconds: str) -> str:\n    time.sleep(float(seconds))\n    return seconds\n"
CLASS = """
[[gpu_classes]]
name = "t4"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 1
"""


def _gpus(http) -> int:
    rows = http.get("/v1/gpu/usage").json()["classes"]
    return next(row["gpus_total"] for row in rows if row["name"] == "t4")


def _wait(what: str, condition, timeout: float, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"gave up waiting for {what} after {timeout:g} s")


def run(address: str, classes: str, jobs: int, seconds: float, timeout: float) -> dict:
    from conftest import registration_body

    env = {"RAY_AUTH_MODE": "disabled", "LANCEFN_RAY_PIP": "never", "LANCEFN_RAY_ACTOR_IDLE_S": "2"}
    with (
        server(gpu_classes=classes, args=["--executor", "ray", "--ray-address", address], env=env) as s,
        s.http() as http,
    ):
        _wait("the class at zero nodes", lambda: _gpus(http) == 0, timeout)
        body = registration_body(
            "nap",
            source=NAP,
            entrypoint="nap",
            inputs=(("seconds", "utf8", False),),
            output_type="utf8",
            gpu_class="t4",
        )
        version = register(http, body)["version"]
        started = time.monotonic()
        ids = []
        for _ in range(jobs):
            reply = http.post(
                "/v1/functions/run", json={"name": "nap", "version": version, "rows": [{"seconds": str(seconds)}]}
            )
            ids.append(reply.json()["job_id"])
        peak = 0

        def all_done() -> bool:
            nonlocal peak
            peak = max(peak, _gpus(http))
            states = [http.post("/v1/jobs/describe", json={"job_id": job}).json()["job_state"] for job in ids]
            return all(state in ("DONE", "FAILED", "CANCELLED") for state in states)

        _wait("every job finished", all_done, timeout)
        done_s = time.monotonic() - started
        states = [http.post("/v1/jobs/describe", json={"job_id": job}).json()["job_state"] for job in ids]
        last = time.monotonic()
        _wait("the class back at zero nodes", lambda: _gpus(http) == 0, timeout)
        return {"done_s": done_s, "peak": peak, "to_zero_s": time.monotonic() - last, "done": states.count("DONE")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--max-nodes", type=int, default=4)
    parser.add_argument("--idle-timeout", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on any one wait after this long")
    args = parser.parse_args()
    print_machine()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from helpers import fake_autoscaling_cluster

    results = {}
    with fake_autoscaling_cluster("t4", max_nodes=args.max_nodes, idle_timeout_s=args.idle_timeout) as address:
        for name, classes in (("before", CLASS), ("queue demand", CLASS + f"max_nodes = {args.max_nodes}\n")):
            results[name] = result = run(address, classes, args.jobs, args.seconds, args.timeout)
            print(
                f"{name:>13}: {result['done']}/{args.jobs} done in {result['done_s']:.1f} s, peak {result['peak']} "
                f"of {args.max_nodes} nodes, last job → 0 nodes in {result['to_zero_s']:.1f} s",
                flush=True,
            )
    for name, result in results.items():
        key = name.replace(" ", "_")
        summary(BENCH, f"{key}_all_done", round(result["done_s"], 1), "s")
        summary(BENCH, f"{key}_peak_nodes", result["peak"], "nodes")
        summary(BENCH, f"{key}_to_zero", round(result["to_zero_s"], 1), "s")


if __name__ == "__main__":
    main()
