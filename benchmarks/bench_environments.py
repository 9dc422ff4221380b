"""A version's Python environment (docs/ARCHITECTURE.md, "Environments"): what its first job costs, ours vs Ray's.

    .venv/bin/python benchmarks/bench_environments.py [--rounds 3] [--hits 5] [--settle 1.5] [--no-ray]

(a) **A new one-package environment.** Each round takes a new pin of a small pure-Python package the base lacks
(``termcolor==X``: a new environment every round, on every side) and times submit → result of the first job that
imports it (ours: a 1-GPU simulated function):

* **ours** — a ``lancefn-server`` subprocess (local executor, a fresh ``LANCEFN_ENV_CACHE``) through HTTP: the plane
  builds the environment (``uv venv`` + ``uv pip compile`` over the base + ``uv pip install --no-deps`` + a ``.pth``
  to the base), then a worker of its Python runs the job;
* **Ray pip** — ``ray.get(f.options(runtime_env={"pip": [pin]}).remote())`` on a local Ray this script starts in
  a child process (the Ray driver: our client never imports Ray);
* **Ray uv** — the same with ``runtime_env={"uv": [pin]}``.

Targets: ours ≤ 0.5× Ray pip and ≤ 1.0× Ray uv (medians).  Caches: uv's download cache is on for ours (its
default location, warm after the first download of a pin on this machine: the script says whether a pin was in
it); Ray's pip and uv plugins install with ``--no-cache-dir`` / ``--no-cache`` by default, so they download every
time, and both clone the base virtualenv (``_clonevirtualenv``) for every new environment.

(b) **A cache hit.** The first job of a *new version* whose environment is already built (the last round's pin:
as a notebook's next edit of a function whose previous version ran here) against the first job of a new version
with no packages (``bench_new_version.py``'s measure: ``inc(x)``, a 1-GPU simulated function; the hit side is the
same function declaring the environment). The no-package version takes the base Python's fresh spare worker, the
hit a fresh spare of its environment's Python, which the local executor starts after a job of that environment;
``--settle`` seconds let them come up. Target ≤ 1.5× (medians).  Never asserts on
time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import describe, line_ms, print_machine, register, server, summary, trivial_registration

BENCH = "bench_environments.py"
CLASSES = '[[gpu_classes]]\nname = "default"\nsimulated = 1\n'
PACKAGE = "termcolor"  # pure Python, one small wheel, no dependencies, many releases
PINS = ("2.3.0", "2.4.0", "2.5.0", "3.0.0", "3.1.0", "2.2.0", "2.1.0", "2.0.0", "3.0.1", "3.1.1")

USES = """from __future__ import annotations


def uses(x: int) -> int:
    import importlib.metadata

    assert importlib.metadata.version({package!r}) == {version!r}, importlib.metadata.version({package!r})
    return x + 1
