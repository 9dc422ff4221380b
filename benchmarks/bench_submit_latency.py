"""Submit → result latency of a trivial 1-GPU function, three ways, in one run:

* **ours, local executor** — ``lancefn-server`` (default executor) through our Python client:
  ``functions.run`` then ``jobs.wait`` (long poll), on a warm local worker;
* **ours, Ray executor** — ``lancefn-server --executor ray --ray-address ADDR`` on the Ray
  cluster this script starts, same client calls;
* **Ray direct** — ``ray.get(f.options(num_gpus=1, …).remote(x))`` on the same cluster (a
  logical GPU, warm worker), the floor any Ray-based path pays.  For reference also Ray's
  default for GPU tasks, ``@ray.remote(num_gpus=1)`` (``max_calls=1``: a fresh worker per call),
  which is what our Ray executor does on *real* GPUs.

The GPU class is one simulated GPU (numba CUDA simulator), so this runs on any machine.
Modes are interleaved call by call so machine noise hits them alike.  Prints median / p95 and
the ratios (target: ours ≤ 2× Ray direct).  Never asserts on time.

    .venv/bin/python benchmarks/bench_submit_latency.py [--iterations 200] [--fresh-iterations 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

CLASSES = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated GPU (numba CUDA simulator)"
simulated = 1
"""
CLASS_RESOURCE = "lancefn_gpu_class:default"


def double_it(x: int) -> int:
    return 2 * x


