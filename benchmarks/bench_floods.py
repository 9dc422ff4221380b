"""Does one client, or one key, flooding the server slow another team down?

One server with two teams (keys of namespaces ``team-a`` and ``team-b``) and the default caps.  Team B's client
measures, one after another, ``GET /v1/health`` and a trivial 1-GPU function's submit → result
(``functions/run`` with its inline wait, the notebook's ``f.submit(x).result()``): first with the server idle
(the baseline, in the same run), then during each flood, which runs in a process of its own (``start_flood``):

* **idle keep-alives** — a client with no key opens connections as fast as it can, each sending ``GET /v1/health``
  and kept open, the newest 300 held (the server keeps 32 of a peer's idle ones: ``--max-idle-per-peer``);
* **slow bodies** — 300 connections at a time with A's key, each sending a request head and the first byte of its
  body, never the rest (the 33rd and later get 429, ``--max-bodies-per-key``, and are sent again);
* **event streams** — 300 ``GET /v1/jobs/events`` at a time with A's key (past ``--max-streams-per-key``: 429,
  sent again), the open ones read;
* **small submits** — A's 16 threads (``--submitters``) submitting trivial jobs and waiting for their results, back
  to back, on the same GPU class as B's (``--gpus`` simulated GPUs, 4 by default: A keeps them all busy);
* **2 MiB artifacts** — a burst of 44 registrations at once from A, each a 2 MiB list literal (seconds of
  parsing in a checker child), measured until the burst has cleared or ``--artifact-window-s`` passed.

Prints p50 / p99 / max of both for each (target: p99 ≤ 50 ms during each flood) and one SUMMARY line per flood
and measure.  Never asserts on time.

    .venv/bin/python benchmarks/bench_floods.py [--samples 300] [--gpus 4] [--submitters 16] [--artifacts 44]
                                                [--artifact-window-s 60] [--only NAME]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from _common import percentile, print_machine, register, server, summary, trivial_registration

BENCH = "bench_floods.py"
ALICE, BOB = "alice-key-bench-floods-1", "bob-key-bench-floods-02"
KEYS = "".join(
    f'[[api_keys]]\nname = "{name}"\nkey = "{key}"\nnamespace = "{namespace}"\n'
    'privileges = ["functions", "jobs", "system_usage"]\n\n'
    for name, key, namespace in (("alice", ALICE, "team-a"), ("bob", BOB, "team-b"))
)
HELD = 300  # connections a flood keeps open
ARTIFACT_BYTES = 2 * 1024 * 1024
OTHER_UID = 65534  # the floods' user when this runs as root


# ------------------------------------------------------------------------------------------- the floods


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def _head(method: str, path: str, key: str | None = None, body_bytes: int | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x"]
    if key:
        lines.append(f"x-api-key: {key}")
    if body_bytes is not None:
        lines += ["content-type: application/json", f"content-length: {body_bytes}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def idle_keepalives(url: str, stop, counts) -> None:
    """Open connections back to back, each answered one health check and kept; the newest ``HELD`` held."""
    held: deque[socket.socket] = deque()
    request = _head("GET", "/v1/health")
    while not stop.is_set():
        try:
            sock = _connect(url)
            sock.sendall(request)
            sock.recv(65536)
        except OSError:
            counts["errors"] += 1
            continue
        counts["opened"] += 1
        held.append(sock)
        if len(held) > HELD:
            held.popleft().close()
    for sock in held:
        sock.close()


def _churn(url: str, request: bytes, stop, counts) -> None:
    """Keep ``HELD`` connections that sent ``request``: a refused one (429) or one the server closed is sent again;
    what an accepted one streams is read and dropped."""
    live: dict[socket.socket, bool] = {}  # socket -> answered 200 (a stream)
    while not stop.is_set():
        while len(live) < HELD:
            try:
                sock = _connect(url)
                sock.sendall(request)
            except OSError:
                counts["errors"] += 1
                break
            live[sock] = False
            counts["sent"] += 1
        readable, _, _ = select.select(list(live), [], [], 0.05)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if live[sock] and data:
                continue  # a stream's events
            if data.startswith(b"HTTP/1.1 200"):
                live[sock] = True
                counts["accepted"] += 1
                continue
            counts["refused" if data.startswith(b"HTTP/1.1 429") else "closed"] += 1
            del live[sock]
            sock.close()
    for sock in live:
        sock.close()


def slow_bodies(url: str, stop, counts) -> None:
    _churn(url, _head("POST", "/v1/jobs/list", ALICE, body_bytes=100) + b"{", stop, counts)


def event_streams(url: str, stop, counts) -> None:
    _churn(url, _head("GET", "/v1/jobs/events", ALICE), stop, counts)


def submit_and_wait(client, version: str) -> str:
    """``f.submit(x).result()``: the run with its inline wait, then the job's long poll if it had to queue."""
    job = client.functions.run_job("inc", version, [{"x": 1}], wait_s=30.0)
    if job.job_state.value not in ("DONE", "FAILED", "CANCELLED", "TIMED_OUT"):
        job = client.jobs.wait(job.job_id, timeout=60.0)
    return job.job_state.value


