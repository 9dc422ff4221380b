"""Submit → result latency of a trivial 1-GPU function, three ways, in one run:

* **ours, local executor** — ``lancefn-server`` (default executor) through the notebook API:
  ``f.submit(x).result()`` (``functions/run`` with its inline wait: one round trip for a quick
  job), on a warm local worker; also the older two-round-trip path (``functions.run`` then
  ``jobs.wait``) for reference;
* **ours, Ray executor** — ``lancefn-server --executor ray --ray-address ADDR`` on the Ray
  cluster this script starts, same API call; and the same for a *real-GPU* class (its own
  logical GPU), whose jobs run on a warm GPU actor of the function version (target ≤ 2× Ray
  direct on a warm worker);
* **Ray direct** — ``ray.get(f.options(num_gpus=1, …).remote(x))`` on the same cluster (a
  logical GPU, warm worker), the floor any Ray-based path pays.  For reference also Ray's
  default for GPU tasks, ``@ray.remote(num_gpus=1)`` (``max_calls=1``: a fresh worker per call).

Each side runs in its own process: this script is the Ray driver and times Ray direct; our
client runs in child processes that never import Ray (a Ray driver's threads would slow our
client down), each timing its own calls when told to over a pipe, and connected as a notebook on the
embedded server is (requests on the server's Unix socket).  Modes are interleaved call
by call so machine noise hits them alike.  The GPU class is one simulated GPU (numba CUDA
simulator), so this runs on any machine.  Prints median / p95 and the ratios (targets: ours
local ≤ 1.0× Ray direct median and ≤ 1.5× at p95; ours Ray ≤ 1.5×).  Never asserts on time.

    .venv/bin/python benchmarks/bench_submit_latency.py [--iterations 200] [--fresh-iterations 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import Server, summary

BENCH = "bench_submit_latency.py"
CLASSES = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated GPU (numba CUDA simulator)"
simulated = 1
"""
CLASS_RESOURCE = "lancefn_gpu_class:default"
# A second logical GPU, of a class the Ray executor treats as real: its jobs run on warm GPU actors.
REAL_CLASSES = """
[[gpu_classes]]
name = "real"
gpu_model = "NVIDIA T4 (a logical Ray GPU here)"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 1
"""
REAL_RESOURCE = "lancefn_gpu_class:real"


def double_it(x: int) -> int:
    return 2 * x


class Doubler:
    """Ray direct on an actor: the floor of our Ray executor's path (every job is an actor call)."""

    def run(self, x: int) -> int:
        return 2 * x


def client_main(url: str, api_key: str, path: str, unix_socket: str | None) -> None:
    """A child process (no Ray): time one call of ``path`` per ``go`` line on stdin, answer the seconds. Connected as
    a notebook on the embedded server is: requests on the server's Unix socket, when it has one."""
    from lancefn_jupyter.kernel import api

    api.connect(url, api_key, unix_socket=unix_socket)
    gpu_class = "real" if path == "api-real" else "default"
    fn = api.gpu_function(num_gpus=1, gpu_class=gpu_class, name="double_it")(double_it)
    version = fn.version
    client = api.current_client()
    counter = iter(range(10**9))
    for line in sys.stdin:
        if line.strip() != "go":
            break
        x = next(counter)
        start = time.perf_counter()
        if path.startswith("api"):
            value = fn.submit(x).result(timeout=120)
        else:  # the two round trips every call took before functions/run's inline wait
            value = client.jobs.wait(
                client.functions.run(version.name, version.version, [{"x": x}]), timeout=120
            ).result
        elapsed = time.perf_counter() - start
        if value not in (2 * x, [2 * x]):
            raise SystemExit(f"unexpected result {value!r} for x={x}")
        print(elapsed, flush=True)