class Server:
    """A real ``lancefn-server`` subprocess in a fresh home under ``work`` (``close`` stops it)."""

    def __init__(self, work: Path, name: str, args: Sequence[str] = ()) -> None:
        home = work / name
        home.mkdir()
        (home / "classes.toml").write_text(CLASSES)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANCEFN_")}
        env["LANCEFN_DISABLE_NVML"] = "1"
        self.log_path = work / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "lancefn_jupyter.server.cli", "--home", str(home), "--port", "0",
                 "--gpu-classes", str(home / "classes.toml"), *args],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"lancefn-server exited during startup:\n{self.log_path.read_text()}")
            try:
                info = json.loads((home / "server.json").read_text())
                if info.get("pid") == self.proc.pid:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise SystemExit(f"lancefn-server did not start in 120 s:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        self.url, self.api_key = info["url"], info["api_key"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def summary(metric: str, value: float, unit: str, target: str = "", met: bool | None = None, **extra) -> None:
    """The machine-readable line ``benchmarks/run_all.py`` collects."""
    record = {"bench": "bench_submit_latency.py", "metric": metric, "value": value, "unit": unit,
              "target": target, "met": met, **extra}
    print("SUMMARY " + json.dumps(record, sort_keys=True), flush=True)


def ours(client, version) -> Callable[[], None]:
    from lancefn_jupyter.models import JobState

    counter = iter(range(10**9))

    def call() -> None:
        x = next(counter)
        job = client.jobs.wait(client.functions.run(version.name, version.version, [{"x": x}]), timeout=120)
        if job.job_state != JobState.DONE or job.result != [2 * x]:
            raise SystemExit(f"unexpected job outcome: {job}")

    return call


def stats_of(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median": statistics.median(ordered) * 1000,
        "p95": ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))] * 1000,
        "mean": statistics.fmean(ordered) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="measured calls per mode (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured calls per mode first (default 10)")
    parser.add_argument(
        "--fresh-iterations", type=int, default=10,
        help="calls of Ray's default GPU task (a fresh worker each, ~1 s); 0 skips (default 10)",
    )
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray  # the optional extra: pip install 'lancefn-jupyter[ray]'

    from lancefn_jupyter.api import gpu_function
    from lancefn_jupyter.client import Client

    # Short: Ray's unix sockets live under it (107-character limit).
    work = Path(tempfile.mkdtemp(prefix="lfb", dir="/tmp" if os.path.isdir("/tmp") else None))
    servers: list[Server] = []
    try:
        load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0,)
        print(
            f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, ray {ray.__version__}, "
            f"load average {load[0]:.1f}",
            flush=True,
        )
        t0 = time.monotonic()
        os.environ["CUDA_VISIBLE_DEVICES"] = "sim0"  # the one logical GPU's id (as our executor does)
        ray.init(
            address="local", num_gpus=1, resources={CLASS_RESOURCE: 1}, _temp_dir=str(work / "ray"),
            include_dashboard=False, log_to_driver=False,
        )
        del os.environ["CUDA_VISIBLE_DEVICES"]
        address = ray.get_runtime_context().gcs_address
        print(f"ray.init: {time.monotonic() - t0:.1f} s ({address})", flush=True)

        servers.append(Server(work, "home-local"))
        servers.append(Server(work, "home-ray", ["--executor", "ray", "--ray-address", address]))

        request = gpu_function(num_gpus=1, gpu_class="default", name="double_it")(double_it).registration_request
        modes = {}
        for label, server in zip(("ours, local executor", "ours, Ray executor"), servers):
            client = Client(server.url, server.api_key)
            modes[label] = ours(client, client.functions.register(request))

        direct = ray.remote(double_it)  # reusable worker, like our simulated/CPU tasks
        options = {"num_gpus": 1, "num_cpus": 0, "resources": {CLASS_RESOURCE: 1}}

        def ray_direct() -> None:
            if ray.get(direct.options(**options).remote(21)) != 42:
                raise SystemExit("ray direct returned a wrong value")

        modes["Ray direct (ray.get(f.remote()))"] = ray_direct
        # What a simulated-class task of ours asks Ray for beyond that: its runtime_env.
        with_env = direct.options(**options, runtime_env={"env_vars": {"NUMBA_ENABLE_CUDASIM": "1"}})

        def ray_direct_env() -> None:
            if ray.get(with_env.remote(21)) != 42:
                raise SystemExit("ray direct returned a wrong value")

        modes["Ray direct + runtime_env env_vars"] = ray_direct_env

        samples: dict[str, list[float]] = {label: [] for label in modes}
        for _ in range(args.warmup):  # first calls start workers (and the Ray executor's driver)
            for call in modes.values():
                call()
        for _ in range(args.iterations):
            for label, call in modes.items():
                start = time.perf_counter()
                call()
                samples[label].append(time.perf_counter() - start)

        if args.fresh_iterations > 0:
            fresh = ray.remote(num_gpus=1)(double_it)  # Ray's GPU default: max_calls=1
            label = "Ray direct, @ray.remote(num_gpus=1) (fresh worker per call)"
            samples[label] = []
            for _ in range(args.fresh_iterations):
                start = time.perf_counter()
                ray.get(fresh.options(resources={CLASS_RESOURCE: 1}).remote(21))
                samples[label].append(time.perf_counter() - start)

        stats = {label: stats_of(values) for label, values in samples.items()}
        width = max(len(label) for label in stats)
        print(f"\nsubmit → result latency of a trivial 1-GPU function ({args.iterations} calls each, interleaved)")
        print(f"{'mode':<{width}}  {'n':>4}  {'median ms':>10}  {'p95 ms':>8}  {'mean ms':>8}")
        for label, row in stats.items():
            print(f"{label:<{width}}  {row['n']:>4}  {row['median']:>10.2f}  {row['p95']:>8.2f}  {row['mean']:>8.2f}")
            summary(label, round(row["median"], 3), "ms median", p95_ms=round(row["p95"], 3))

        floor = stats["Ray direct (ray.get(f.remote()))"]
        local = stats["ours, local executor"]
        via_ray = stats["ours, Ray executor"]
        print("\nratios (median / p95):")
        for label, row, base, target in (
            ("ours local / Ray direct", local, floor, "target ≤ 2"),
            ("ours Ray   / Ray direct", via_ray, floor, "target ≤ 2"),
            ("ours Ray   / ours local", via_ray, local, ""),
        ):
            ratio = row["median"] / base["median"]
            text = f"  {label}: {ratio:.2f}× / {row['p95'] / base['p95']:.2f}×"
            print(text + (f"   ({target})" if target else ""))
            summary(
                f"{' '.join(label.split())} (median ratio)", round(ratio, 2), "x",
                target="<= 2" if target else "", met=(ratio <= 2.0) if target else None,
            )
    finally:
        for server in servers:
            server.close()
        try:
            ray.shutdown()
        except Exception:
            pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
