"""The Arrow data plane next to Ray, in one run, each side in its own process:

* **1M float64 out** — submit → result of a function returning an 8 MB ndarray:
  ``f.remote(n)`` on our control plane vs ``ray.get(f.remote(n))`` (target: ours ≤ 2× Ray);
* **1M floats as list[float]** — the same values declared ``list[float]`` (for reference: before
  the data plane this took seconds as JSON);
* **100 MB float32 in** — a 25M-element array passed as the argument, a float back (target ≤ 2× Ray);
* **map 10,000 × 768 float32** — one job, one float32 vector out per row: rows/s and MB/s next to
  Ray tasks over the same chunks (target: ≥ 0.5× Ray's throughput);
* **control plane peak RSS** while 1 GB of results flows through it (10 jobs × 100 MB, each
  fetched by the client; target ≤ 300 MB).

Both sides run CPU functions (no GPU needed; on a GPU machine the numbers are the same kind).
Never asserts on time: missed targets are reported.

    .venv/bin/python benchmarks/bench_dataplane.py [--quick]
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

import numpy as np
from numpy.typing import NDArray

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import RssSampler, print_machine, summary  # noqa: E402

BENCH = "bench_dataplane.py"
N_OUT = 1_000_000
N_IN = 25_000_000  # 100 MB of float32
DIM = 768


# ------------------------------------------------------------------ the functions (both sides)


def make_vector(n: int) -> NDArray[np.float64]:
    return np.linspace(0.0, 1.0, n)


def make_list(n: int) -> list[float]:
    return np.linspace(0.0, 1.0, n).tolist()


def total(x: NDArray[np.float32]) -> float:
    return float(x[0] + x[-1])


def embed(v: NDArray[np.float32]) -> NDArray[np.float32]:
    return v * np.float32(0.5)


def big_block(n: int) -> NDArray[np.float32]:
    return np.ones(n, dtype=np.float32)


def _time(call, iterations: int) -> list[float]:
    call()  # warm: worker started, imports done
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


# ------------------------------------------------------------------ ours


def side_ours(args: argparse.Namespace) -> dict:
    """The embedded control plane (what a notebook uses: rows and results handed over as files in
    its home), plus the same server over plain HTTP (what a client on another machine gets)."""
    from lancefn_jupyter.kernel import api

    home = tempfile.mkdtemp(prefix="lancefn-bench-dp-")
    os.environ["LANCEFN_DISABLE_NVML"] = "1"
    api.use_local(home=home)
    info = api.connection_info()
    try:
        fns = {f.__name__: api.gpu_function(f) for f in (make_vector, make_list, total, embed, big_block)}
        out: dict = {}
        x = np.ones(args.n_in, dtype=np.float32)
        rows = list(np.random.default_rng(0).standard_normal((args.rows, DIM)).astype(np.float32))
        out["vector_s"] = _time(lambda: fns["make_vector"].remote(N_OUT), args.iterations)
        out["list_s"] = _time(lambda: fns["make_list"].remote(N_OUT), max(1, args.iterations // 2))
        out["input_s"] = _time(lambda: fns["total"].remote(x), max(1, args.iterations // 2))
        out["map_s"] = _time(lambda: fns["embed"].map(rows).result(), max(1, args.iterations // 4))
        # Peak RSS of the control plane while results flow: sampled every 5 ms.
        rss = RssSampler(info.pid, 0.005)
        for _ in range(args.gb_jobs):
            if fns["big_block"].remote(N_IN).size != N_IN:
                raise SystemExit("wrong result size")
        out["rss_idle_mb"], out["rss_peak_mb"] = rss.samples[0], rss.stop()
        # The same server as a remote client sees it: Arrow IPC bodies and GET /v1/jobs/result.
        key = json.loads(Path(home, "server.json").read_text())["api_key"]
        api.connect(info.url, key)
        out["http_vector_s"] = _time(lambda: fns["make_vector"].remote(N_OUT), args.iterations)
        out["http_input_s"] = _time(lambda: fns["total"].remote(x), max(1, args.iterations // 2))
        return out
    finally:
        api.stop_local(home=home)


# ------------------------------------------------------------------ Ray


def side_ray(args: argparse.Namespace) -> dict:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    work = tempfile.mkdtemp(prefix="lfd", dir="/tmp" if os.path.isdir("/tmp") else None)
    ray.init(
        address="local",
        _temp_dir=os.path.join(work, "ray"),
        include_dashboard=False,
        log_to_driver=False,
        num_cpus=max(2, os.cpu_count() or 2),
    )
    try:
        remote = {f.__name__: ray.remote(f) for f in (make_vector, make_list, total)}
        out: dict = {}
        out["vector_s"] = _time(lambda: ray.get(remote["make_vector"].remote(N_OUT)), args.iterations)
        out["list_s"] = _time(lambda: ray.get(remote["make_list"].remote(N_OUT)), max(1, args.iterations // 2))
        x = np.ones(args.n_in, dtype=np.float32)
        out["input_s"] = _time(lambda: ray.get(remote["total"].remote(x)), max(1, args.iterations // 2))
        rows = np.random.default_rng(0).standard_normal((args.rows, DIM)).astype(np.float32)
        chunks = np.array_split(rows, args.chunks)

        @ray.remote
        def embed_chunk(block: np.ndarray) -> list:
            return [embed(v) for v in block]  # the same per-row function, as our worker calls it

        out["map_s"] = _time(lambda: ray.get([embed_chunk.remote(c) for c in chunks]), max(1, args.iterations // 4))
        return out
    finally:
        ray.shutdown()


# ------------------------------------------------------------------ report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and smaller sizes (a short run)")
    parser.add_argument("--side", choices=["ours", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args()
    args.iterations = args.iterations or (4 if args.quick else 20)
    args.rows = 2_000 if args.quick else 10_000
    args.n_in = N_IN
    args.chunks = 8
    args.gb_jobs = 2 if args.quick else 10
    if args.side:
        result = side_ours(args) if args.side == "ours" else side_ray(args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    print_machine()
    results = {}
    for side in ("ours", "ray"):  # each side in its own fresh process
        cmd = [sys.executable, __file__, "--side", side, "--iterations", str(args.iterations)] + (
            ["--quick"] if args.quick else []
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(f"{side} side failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            if side == "ray" and "No module named 'ray'" in proc.stderr:
                continue
            raise SystemExit(1)
        results[side] = json.loads(lines[-1][7:])
    ours, ray = results["ours"], results.get("ray")

    def med(samples: list[float]) -> float:
        return statistics.median(samples)

    print(f"\n{'':52}{'ours':>14}{'Ray':>14}{'ratio':>10}")
    for key, label, target in [
        ("vector_s", "submit→result, 1M float64 ndarray out", 2.0),
        ("list_s", "submit→result, 1M floats as list[float]", None),
        ("input_s", f"submit→result, {args.n_in * 4 / 1e6:.0f} MB float32 in", 2.0),
        ("http_vector_s", "same, 1M float64 out, remote client (HTTP)", None),
        ("http_input_s", f"same, {args.n_in * 4 / 1e6:.0f} MB in, remote client (HTTP)", None),
    ]:
        o = med(ours[key])
        r = med(ray[key.removeprefix("http_")]) if ray else float("nan")
        ratio = o / r if ray else float("nan")
        print(f"{label:<52}{o * 1000:>11.1f} ms{r * 1000:>11.1f} ms{ratio:>9.2f}×")
        summary(
            BENCH, f"{label} (ours)", round(o * 1000, 2), "ms median", **({"ray_ms": round(r * 1000, 2)} if ray else {})
        )
        if target is not None and ray:
            summary(BENCH, f"{label}: ours / Ray", round(ratio, 2), "×", target=f"<= {target:g}×", met=ratio <= target)
    mb = args.rows * DIM * 4 * 2 / 1e6  # in + out
    o_rate = args.rows / med(ours["map_s"])
    print(f"{'map ' + str(args.rows) + ' × 768 float32 (rows/s)':<52}{o_rate:>14,.0f}", end="")
    if ray:
        r_rate = args.rows / med(ray["map_s"])
        print(f"{r_rate:>14,.0f}{o_rate / r_rate:>9.2f}×")
        summary(
            BENCH,
            "map 768-float32 rows: ours / Ray throughput",
            round(o_rate / r_rate, 2),
            "×",
            target=">= 0.5×",
            met=o_rate / r_rate >= 0.5,
            ours_rows_s=round(o_rate),
            ray_rows_s=round(r_rate),
        )
    else:
        print()
    print(
        f"{'map throughput (MB/s, in + out)':<52}{mb / med(ours['map_s']):>14,.0f}"
        + (f"{mb / med(ray['map_s']):>14,.0f}" if ray else "")
    )
    summary(BENCH, "map 768-float32 rows (ours)", round(o_rate), "rows/s", mb_s=round(mb / med(ours["map_s"]), 1))
    gb = args.gb_jobs * N_IN * 4 / 1e9
    print(
        f"control plane RSS: {ours['rss_idle_mb']:.0f} MB idle, peak {ours['rss_peak_mb']:.0f} MB "
        f"while {gb:.1f} GB of results flowed through it"
    )
    summary(
        BENCH,
        f"control plane peak RSS ({gb:.1f} GB of results)",
        round(ours["rss_peak_mb"], 1),
        "MB",
        target="<= 300 MB",
        met=ours["rss_peak_mb"] <= 300,
    )


if __name__ == "__main__":
    main()
