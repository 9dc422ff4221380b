"""Building environments unprivileged (docs/ARCHITECTURE.md, "Environments": "Who builds", "Sharing rule"): what it
costs against the build as the server's user, and what per-namespace environments cost against a cache hit.

    .venv/bin/python benchmarks/bench_env_build.py [--rounds 3] [--baseline-rev REV]    # as root

A root ``lancefn-server`` with two namespaces (keys ``a`` and ``b``) and ``--worker-uids`` (each namespace's workers
a uid of their own), one simulated GPU, a fresh ``--env-cache`` per server. Each round takes a new pin of a small
pure-Python package the base lacks (``termcolor==PIN``, ``bench_environments.PINS``) and times submit → result of
jobs that import it (``bench_environments.first_job``: register a new version, then its first job):

(a) **A new one-package environment, unprivileged vs as root.**
    * *this code*: namespace a's first job of ``pip=termcolor==PIN``: built as a's uid, in a private directory, uv's
      configuration off, its own uv cache (cold: the cache directory is new), then sealed; and a's first job of a
      second new environment of the same package (``termcolor==PIN`` + ``packaging``, which the base has: the same
      install) — the same build with that uv cache warm;
    * *baseline*: the same two jobs on the code at ``--baseline-rev`` (default: the commit before this change;
      ``git archive`` of its ``lancefn_jupyter`` into a temp directory, run from there), which ran uv as root with
      root's uv cache (warm when it has the pin: the line says).
(b) **Per-namespace environments.** Namespace b's first job of a's ``pip=termcolor==PIN``: this code builds b's own
    (b's uv cache cold), the baseline hands b a's (a cache hit); beside them, a cache hit on this code (a's new
    version of the same ``pip=``).

Each round runs the baseline and this code in turn (the order alternating). Figures are printed, nothing asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, describe, line_ms, print_machine, server, summary

BENCH = "bench_env_build.py"
A_KEY, B_KEY = "bench-env-team-a-0001", "bench-env-team-b-0002"
KEYS = "".join(
    f'[[api_keys]]\nname = "{name}"\nkey = "{key}"\nnamespace = "{name}"\nprivileges = ["functions", "jobs"]\n\n'
    for name, key in (("a", A_KEY), ("b", B_KEY))
)
CLASSES = '[[gpu_classes]]\nname = "default"\nsimulated = 1\n'
UIDS = "61950-61959"
DEFAULT_BASELINE = "908095c"  # the commit before environments were built unprivileged


def _baseline(rev: str) -> Path:
    """The baseline's ``lancefn_jupyter`` in a temp directory the workers' uids can read."""
    where = Path(tempfile.mkdtemp(prefix="lancefn-bench-baseline-", dir="/tmp"))
    where.chmod(0o755)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "lancefn_jupyter"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where


def _round(pin: str, keys: Path, cwd: Path | None) -> dict[str, float]:
    """One server (the code in ``cwd``, else this checkout), a fresh cache: the four first jobs, in seconds."""
    from bench_environments import PACKAGE, USES, first_job, with_marker
    from conftest import registration_body

    def body(name: str, packages: tuple[str, ...]) -> dict:
        source = USES.format(package=PACKAGE, version=pin)
        return registration_body(name, source=source, entrypoint="uses", inputs=(("x", "int64", False),),
                                 output_type="int64", packages=packages, num_gpus=1)  # fmt: skip

    cache = Path(tempfile.mkdtemp(prefix="lancefn-bench-envs-", dir="/tmp"))
    cache.chmod(0o755)
    env = {"LANCEFN_WORKER_USER": "", "LANCEFN_ENV_CACHE": str(cache)}
    args = ["--worker-uids", UIDS, "--api-keys", str(keys)]
    times: dict[str, float] = {}
    try:
        with server(gpu_classes=CLASSES, args=args, env=env, cwd=cwd) as srv:
            with srv.http(timeout=120.0, headers={"x-api-key": A_KEY}) as a:
                times["first"] = first_job(a, body("one", (f"{PACKAGE}=={pin}",)), 1)
                times["first, uv cache warm"] = first_job(a, body("two", (f"{PACKAGE}=={pin}", "packaging")), 2)
            with srv.http(timeout=120.0, headers={"x-api-key": B_KEY}) as b:
                times["other namespace"] = first_job(b, body("one", (f"{PACKAGE}=={pin}",)), 3)
            with srv.http(timeout=120.0, headers={"x-api-key": A_KEY}) as a:
                times["cache hit"] = first_job(a, with_marker(body("one", (f"{PACKAGE}=={pin}",)), "hit"), 4)
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # as root: read-only directories are no obstacle
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="new environments per side (each a new pin)")
    parser.add_argument("--baseline-rev", default=DEFAULT_BASELINE, help="the code that built as the server's user")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(f"{BENCH}: needs root (a server whose workers, and builds, run as other uids); skipped")
        return 0
    from bench_environments import PACKAGE, PINS, in_uv_cache
    from helpers import let_workers_reach_this_python

    if args.rounds > len(PINS):
        parser.error(f"at most {len(PINS)} rounds (one pin each)")
    print_machine()
    let_workers_reach_this_python()
    baseline = _baseline(args.baseline_rev)
    keys = Path(tempfile.mkdtemp(prefix="lancefn-bench-keys-")) / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    sides: dict[str, dict[str, list[float]]] = {"this code": {}, "baseline": {}}
    try:
        for i, pin in enumerate(PINS[: args.rounds]):
            warm = in_uv_cache(pin)
            order = [("baseline", baseline), ("this code", None)]
            for side, cwd in order if i % 2 == 0 else order[::-1]:
                for label, seconds in _round(pin, keys, cwd).items():
                    sides[side].setdefault(label, []).append(seconds)
            shown = ", ".join(
                f"{side} {sides[side]['first'][-1]:.2f} s / {sides[side]['other namespace'][-1]:.2f} s"
                for side in sides
            )
            print(
                f"round {i + 1} {PACKAGE}=={pin} (root's uv cache {'warm' if warm else 'cold'}): first / b's: {shown}"
            )
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
        shutil.rmtree(keys.parent, ignore_errors=True)

    for side, figures in sides.items():
        for label, samples in figures.items():
            print(line_ms(f"{side}: {label}", samples))
    ours, old = sides["this code"], sides["baseline"]

    def median(samples: list[float]) -> float:
        return describe(samples)["median"]

    first = median(ours["first"]) / median(old["first"])
    warm = median(ours["first, uv cache warm"]) / median(old["first, uv cache warm"])
    per_namespace = median(ours["other namespace"]) / median(ours["cache hit"])
    print(
        f"(a) new 1-package environment, unprivileged / as root: {first:.2f}x (its uv cache cold), {warm:.2f}x (warm)"
    )
    print(f"(b) another namespace's first job of the same pip= / a cache hit: {per_namespace:.2f}x")
    summary(BENCH, "new 1-package environment: built unprivileged / as root (medians)", round(first, 3), "x",
            ours_s=round(median(ours["first"]), 2), root_s=round(median(old["first"]), 2))  # fmt: skip
    summary(BENCH, "new 1-package environment, uv cache warm: unprivileged / as root (medians)", round(warm, 3), "x",
            ours_s=round(median(ours["first, uv cache warm"]), 2),
            root_s=round(median(old["first, uv cache warm"]), 2))  # fmt: skip
    summary(BENCH, "another namespace's first job of the same pip= / a cache hit (medians)", round(per_namespace, 3),
            "x", other_s=round(median(ours["other namespace"]), 2), hit_s=round(median(ours["cache hit"]), 2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