class ClientProcess:
    """Our client in its own process (see ``client_main``); ``call()`` returns the seconds it timed."""

    def __init__(self, server: Server, path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--client", server.url, server.api_key, path, server.unix_socket or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"client process exited ({self.proc.wait()})")
        return float(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def timed(call: Callable[[], None]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    return run


def stats_of(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "median": statistics.median(ordered) * 1000,
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] * 1000,
        "mean": statistics.fmean(ordered) * 1000,
    }


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--client":
        client_main(*sys.argv[2:5], sys.argv[5] or None)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200, help="measured calls per mode (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured calls per mode first (default 10)")
    parser.add_argument(
        "--fresh-iterations",
        type=int,
        default=10,
        help="calls of Ray's default GPU task (a fresh worker each, ~1 s); 0 skips (default 10)",
    )
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway local cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray  # the optional extra: pip install 'lancefn-jupyter[ray]'

    # Short: Ray's unix sockets live under it (107-character limit).
    work = Path(tempfile.mkdtemp(prefix="lfb", dir="/tmp" if os.path.isdir("/tmp") else None))
    servers: list[Server] = []
    clients: list[ClientProcess] = []
    try:
        load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0,)
        print(
            f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, ray {ray.__version__}, "
            f"load average {load[0]:.1f}",
            flush=True,
        )
        t0 = time.monotonic()
        os.environ["CUDA_VISIBLE_DEVICES"] = "sim0,sim1,0"  # the logical GPUs' ids (as our executor does)
        # Two GPUs of the simulated class: our Ray executor's warm actor keeps one while idle (for its
        # version's next job), Ray direct uses the other; the third is the real-GPU class's.
        ray.init(
            address="local",
            num_gpus=3,
            resources={CLASS_RESOURCE: 2, REAL_RESOURCE: 1},
            _temp_dir=str(work / "ray"),
            include_dashboard=False,
            log_to_driver=False,
        )
        del os.environ["CUDA_VISIBLE_DEVICES"]
        address = ray.get_runtime_context().gcs_address
        print(f"ray.init: {time.monotonic() - t0:.1f} s ({address})", flush=True)

        on_ray = ["--executor", "ray", "--ray-address", address]
        servers.append(Server(gpu_classes=CLASSES))
        servers.append(Server(gpu_classes=CLASSES, args=on_ray))
        servers.append(Server(gpu_classes=REAL_CLASSES, args=on_ray))

        modes: dict[str, Callable[[], float]] = {}
        for label, server, path in (
            ("ours, local executor", servers[0], "api"),
            ("ours, Ray executor", servers[1], "api"),
            ("ours, local executor, run + jobs/wait (two round trips)", servers[0], "two-trips"),
            ("ours, Ray executor, real-GPU class (warm GPU actor)", servers[2], "api-real"),
        ):
            clients.append(ClientProcess(server, path))
            modes[label] = clients[-1].call

        direct = ray.remote(double_it)  # reusable worker, like our simulated/CPU tasks
        options = {"num_gpus": 1, "num_cpus": 0, "resources": {CLASS_RESOURCE: 1}}

        def ray_direct() -> None:
            if ray.get(direct.options(**options).remote(21)) != 42:
                raise SystemExit("ray direct returned a wrong value")

        modes["Ray direct (ray.get(f.remote()))"] = timed(ray_direct)
        # What a simulated-class task of ours asks Ray for beyond that: its runtime_env.
        with_env = direct.options(**options, runtime_env={"env_vars": {"NUMBA_ENABLE_CUDASIM": "1"}})

        def ray_direct_env() -> None:
            if ray.get(with_env.remote(21)) != 42:
                raise SystemExit("ray direct returned a wrong value")

        modes["Ray direct + runtime_env env_vars"] = timed(ray_direct_env)
        actor = ray.remote(Doubler).options(num_cpus=0).remote()  # no GPU: ours and Ray direct use them

        def ray_direct_actor() -> None:
            if ray.get(actor.run.remote(21)) != 42:
                raise SystemExit("ray direct returned a wrong value")

        modes["Ray direct, warm actor call (reference)"] = timed(ray_direct_actor)

        samples: dict[str, list[float]] = {label: [] for label in modes}
        for _ in range(args.warmup):  # first calls start workers (and the Ray executor's driver)
            for call in modes.values():
                call()
        for _ in range(args.iterations):
            for label, call in modes.items():
                samples[label].append(call())

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
            summary(BENCH, label, round(row["median"], 3), "ms median", p95_ms=round(row["p95"], 3))

        floor = stats["Ray direct (ray.get(f.remote()))"]
        local = stats["ours, local executor"]
        via_ray = stats["ours, Ray executor"]
        real = stats["ours, Ray executor, real-GPU class (warm GPU actor)"]
        print("\nratios (median / p95):")
        for label, row, base, target in (
            ("ours local / Ray direct", local, floor, 1.0),
            ("ours Ray   / Ray direct", via_ray, floor, 1.5),
            ("ours Ray real-GPU (warm actor) / Ray direct", real, floor, 2.0),
            ("ours Ray   / ours local", via_ray, local, None),
        ):
            ratio, ratio_p95 = row["median"] / base["median"], row["p95"] / base["p95"]
            text = f"  {label}: {ratio:.2f}× / {ratio_p95:.2f}×"
            print(text + (f"   (target ≤ {target} median)" if target else ""))
            name = " ".join(label.split())
            summary(
                BENCH,
                f"{name} (median ratio)",
                round(ratio, 2),
                "x",
                target=f"<= {target}" if target else "",
                met=(ratio <= target) if target else None,
            )
            if target == 1.0:
                summary(BENCH, f"{name} (p95 ratio)", round(ratio_p95, 2), "x", target="<= 1.5", met=ratio_p95 <= 1.5)
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.close()
        try:
            ray.shutdown()
        except Exception:
            pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