"""


# ----------------------------------------------------------------------------- ours


def _body(name: str, source: str, packages: tuple[str, ...], num_gpus: int | None) -> dict:
    from conftest import registration_body

    return registration_body(
        name, source=source, entrypoint="uses", inputs=(("x", "int64", False),), output_type="int64",
        packages=packages, num_gpus=num_gpus,
    )  # fmt: skip


def first_job(http, body: dict, x: int, timeout_s: float = 600.0) -> float:
    """Register ``body`` (a new version), then time submit → result of its first job."""
    version = register(http, body)["version"]
    started = time.perf_counter()
    job = http.post("/v1/functions/run", json={"name": body["name"], "version": version, "rows": [{"x": x}]})
    job_id = job.json()["job_id"]
    while True:
        reply = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 30}).json()
        if reply["job_state"] in ("DONE", "FAILED", "CANCELLED", "TIMED_OUT"):
            break
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"job {job_id} still {reply['job_state']} after {timeout_s:g} s")
    elapsed = time.perf_counter() - started
    if reply["job_state"] != "DONE" or reply["result"] != [x + 1]:
        raise RuntimeError(f"unexpected job outcome: {json.dumps(reply)[:2000]}")
    return elapsed


def with_marker(body: dict, marker: str) -> dict:
    """``body`` with a comment appended to its artifact: a new version id, the same environment."""
    source = base64.b64decode(body["artifact"]["content"]["data"]) + f"\n# {marker}\n".encode()
    body["artifact"]["content"]["data"] = base64.b64encode(source).decode()
    body["artifact"]["digest"] = "sha256:" + hashlib.sha256(source).hexdigest()
    return body


def in_uv_cache(pin: str) -> bool:
    """Whether uv's download cache already holds ``termcolor-<pin>`` (a warm download for ours)."""
    try:
        out = subprocess.run([sys.executable, "-m", "uv", "cache", "dir"], capture_output=True, text=True, timeout=30)
        root = Path(out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return False
    return any((root / "archive-v0").glob(f"*/{PACKAGE}-{pin}.dist-info"))  # the unpacked wheels uv links from


# ----------------------------------------------------------------------------- Ray direct (child process)


def ray_child() -> int:
    """The Ray driver: ``pip PIN`` / ``uv PIN`` on stdin → the seconds of submit → result on stdout."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="lfb", dir="/tmp")
    for attempt in range(3):  # Ray's own 30 s startup wait can expire once on a busy machine
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise

    @ray.remote
    def uses(package: str, version: str) -> int:
        import importlib.metadata

        assert importlib.metadata.version(package) == version
        return 1

    ray.get(uses.options(runtime_env={}).remote("ray", ray.__version__))  # a warm plain worker first
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            field, pin = line.split()
            runtime_env = {field: [f"{PACKAGE}=={pin}"]}
            started = time.perf_counter()
            try:
                ray.get(uses.options(runtime_env=runtime_env).remote(PACKAGE, pin), timeout=900)
                print(json.dumps({"s": time.perf_counter() - started}), flush=True)
            except Exception as error:
                print(json.dumps({"error": f"{type(error).__name__}: {str(error)[-500:]}"}), flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


class RayDriver:
    def __init__(self) -> None:
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--ray-child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=env, start_new_session=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            raise RuntimeError(f"the Ray driver did not start: {line!r}")

    def time(self, field: str, pin: str) -> float:
        self.proc.stdin.write(f"{field} {pin}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        reply = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        if "error" in reply:
            raise RuntimeError(f"Ray {field} failed: {reply['error']}")
        return float(reply["s"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


# ----------------------------------------------------------------------------- the run


def ratio(a: list[float], b: list[float]) -> float:
    return describe(a)["median"] / describe(b)["median"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="new environments per side (each a new pin)")
    parser.add_argument("--hits", type=int, default=5, help="new versions on a built environment, and without one")
    parser.add_argument("--settle", type=float, default=1.5, help="seconds before each (b) job (spares come up)")
    parser.add_argument("--no-ray", action="store_true", help="ours only (no Ray sides, no ratios for (a))")
    parser.add_argument("--ray-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ray_child:
        return ray_child()
    if args.rounds > len(PINS):
        parser.error(f"at most {len(PINS)} rounds (one pin each)")
    print_machine()
    cache = tempfile.mkdtemp(prefix="lancefn-bench-envs-", dir="/tmp")
    os.chmod(cache, 0o755)  # a root server's workers run as another user, who must read it
    os.environ["LANCEFN_ENV_CACHE"] = cache  # a fresh cache: every environment of this run is new
    ours: list[float] = []
    ray_pip: list[float] = []
    ray_uv: list[float] = []
    hits: list[float] = []
    plain: list[float] = []
    driver = None if args.no_ray else RayDriver()
    try:
        with server(gpu_classes=CLASSES) as srv, srv.http(timeout=120.0) as http:
            time.sleep(2.0)  # the pre-started fresh worker comes up
            for i, pin in enumerate(PINS[: args.rounds]):
                warm = in_uv_cache(pin)
                body = _body(f"env{i}", USES.format(package=PACKAGE, version=pin), (f"{PACKAGE}=={pin}",), 1)
                ours.append(first_job(http, body, i))
                line = f"round {i + 1} {PACKAGE}=={pin} (uv cache {'warm' if warm else 'cold'}): ours {ours[-1]:.2f} s"
                if driver is not None:
                    ray_pip.append(driver.time("pip", pin))
                    ray_uv.append(driver.time("uv", pin))
                    line += f", Ray pip {ray_pip[-1]:.2f} s, Ray uv {ray_uv[-1]:.2f} s"
                print(line, flush=True)
            # (b): every round's environment is built; each new version of the last one's is a cache hit (as a
            # notebook's next edit of the function: its previous version's job ran on these devices)
            pin = PINS[args.rounds - 1]
            for j in range(args.hits):
                time.sleep(args.settle)
                body = with_marker(trivial_registration(), f"plain {j}")
                plain.append(first_job(http, body, j))
                time.sleep(args.settle)
                # The same function as the plain side, declaring the built environment: only the environment differs.
                body = trivial_registration("inc_env")
                body["runtime"]["environment"]["packages"] = [f"{PACKAGE}=={pin}"]
                hits.append(first_job(http, with_marker(body, f"hit {j}"), j))
    finally:
        if driver is not None:
            driver.close()
        subprocess.run(["chmod", "-R", "u+w", cache], check=False)  # built environments are read-only
        shutil.rmtree(cache, ignore_errors=True)

    print(line_ms("(a) ours: first job, new 1-package environment", ours))
    if ray_pip:
        print(line_ms("(a) Ray runtime_env pip: first task", ray_pip))
        print(line_ms("(a) Ray runtime_env uv: first task", ray_uv))
    print(line_ms("(b) first job of a new version, environment built", hits))
    print(line_ms("(b) first job of a new version, no packages", plain))
    median = describe(ours)["median"]
    summary(BENCH, "first job of a new 1-package environment, ours (local executor)", round(median, 2), "s")
    if ray_pip:
        to_pip, to_uv = ratio(ours, ray_pip), ratio(ours, ray_uv)
        print(f"ours / Ray pip: {to_pip:.2f}x (target <= 0.5x); ours / Ray uv: {to_uv:.2f}x (target <= 1.0x)")
        summary(BENCH, "new 1-package environment: ours / Ray pip (medians)", round(to_pip, 3), "x", "<= 0.5x",
                to_pip <= 0.5, ours_s=round(median, 2), ray_s=round(describe(ray_pip)["median"], 2))  # fmt: skip
        summary(BENCH, "new 1-package environment: ours / Ray uv (medians)", round(to_uv, 3), "x", "<= 1.0x",
                to_uv <= 1.0, ours_s=round(median, 2), ray_s=round(describe(ray_uv)["median"], 2))  # fmt: skip
    hit = ratio(hits, plain)
    print(f"cache hit / no packages: {hit:.2f}x (target <= 1.5x)")
    summary(BENCH, "first job of a new version on a built environment / with no packages (medians)", round(hit, 3),
            "x", "<= 1.5x", hit <= 1.5, hit_ms=round(describe(hits)["median"] * 1000, 1),
            plain_ms=round(describe(plain)["median"] * 1000, 1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
