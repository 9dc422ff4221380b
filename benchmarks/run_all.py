"""Run every benchmark module and print one summary table (target, measured, met).

    .venv/bin/python benchmarks/run_all.py                 # every benchmarks/bench_*.py, full size
    .venv/bin/python benchmarks/run_all.py --quick         # smaller sample counts (a few minutes)
    .venv/bin/python benchmarks/run_all.py --only scheduler magic
    .venv/bin/python benchmarks/run_all.py --markdown out.md   # also write the table as Markdown

Each module runs in its own subprocess (fresh interpreter, so first-use and import figures are
honest, and one benchmark's threads or servers never disturb the next); its output is shown as
it runs.  Modules report figures for ``run_all`` with lines of the form
``SUMMARY {"bench", "metric", "value", "unit", "target", "met", ...}`` (see ``_common.summary``);
for modules written without it, lines of the form ``<label> ... median X ms ... p95 Y ms`` are
picked up too, and ``TARGETS`` below says which of those labels have a target.  A module that
prints neither is listed with its exit status only.  Benchmarks never fail on a
missed target: the table says which targets are met.  Exit status is non-zero only when a
module crashed.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import machine  # noqa: E402

# Smaller runs for --quick (modules not listed run with their defaults).
QUICK_ARGS = {
    "bench_scheduler.py": ["--jobs", "2000", "--decisions", "50000"],
    "bench_magic.py": ["--warm", "50", "--cold", "3"],
    "bench_load_ext.py": ["--runs", "7"],
    "bench_widget_latency.py": ["--n", "50"],
    "bench_hardening.py": ["--artifacts", "1", "--row-posts", "2", "--floods", "1"],
    "bench_cancel_stall.py": ["--chunks", "5000"],
    "bench_dataplane.py": ["--quick"],
    "bench_batches.py": ["--runs", "1", "--backfill-rows", "20000", "--backfill-chunk", "2000"],
    "bench_backfill.py": ["--rows", "20000", "--memory-rows", "200000", "--reps", "1"],
    "bench_warm_state.py": ["--warm", "100"],
    "bench_notebook_loop.py": ["--samples", "20"],
    "bench_environments.py": ["--rounds", "1", "--hits", "3"],
    "bench_env_build.py": ["--rounds", "1"],
    "bench_table_agent.py": ["--fragments", "20", "--reps", "5"],
    "bench_floods.py": ["--samples", "100", "--artifacts", "12", "--artifact-window-s", "20"],
}
# Targets for timing lines of modules that print "label ... median X ms ... p95 Y ms":
# (module, substring of the label) -> (statistic compared, limit in ms, target text).
TARGETS = {
    ("bench_widget_latency.py", "(widget model)"): ("p95", 50.0, "p95 <= 50 ms"),
    ("bench_widget_latency.py", "bare SSE client"): ("p95", 50.0, "p95 <= 50 ms"),
}
_TIMING = re.compile(
    r"^\s*(?P<label>\S.*?)\s+(?:n=\s*(?P<n>\d+)\s+)?median\s+(?P<median>[\d.]+)\s*ms.*?p95\s+(?P<p95>[\d.]+)\s*ms"
)


def timing_record(module: str, line: str) -> dict | None:
    """A SUMMARY-like record from a plain "label ... median X ms ... p95 Y ms" line."""
    match = _TIMING.match(line)
    if match is None:
        return None
    label = match.group("label").rstrip(" :")
    median, p95 = float(match.group("median")), float(match.group("p95"))
    record = {
        "bench": module,
        "metric": label,
        "value": median,
        "unit": "ms median",
        "p95_ms": p95,
        "target": "",
        "met": None,
    }
    for (name, fragment), (stat, limit, text) in TARGETS.items():
        if name == module and fragment in label:
            record.update(target=text, met=(p95 if stat == "p95" else median) <= limit)
    return record


# Run order: cheap, isolated measurements first; the heavy scheduler run last.
ORDER = [
    "bench_load_ext.py",
    "bench_magic.py",
    "bench_widget_latency.py",
    "bench_submit_latency.py",
    "bench_hardening.py",
    "bench_cancel_stall.py",
    "bench_dataplane.py",
    "bench_scheduler.py",
]


def modules(only: list[str]) -> list[Path]:
    found = sorted(
        HERE.glob("bench_*.py"), key=lambda p: (ORDER.index(p.name) if p.name in ORDER else len(ORDER), p.name)
    )
    if only:
        found = [p for p in found if any(word in p.stem for word in only)]
    return found


def run_module(path: Path, extra: list[str], timeout: float) -> tuple[int, list[dict], float]:
    print(f"\n===== {path.name} {' '.join(extra)}".rstrip(), flush=True)
    started = time.monotonic()
    records: list[dict] = []
    plain: list[dict] = []
    proc = subprocess.Popen(
        [sys.executable, str(path), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=HERE.parent,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.startswith("SUMMARY "):
                try:
                    records.append(json.loads(line[len("SUMMARY ") :]))
                except ValueError:
                    pass
            elif (record := timing_record(path.name, line)) is not None:
                plain.append(record)
            if time.monotonic() - started > timeout:
                proc.kill()
                print(f"[run_all] {path.name} ran past {timeout:.0f} s and was stopped", flush=True)
                break
        code = proc.wait()
    except KeyboardInterrupt:
        proc.kill()
        raise
    return code, records or plain, time.monotonic() - started


def fmt_value(record: dict) -> str:
    value = record.get("value")
    text = f"{value:,}" if isinstance(value, (int, float)) else str(value)
    extra = f" (p95 {record['p95_ms']} ms)" if "p95_ms" in record else ""
    if "ratio" in record:
        extra += f" (ratio {record['ratio']})"
    return f"{text} {record.get('unit', '')}".strip() + extra


def table(rows: list[tuple[str, dict | None, int]]) -> list[list[str]]:
    out = []
    for name, record, code in rows:
        if record is None:
            out.append(
                [name, "(no SUMMARY lines; see its output above)", "", "", "ok" if code == 0 else f"exit {code}"]
            )
            continue
        met = record.get("met")
        out.append(
            [
                name,
                str(record.get("metric", "")),
                str(record.get("target", "")),
                fmt_value(record),
                "-" if met is None else ("met" if met else "NOT met"),
            ]
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run every benchmark and summarise")
    parser.add_argument("--quick", action="store_true", help="smaller sample counts")
    parser.add_argument("--only", nargs="*", default=[], help="substrings of module names to run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per module")
    parser.add_argument("--markdown", help="also write the summary table to this Markdown file")
    args = parser.parse_args(argv)

    m = machine()
    print(
        f"run_all: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, {m['date']}, load {m['loadavg']}"
    )
    rows: list[tuple[str, dict | None, int]] = []
    crashed = False
    for path in modules(args.only):
        extra = QUICK_ARGS.get(path.name, []) if args.quick else []
        code, records, elapsed = run_module(path, extra, args.timeout)
        crashed |= code != 0
        print(f"===== {path.name}: exit {code} after {elapsed:.0f} s", flush=True)
        rows.extend((path.name, record, code) for record in records) if records else rows.append(
            (path.name, None, code)
        )

    header = ["module", "metric", "target", "measured", "status"]
    body = table(rows)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    print("\nSUMMARY TABLE")
    for row in [header, ["-" * w for w in widths], *body]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    if args.markdown:
        lines = [
            f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']}, {m['platform']}, "
            f"{m['date']}, load average at start {m['loadavg']}.",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body),
            "",
        ]
        Path(args.markdown).write_text("\n".join(lines))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
