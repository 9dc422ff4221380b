"""First job of a new function version, now that a worker serves one (namespace, version) only.

    .venv/bin/python benchmarks/bench_new_version.py [--iterations 30] [--settle 1.5]

Each iteration registers a *new* version of a trivial 1-GPU function (one simulated GPU, so every
job lands on the same device set) and times submit → result of its first job (``functions/run``
then the ``jobs/wait`` long poll), then of a second job of the same version (the warm path).  The
first job takes the device set's fresh spare worker (started in the background after the previous
one was taken; ``--settle`` seconds between iterations let it come up), so it pays the task, not a
process start.  For reference, ``--settle 0`` shows the cost when the spare is not ready yet.
``--imports numpy,numba`` makes the function import those (spare workers of GPU device sets preload
them in the background).  Target: first job of a new version <= 50 ms median.  Never asserts on time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import describe, line_ms, print_machine, register, server, summary, summary_median_ms, trivial_registration

BENCH = "new_version"
CLASSES = '[[gpu_classes]]\nname = "default"\nsimulated = 1\n'


def submit_to_result(http, name: str, version: str, x: int) -> float:
    started = time.perf_counter()
    job = http.post("/v1/functions/run", json={"name": name, "version": version, "rows": [{"x": x}]}).json()["job_id"]
    reply = http.post("/v1/jobs/wait", json={"job_id": job, "timeout_s": 60}).json()
    elapsed = time.perf_counter() - started
    if reply["job_state"] != "DONE" or reply["result"] != [x + 1]:
        raise RuntimeError(f"unexpected job outcome: {reply}")
    return elapsed


def run(iterations: int, settle_s: float, imports: str = "") -> tuple[list[float], list[float]]:
    first, warm = [], []
    with server(gpu_classes=CLASSES) as srv, srv.http() as http:
        time.sleep(2.0)  # the pre-started fresh worker comes up
        for i in range(iterations):
            body = trivial_registration()
            # A distinct artifact each time: a new version id (the digest is recomputed below).
            extra = "".join(f"import {name}  # noqa: F401\n" for name in imports.split(",") if name)
            source = base64.b64decode(body["artifact"]["content"]["data"]) + f"\n{extra}# version {i}\n".encode()
            body["artifact"]["content"]["data"] = base64.b64encode(source).decode()
            body["artifact"]["digest"] = "sha256:" + hashlib.sha256(source).hexdigest()
            version = register(http, body)["version"]
            first.append(submit_to_result(http, "inc", version, i))
            warm.append(submit_to_result(http, "inc", version, i + 1))
            time.sleep(settle_s)
    return first, warm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument(
        "--settle", type=float, default=1.5, help="seconds between iterations (the spare worker starts meanwhile)"
    )
    parser.add_argument(
        "--imports", default="", help="modules the function imports, e.g. numpy,numba (spares preload them)"
    )
    args = parser.parse_args(argv)
    print_machine()
    first, warm = run(args.iterations, args.settle, args.imports)
    print(line_ms("first job of a new version (fresh spare worker)", first))
    print(line_ms("second job of that version (its warm worker)", warm))
    what = f", importing {args.imports}" if args.imports else ""
    summary_median_ms(BENCH, f"first job of a new version{what}, submit→result (settle {args.settle:g} s)", first, 50)
    summary(BENCH, "warm job of the same version, submit→result", round(describe(warm)["median"] * 1000, 2), "ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