def small_submits(url: str, stop, counts, version: str, submitters: int) -> None:
    """``submitters`` threads submitting a trivial job and waiting for its result, back to back."""
    from lancefn_jupyter.kernel.client import Client

    states: list[str] = []

    def submitter() -> None:
        client = Client(url, ALICE)
        try:
            while not stop.is_set():
                states.append(submit_and_wait(client, version))
        finally:
            client.close()

    threads = [threading.Thread(target=submitter) for _ in range(submitters)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counts.update(states)


def artifact_burst(url: str, stop, counts, artifacts: int) -> None:
    """``artifacts`` registrations of 2 MiB list literals at once (each its own name, so each is checked)."""
    statuses: list[str] = []

    def register_one(seed: int) -> None:
        head = f"# {seed}\ndef inc(x: int) -> int:\n    return x + 1\n\nX = ["
        data = (head + "0," * ((ARTIFACT_BYTES - len(head)) // 2) + "0]\n").encode()
        body = trivial_registration(f"big{seed}", num_gpus=None)
        body["artifact"]["content"]["data"] = base64.b64encode(data).decode()
        body["artifact"]["digest"] = "sha256:" + hashlib.sha256(data).hexdigest()
        with httpx.Client(base_url=url, headers={"x-api-key": ALICE}, timeout=600) as http:
            try:
                status = http.post("/v1/functions/create", json=body).status_code
            except httpx.HTTPError:
                status = 0
        statuses.append(f"HTTP {status}")

    threads = [threading.Thread(target=register_one, args=(seed,), daemon=True) for seed in range(artifacts)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads) and not stop.wait(0.1):
        pass  # the burst has cleared, or the measuring window ended (what is left is dropped)
    counts.update(statuses)
    counts["unanswered"] = artifacts - len(statuses)


FLOODS = {
    "idle keep-alives": idle_keepalives,
    "slow bodies": slow_bodies,
    "event streams": event_streams,
    "small submits": small_submits,
    "2 MiB artifacts": artifact_burst,
}


# ---------------------------------------------------------------------------------------- measuring


class TeamB:
    """Team B's measures: ``GET /v1/health`` and a trivial job's submit → result, timed one after another."""

    def __init__(self, url: str, version: str) -> None:
        from lancefn_jupyter.kernel.client import Client

        self.client = Client(url, BOB)
        self.health = httpx.Client(base_url=url, timeout=60)
        self.version = version

    def sample(self, health: list[float], submits: list[float], failures: list[str]) -> None:
        started = time.perf_counter()
        try:
            status = str(self.health.get("/v1/health").status_code)
        except httpx.HTTPError as error:
            status = type(error).__name__
        health.append(time.perf_counter() - started)
        if status != "200":
            failures.append(f"health {status}")
        started = time.perf_counter()
        try:
            state = submit_and_wait(self.client, self.version)
        except Exception as error:  # a refusal is a finding, not a crash of the benchmark
            state = type(error).__name__
        submits.append(time.perf_counter() - started)
        if state != "DONE":
            failures.append(f"submit {state}")

    def close(self) -> None:
        self.client.close()
        self.health.close()


def stats_ms(samples: list[float]) -> dict:
    return {
        "p50": round(percentile(samples, 50) * 1000, 2),
        "p99": round(percentile(samples, 99) * 1000, 2),
        "max": round(max(samples) * 1000, 2),
        "n": len(samples),
    }


def start_flood(name: str, url: str, args: tuple) -> subprocess.Popen:
    """Flood ``name`` in a process of its own (this script with ``--flood``), as uid 65534 under root: another peer
    than B's client, as a job on the server's machine is.  It floods until its stdin closes, then prints its counts."""
    other = {"user": OTHER_UID, "group": OTHER_UID, "extra_groups": []} if os.geteuid() == 0 else {}
    return subprocess.Popen(
        [sys.executable, __file__, "--flood", name, "--url", url, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd="/",
        text=True,
        **other,
    )


def measure(
    team_b: TeamB, name: str, url: str, samples: int, args: tuple = (), window_s: float | None = None
) -> tuple[dict, dict, list[str], dict]:
    """B's samples while flood ``name`` runs (none: the idle baseline); ``window_s``: a flood that ends by itself
    (the artifact burst) is measured until it has ended or that long."""
    flood = None
    if name != "idle (baseline)":
        flood = start_flood(name, url, args)
        time.sleep(2.0)  # the flood at full strength before the first sample
    health: list[float] = []
    submits: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + (window_s or 0)
    while True:
        team_b.sample(health, submits, failures)
        time.sleep(0.005)
        if window_s is None and len(health) >= samples:
            break
        if window_s is not None and len(health) >= 20 and (flood.poll() is not None or time.monotonic() > deadline):
            break
    seen: dict = {}
    if flood is not None:
        out, _ = flood.communicate(timeout=120)  # closes its stdin: the flood stops
        seen = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"flood": f"exit {flood.returncode}"}
    return stats_ms(health), stats_ms(submits), failures, seen


def flood_process(name: str, url: str, extra: list[str]) -> None:
    """``--flood NAME``: run that flood until stdin closes (or it ends by itself); print what happened, as JSON."""
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    counts: Counter = Counter()
    kinds = {"small submits": (str, int), "2 MiB artifacts": (int,)}.get(name, ())
    FLOODS[name](url, stop, counts, *(kind(value) for kind, value in zip(kinds, extra, strict=True)))
    print(json.dumps(dict(counts)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=300, help="B's samples of each measure per flood")
    parser.add_argument("--gpus", type=int, default=4, help="simulated GPUs of the one class (both teams' jobs)")
    parser.add_argument("--submitters", type=int, default=16, help="A's threads in the small-submit flood")
    parser.add_argument("--artifacts", type=int, default=44, help="registrations in the artifact burst")
    parser.add_argument("--artifact-window-s", type=float, default=60.0, help="longest the burst is measured")
    parser.add_argument("--only", action="append", default=[], help="measure only these floods (and the baseline)")
    parser.add_argument("--flood", help=argparse.SUPPRESS)  # the flood process (``start_flood``)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    opts, extra = parser.parse_known_args()
    if opts.flood:
        flood_process(opts.flood, opts.url, extra)
        return
    print_machine()
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp) / "keys.toml"
        keys.write_text(KEYS)
        keys.chmod(0o600)
        classes = f"[[gpu_classes]]\nname = 'default'\nsimulated = {opts.gpus}\n"
        with server(gpu_classes=classes, args=["--api-keys", str(keys)]) as s:
            versions = {}
            for key in (ALICE, BOB):
                with httpx.Client(base_url=s.url, headers={"x-api-key": key}, timeout=60) as http:
                    versions[key] = register(http, trivial_registration("inc"))["version"]
            team_b = TeamB(s.url, versions[BOB])
            for _ in range(20):  # warm B's worker and connections
                team_b.sample([], [], [])
            runs = [
                ("idle (baseline)", (), None),
                ("idle keep-alives", (), None),
                ("slow bodies", (), None),
                ("event streams", (), None),
                ("small submits", (versions[ALICE], opts.submitters), None),
                ("2 MiB artifacts", (opts.artifacts,), opts.artifact_window_s),
            ]
            print(f"{'flood':<18} {'/v1/health p50 / p99 / max (ms)':>34} {'B submit→result p50 / p99 / max (ms)':>40}")
            for name, args, window in runs:
                if opts.only and name != "idle (baseline)" and not any(word in name for word in opts.only):
                    continue
                health, submit, failures, seen = measure(team_b, name, s.url, opts.samples, args, window)
                print(
                    f"{name:<18} {health['p50']:>10} / {health['p99']:>8} / {health['max']:>8}   "
                    f"{submit['p50']:>12} / {submit['p99']:>8} / {submit['max']:>8}   n={health['n']}"
                    + (f"   B's failures: {sorted(set(failures))} x{len(failures)}" if failures else "")
                    + (f"   flood: {json.dumps(seen)}" if seen else ""),
                    flush=True,
                )
                for what, figures in (("/v1/health", health), ("team B submit -> result", submit)):
                    summary(
                        BENCH,
                        f"{what} p99 during {name}",
                        figures["p99"],
                        "ms",
                        "<= 50 ms",
                        figures["p99"] <= 50.0 and not failures,
                        p50_ms=figures["p50"],
                        max_ms=figures["max"],
                        n=figures["n"],
                        failures=len(failures),
                    )
            team_b.close()


if __name__ == "__main__":
    main()
