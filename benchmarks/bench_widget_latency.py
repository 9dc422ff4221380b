"""How fast a control-plane state change reaches a widget model (and, for comparison, the raw SSE client).

    .venv/bin/python benchmarks/bench_widget_latency.py [--n 200]

Starts a real `lancefn-server` (simulated `default` class, 2 GPUs) on 127.0.0.1, occupies both GPUs
with jobs that never finish, then repeats N times:

1. submit a job over REST (it stays pending: no capacity) — measured until the jobs dashboard
   (`JobsDashboard`, fed by the kernel's one event listener) shows its row;
2. build a `JobWidget` for it, then cancel it over REST — measured until the widget's badge trait
   says "cancelled";
3. the same cancel as seen by a bare SSE reader (`Client.events()` on its own thread) — the floor
   the widget path adds to.

Times are taken with `time.perf_counter()` in this one process: t0 just before the REST request is
sent (the server changes the state while handling it), the widget time inside the trait observer
(which runs in the listener thread at the moment the model changes; a frontend would get the comm
message from that same call). No frontend is attached (ipywidgets' DummyComm), so this is the
kernel-side latency. Prints median / p95 / max; never asserts anything about time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx


def wait_for_file(path: str) -> str:
    import os
    import time

    while not os.path.exists(path):
        time.sleep(0.05)
    return path


def start_server(home: Path) -> tuple[subprocess.Popen, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANCEFN_")}
    env["LANCEFN_DISABLE_NVML"] = "1"
    log = open(home.parent / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "lancefn_jupyter.server.cli", "--home", str(home), "--port", "0"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"lancefn-server exited: {(home.parent / 'server.log').read_text()}")
        try:
            info = json.loads((home / "server.json").read_text())
            if info.get("pid") == proc.pid and httpx.get(info["url"] + "/v1/health", timeout=2).status_code == 200:
                return proc, info["url"], info["api_key"]
        except (OSError, ValueError, httpx.HTTPError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("lancefn-server did not start in 30 s")


def summary(name: str, values_s: list[float]) -> str:
    ms = sorted(v * 1000 for v in values_s)
    if not ms:
        return f"{name:<48} (no samples)"
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return (
        f"{name:<48} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms   max {ms[-1]:7.2f} ms"
    )


class SseProbe:
    """A bare SSE reader: when did each (job_id, state) arrive?"""

    def __init__(self, url: str, api_key: str):
        from lancefn_jupyter.kernel.client import Client

        self.client = Client(url, api_key)
        self.seen: dict[tuple[str, str], float] = {}
        self.cond = threading.Condition()
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="bench-sse")
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.client.events(read_timeout=None):
                now = time.perf_counter()
                self.connected.set()
                if event.event == "job":
                    with self.cond:
                        self.seen.setdefault((event.data["job_id"], event.data["job_state"]), now)
                        self.cond.notify_all()
        except Exception:
            pass

    def wait(self, job_id: str, state: str, timeout: float = 10.0) -> float:
        with self.cond:
            self.cond.wait_for(lambda: (job_id, state) in self.seen, timeout)
            return self.seen.get((job_id, state), float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="state changes to measure per path (default 200)")
    args = parser.parse_args()

    from lancefn_jupyter.kernel import api
    from lancefn_jupyter.kernel.widgets import JobsDashboard, JobWidget, get_listener, stop_listener

    tmp = Path(tempfile.mkdtemp(prefix="lancefn-bench-"))
    proc, url, key = start_server(tmp / "home")
    try:
        client = api.connect(url, key)
        fn = api.gpu_function(num_gpus=1)(wait_for_file)
        version = fn.version
        never = str(tmp / "never")
        blockers = [client.functions.run(version.name, version.version, [{"path": never}]) for _ in range(2)]
        probe = SseProbe(url, key)
        dashboard = JobsDashboard(limit=25)
        listener = get_listener()
        if not (listener.wait_connected(10) and probe.connected.wait(10)):
            raise SystemExit("the event stream did not connect within 10 s")

        row_times: dict[str, float] = {}
        row_lock = threading.Lock()

        def on_children(change) -> None:
            now = time.perf_counter()
            with row_lock:
                for job_id in dashboard._shown:
                    row_times.setdefault(job_id, now)

        dashboard.grid.observe(on_children, names="children")

        submit_to_row, submit_to_sse, submit_rtt = [], [], []
        cancel_to_widget, cancel_to_sse, cancel_rtt, widget_after_sse = [], [], [], []
        for _ in range(args.n):
            t0 = time.perf_counter()
            job_id = client.functions.run(version.name, version.version, [{"path": never}])
            t1 = time.perf_counter()
            deadline = time.monotonic() + 10
            while job_id not in row_times and time.monotonic() < deadline:
                time.sleep(0.0005)
            submit_to_row.append(row_times.get(job_id, float("nan")) - t0)
            submit_to_sse.append(probe.wait(job_id, "PENDING") - t0)
            submit_rtt.append(t1 - t0)

            widget = JobWidget(job_id)
            done = threading.Event()
            stamp: list[float] = []

            def on_badge(change, stamp=stamp, done=done) -> None:
                if "lancefn-state-cancelled" in change["new"]:
                    stamp.append(time.perf_counter())
                    done.set()

            widget.badge.observe(on_badge, names="value")
            t2 = time.perf_counter()
            client.jobs.cancel(job_id)
            t3 = time.perf_counter()
            done.wait(10)  # only the event stream changes the widget: we cancelled over plain REST
            t_sse = probe.wait(job_id, "CANCELLED")
            if stamp:
                cancel_to_widget.append(stamp[0] - t2)
                widget_after_sse.append(stamp[0] - t_sse)
            cancel_to_sse.append(t_sse - t2)
            cancel_rtt.append(t3 - t2)
            widget.close()

        print(f"lancefn widget latency: {args.n} changes per path, server {url} (local executor, simulated class)")
        print(summary("submit (REST) -> dashboard row (widget model)", submit_to_row))
        print(summary("submit (REST) -> bare SSE client", submit_to_sse))
        print(summary("submit REST round trip", submit_rtt))
        print(summary("cancel (REST) -> JobWidget badge (widget model)", cancel_to_widget))
        print(summary("cancel (REST) -> bare SSE client", cancel_to_sse))
        print(summary("cancel REST round trip", cancel_rtt))
        print(summary("widget update minus SSE-probe arrival (same change)", widget_after_sse))
        ratio = statistics.median(cancel_to_widget) / statistics.median(cancel_to_sse)
        print(
            f"widget/SSE median ratio (cancel): {ratio:.2f}x   listener: connects={listener.connects} events={listener.events} failures={listener.failures}"
        )
        for job_id in blockers:
            client.jobs.cancel(job_id)
        dashboard.close()
    finally:
        stop_listener()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
