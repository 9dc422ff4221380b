"""``%%gpu_function`` cell → registered function version, against the embedded control plane.

    .venv/bin/python benchmarks/bench_magic.py [--warm 200] [--cold 5]

Warm (target <= 10 ms median): an IPython ``InteractiveShell`` in this process with the
extension loaded and the embedded control plane already running; the whole cell is timed
(``run_cell`` of the ``%%gpu_function`` cell: run the code, package it, register, display the card):
  * unchanged cell: same version, the kernel remembers it, no HTTP;
  * changed cell: a new constant each time, so a new version is packaged and registered
    (``functions/create`` + ``jobs/wait`` over keep-alive HTTP).

First use (target <= 0.5 s median): a fresh Python subprocess with an empty ``LANCEFN_HOME`` and no
control plane running: ``%load_ext lancefn_jupyter`` then the first ``%%gpu_function`` cell, which
starts the embedded control plane.  Timed from before ``load_ext`` to the registered version
(the IPython import, which a kernel has already done, is reported apart), with when the server
was ready (``server.json`` written) on the same clock.  The package is measured as it is installed: the
README's install scripts compile its bytecode (an editable install does not, and with
``PYTHONDONTWRITEBYTECODE`` set, as on the project's machines, no process ever writes it, so each would
compile every module from source: ~60 ms more here); how many modules have current bytecode is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import clean_env, line_ms, print_machine, summary_median_ms

BENCH = "magic"

CELL = """\
SCALE = {scale}

def scale_score(value: float) -> float:
    return value * SCALE
"""

COLD_SCRIPT = r"""
import json, sys, time
import os
t0 = time.perf_counter()
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output
shell = InteractiveShell.instance()
t1 = time.perf_counter()
wall1 = time.time()
shell.run_line_magic("load_ext", "lancefn_jupyter")
t2 = time.perf_counter()
with capture_output() as captured:
    result = shell.run_cell("%%gpu_function num_gpus=1\ndef first(x: float) -> float:\n    return x + 1\n")
t3 = time.perf_counter()
handle = shell.user_ns["first"]
ok = result.success and handle._version is not None
ready_s = os.stat(os.path.join(os.environ["LANCEFN_HOME"], "server.json")).st_mtime - wall1
print(json.dumps({"ipython_s": t1 - t0, "load_ext_s": t2 - t1, "cell_s": t3 - t2, "ready_s": ready_s, "ok": ok,
                  "version": handle._version.version if ok else None, "out": captured.stdout[-300:]}))
from lancefn_jupyter.embedded import stop_server
stop_server()
"""


def warm(n: int) -> tuple[list[float], list[float]]:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    home = tempfile.mkdtemp(prefix="lancefn-bench-magic-")
    for name in ("LANCEFN_URL", "LANCEFN_API_KEY", "LANCEFN_GPU_CLASSES"):
        os.environ.pop(name, None)
    os.environ["LANCEFN_HOME"] = home
    os.environ["LANCEFN_DISABLE_NVML"] = "1"
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "lancefn_jupyter")
    from lancefn_jupyter.embedded import stop_server
    from lancefn_jupyter.kernel import api

    try:

        def run(scale: int) -> float:
            cell = "%%gpu_function num_gpus=1\n" + CELL.format(scale=scale)
            with capture_output():
                started = time.perf_counter()
                result = shell.run_cell(cell)
                elapsed = time.perf_counter() - started
            assert result.success, result
            assert shell.user_ns["scale_score"]._version is not None
            return elapsed

        run(0)  # starts the embedded control plane; imports everything
        for i in range(20):  # warm-up: connections, caches, JIT-less Python paths
            run(i % 3)
        unchanged = [run(1) for _ in range(n)]
        changed = [run(1000 + i) for i in range(n)]
        versions = {v.version for v in api.current_client().functions.list("scale_score")}
        assert len(versions) >= n, len(versions)
        return unchanged, changed
    finally:
        stop_server()


def cold(n: int) -> list[dict]:
    runs = []
    for _ in range(n):
        with tempfile.TemporaryDirectory(prefix="lancefn-bench-cold-") as home:
            env = clean_env({"LANCEFN_HOME": home})
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", COLD_SCRIPT], env=env, capture_output=True, text=True, timeout=120
            )
            wall = time.perf_counter() - started
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            record = json.loads(out.stdout.strip().splitlines()[-1])
            if not record["ok"]:
                raise RuntimeError(f"first cell did not register: {record}")
            record["process_wall_s"] = wall
            runs.append(record)
    return runs


def _compiled(source: Path) -> bool:
    cached = Path(importlib.util.cache_from_source(str(source)))
    return cached.exists() and cached.stat().st_mtime >= source.stat().st_mtime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=200, help="samples per warm variant")
    parser.add_argument("--cold", type=int, default=5, help="fresh-subprocess first-use runs")
    args = parser.parse_args(argv)
    print_machine()

    package = Path(__file__).resolve().parent.parent / "lancefn_jupyter"
    sources = list(package.rglob("*.py"))
    current = sum(1 for source in sources if _compiled(source))
    print(f"package bytecode: {current} of {len(sources)} modules compiled and current (see the module docstring)")
    runs = cold(args.cold)
    first = [r["load_ext_s"] + r["cell_s"] for r in runs]
    print(line_ms("first use: load_ext + first cell (server start)", first))
    print(line_ms("  of which the first cell", [r["cell_s"] for r in runs]))
    print(line_ms("  server ready (server.json written), same clock", [r["ready_s"] for r in runs]))
    print(line_ms("  IPython import + shell (a kernel has it already)", [r["ipython_s"] for r in runs]))
    print(line_ms("  whole fresh process (interpreter start to exit)", [r["process_wall_s"] for r in runs]))
    summary_median_ms(BENCH, "first %%gpu_function in a fresh kernel, no server running (median)", first, 500, 1)

    unchanged, changed = warm(args.warm)
    print(line_ms("warm: unchanged cell (same version, no HTTP)", unchanged))
    print(line_ms("warm: changed cell (new version registered)", changed))
    for label, samples in (
        ("warm %%gpu_function, unchanged cell", unchanged),
        ("warm %%gpu_function, new version registered", changed),
    ):
        summary_median_ms(BENCH, label + " (median)", samples, 10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
