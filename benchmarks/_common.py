"""Shared helpers for the benchmarks: statistics, a real control plane, machine facts, summaries.

Every benchmark prints its figures (median, p95, ratios) for people, and one machine-readable
line per metric for ``run_all.py``::

    SUMMARY {"bench": "...", "metric": "...", "value": 1.23, "unit": "ms", "target": "<= 10 ms", "met": true}

Benchmarks never assert on time: a missed target is reported, not raised.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # conftest's request builder (see registration)
SERVER_CMD = [sys.executable, "-m", "lancefn_jupyter.server.cli"]
_SCRUBBED = ("LANCEFN_HOME", "LANCEFN_API_KEY", "LANCEFN_GPU_CLASSES", "LANCEFN_URL")
# Workers run as this user, as in the tests and as for a notebook's own server: a root server's default
# `nobody` may not reach this interpreter (a Python under root's 0700 home), and the server refuses to start.
# Set LANCEFN_WORKER_USER to measure a switched worker user (results then travel as frames on the pipes).
os.environ.setdefault("LANCEFN_WORKER_USER", str(os.geteuid()))


# ----------------------------------------------------------------------------- statistics


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def describe(samples: Sequence[float]) -> dict:
    return {
        "n": len(samples),
        "median": statistics.median(samples),
        "p95": percentile(samples, 95),
        "min": min(samples),
        "max": max(samples),
    }


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def line_ms(label: str, samples: Sequence[float]) -> str:
    d = describe(samples)
    return f"{label:<52} median {fmt_ms(d['median']):>11}  p95 {fmt_ms(d['p95']):>11}  (n={d['n']}, min {fmt_ms(d['min'])})"


def summary(
    bench: str, metric: str, value: float, unit: str, target: str = "", met: bool | None = None, **extra
) -> None:
    """One machine-readable line for run_all.py (and a human-readable echo)."""
    record = {"bench": bench, "metric": metric, "value": value, "unit": unit, "target": target, "met": met, **extra}
    print("SUMMARY " + json.dumps(record, sort_keys=True), flush=True)


def summary_median_ms(bench: str, metric: str, samples: Sequence[float], target_ms: float, digits: int = 2) -> None:
    """:func:`summary` of the median of ``samples`` (seconds) in ms against ``<= target_ms``, with its p95."""
    d = describe(samples)
    median_ms, p95_ms = round(d["median"] * 1000, digits), round(d["p95"] * 1000, digits)
    summary(bench, metric, median_ms, "ms", f"<= {target_ms:g} ms", d["median"] * 1000 <= target_ms, p95_ms=p95_ms)


# --------------------------------------------------------------------------- the machine


def machine() -> dict:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": [round(x, 2) for x in load],
    }


def print_machine() -> None:
    m = machine()
    print(
        f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, "
        f"{m['platform']}, {m['date']}, load average {m['loadavg']}, "
        f"workers as user {os.environ['LANCEFN_WORKER_USER']} (LANCEFN_WORKER_USER)",
        flush=True,
    )


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` (VmRSS from /proc), in MiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler:
    """Samples the RSS of ``pid`` every ``interval`` seconds in a thread, from creation until :meth:`stop`."""

    def __init__(self, pid: int, interval: float) -> None:
        self.samples = [rss_mb(pid)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pid, interval), daemon=True)
        self._thread.start()

    def _run(self, pid: int, interval: float) -> None:
        while not self._stop.wait(interval):
            self.samples.append(rss_mb(pid))

    def stop(self) -> float:
        """Stops sampling; returns the peak seen, in MiB."""
        self._stop.set()
        self._thread.join()
        return max(self.samples)


def settle(pid: int, quiet_cpu_s: float = 0.05, interval: float = 0.5, timeout: float = 60.0) -> None:
    """Wait until ``pid`` and its children use under ``quiet_cpu_s`` of CPU per ``interval`` (e.g. the spare
    workers a warm-up started have done their imports), so a timed run does not pay for the warm-up."""
    import psutil

    def cpu() -> float:
        total = 0.0
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                try:
                    total += sum(proc.cpu_times()[:2])
                except psutil.Error:
                    continue
        except psutil.Error:
            pass
        return total

    deadline, before = time.monotonic() + timeout, cpu()
    while time.monotonic() < deadline:
        time.sleep(interval)
        now = cpu()
        if now - before < quiet_cpu_s:
            return
        before = now


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
    env["LANCEFN_DISABLE_NVML"] = "1"  # simulated classes on every machine, like the tests
    env.update(extra or {})
    return env


# ------------------------------------------------------------------------ a control plane


class Server:
    """A real ``lancefn-server`` subprocess in a fresh home (stopped on ``close``)."""

    def __init__(
        self,
        *,
        gpu_classes: str | None = None,
        args: Sequence[str] = (),
        home: Path | None = None,
        env: dict | None = None,
        cwd: Path | None = None,
    ):
        """``env``: variables over this process's (``clean_env``); ``cwd``: the server's working directory (a
        directory holding another ``lancefn_jupyter`` runs that one: ``python -m`` puts it first)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="lancefn-bench-")
        base = Path(self._tmp.name)
        self.home = home or base / "home"
        argv = [*SERVER_CMD, "--home", str(self.home), "--port", "0", *args]
        if gpu_classes is not None:
            path = base / "gpu_classes.toml"
            path.write_text(gpu_classes)
            argv += ["--gpu-classes", str(path)]
        self.log_path = base / "server.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            argv, env=clean_env(env), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
        )
        deadline = time.monotonic() + 120  # a Ray-executor server joins its cluster first
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lancefn-server exited {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                info = json.loads((self.home / "server.json").read_text())
                if (
                    info.get("pid") == self.proc.pid
                    and httpx.get(info["url"] + "/v1/health", timeout=2).status_code == 200
                ):
                    break
            except (OSError, ValueError, httpx.HTTPError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"lancefn-server did not start within 120 s:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        self.url, self.api_key, self.pid = info["url"], info["api_key"], self.proc.pid
        self.unix_socket: str | None = info.get("unix_socket")

    def connect(self, *, unix_socket: bool = True):
        """The notebook API's client of this server, connected as a notebook on the embedded server is: its requests
        on the server's Unix socket (``unix_socket=False``: on the TCP port, as a client given the URL alone)."""
        from lancefn_jupyter.kernel import api

        return api.connect(self.url, self.api_key, unix_socket=self.unix_socket if unix_socket else None)

    def http(self, **kwargs) -> httpx.Client:
        kwargs.setdefault("timeout", 60.0)
        headers = {"x-api-key": self.api_key, **kwargs.pop("headers", {})}  # another key may be given
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self._tmp.cleanup()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def server(**kwargs) -> Iterator[Server]:
    s = Server(**kwargs)
    try:
        yield s
    finally:
        s.close()


TRIVIAL_SOURCE = "from __future__ import annotations\n\n\ndef inc(x: int) -> int:\n    return x + 1\n"


def trivial_registration(name: str = "inc", num_gpus: int | None = 1) -> dict:
    """A registration request for ``inc(x) = x + 1`` built by hand (no packaging import)."""
    return registration(name, TRIVIAL_SOURCE, "inc", num_gpus=num_gpus)


def registration(
    name: str,
    source: str,
    entrypoint: str,
    arrow_type: str = "int64",
    num_gpus: int | None = 1,
    arg: tuple[str, str | None] = ("x", None),
) -> dict:
    """A registration request for ``entrypoint(x: arrow_type) -> arrow_type`` in ``source``, built by hand
    as the tests build it; ``arg`` renames the parameter and, if given, sets its own type."""
    from conftest import registration_body  # tests/: plain JSON, no packaging import

    inputs = ((arg[0], arg[1] or arrow_type, False),)
    return registration_body(
        name, source=source, entrypoint=entrypoint, inputs=inputs, output_type=arrow_type, num_gpus=num_gpus
    )


def two_teams(a_key: str, b_key: str) -> str:
    """An ``--api-keys`` file of two teams: ``a_key`` in namespace ``team-a``, ``b_key`` in ``team-b``, each with the
    ``functions`` and ``jobs`` privileges."""
    privileges = 'privileges = ["functions", "jobs"]'
    teams = (("a", a_key), ("b", b_key))
    return "".join(
        f'[[api_keys]]\nname = "{n}"\nkey = "{k}"\nnamespace = "team-{n}"\n{privileges}\n\n' for n, k in teams
    )


def register(http: httpx.Client, body: dict) -> dict:
    reply = http.post("/v1/functions/create", json=body)
    reply.raise_for_status()
    job = http.post("/v1/jobs/wait", json={"job_id": reply.json()["job_id"], "timeout_s": 30}).json()
    assert job["job_state"] == "DONE", job
    return job["result"]
