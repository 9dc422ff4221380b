"""``%load_ext lancefn_jupyter`` in a fresh interpreter: time, and what it must not import.

    .venv/bin/python benchmarks/bench_load_ext.py [--runs 15]

Target: <= 50 ms for ``import lancefn_jupyter`` + ``load_ext``, measured in a fresh subprocess
that has already imported IPython and built its shell (as a kernel has), and httpx, pydantic,
ipywidgets, numba and pyarrow must NOT be in ``sys.modules`` afterwards (they load on first use).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import clean_env, line_ms, print_machine, summary, summary_median_ms

BENCH = "load_ext"
HEAVY = ("httpx", "pydantic", "ipywidgets", "numba", "starlette", "uvicorn", "numpy", "pyarrow")
MUST_NOT = ("httpx", "pydantic", "ipywidgets", "numba", "pyarrow")

SCRIPT = r"""
import json, sys, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
heavy = %r
before = {m for m in heavy if m in sys.modules}
t0 = time.perf_counter()
shell.run_line_magic("load_ext", "lancefn_jupyter")
t1 = time.perf_counter()
ok = "gpu_function" in shell.magics_manager.magics["cell"]
print(json.dumps({"s": t1 - t0, "ok": ok, "preloaded": sorted(before),
                  "loaded": sorted(m for m in heavy if m in sys.modules and m not in before)}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args(argv)
    print_machine()
    samples, loaded, preloaded = [], set(), set()
    for _ in range(args.runs):
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT % (HEAVY,)], env=clean_env(), capture_output=True, text=True, timeout=60
        )
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        record = json.loads(out.stdout.strip().splitlines()[-1])
        assert record["ok"], record
        samples.append(record["s"])
        loaded.update(record["loaded"])
        preloaded.update(record["preloaded"])
    print(line_ms("import lancefn_jupyter + %load_ext (fresh process)", samples))
    print(
        f"heavy modules imported by load_ext: {sorted(loaded) or 'none'}"
        + (f" (already loaded by IPython/site before it: {sorted(preloaded)})" if preloaded else "")
    )
    summary_median_ms(BENCH, "%load_ext lancefn_jupyter (median)", samples, 50)
    bad = sorted(set(MUST_NOT) & (loaded | preloaded))
    summary(
        BENCH,
        "httpx/pydantic/ipywidgets/numba/pyarrow in sys.modules after load_ext",
        len(bad),
        "modules",
        "0",
        not bad,
        names=bad,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
