"""What a team's table agent costs (docs/ARCHITECTURE.md, "Backfills", "Which tables"):

    .venv/bin/python benchmarks/bench_table_agent.py [--fragments 100] [--rows 1024] [--dim 768] [--reps 20]

On a shared server a namespace key's backfill reads each chunk's slice and commits each fragment through a table
agent (a process of the table root's owner), after a check of the table's tree. Here, in one process (no control
plane, no HTTP), on a table of ``--fragments`` fragments of ``--rows`` rows each with a ``dim``-float32 vector
column ``vec`` and a float column ``x``:

1. **The tree check**: a full walk of the table (``tree_problem``) and a remembered one (``TreeCheck``, what every
   check after the first costs while the table's directories are unchanged).
2. **A slice read** of one fragment's rows (the vector column, as a backfill's rows file): direct
   (``read_slice`` + ``write_ipc_file``, what the control plane does otherwise) against the agent (the check, the
   request, the agent's read and its write into the descriptor it gets).
3. **A fragment commit** of ``--rows`` float32 vectors (one chunk's result file): direct ``commit_fragment`` against
   the agent's (the check, the request, the result file handed over as a descriptor and mapped by the agent).

Run as root, the agent runs as a uid of its own (61190, the table given to it; the directories above this Python
get o+x as the tests' ``let_workers_reach_this_python`` does); otherwise as this user. Medians of ``--reps`` runs,
alternated direct / agent; the agent's start (once per owner and server) is printed apart. Nothing asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import line_ms, print_machine, summary

BENCH = "bench_table_agent.py"
AGENT_UID = 61190


def _make_table(root: Path, fragments: int, rows: int, dim: int) -> str:
    import lancedb
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    db = lancedb.connect(str(root))

    def part(start: int):
        vec = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * dim, dtype=np.float32)), dim)
        return pa.table({"id": np.arange(start, start + rows), "x": rng.random(rows), "vec": vec})

    table = db.create_table("t", part(0))
    for i in range(1, fragments):
        table.add(part(i * rows))
    return table.uri


def _results_file(path: Path, rows: int, dim: int) -> None:
    import numpy as np

    from lancefn_jupyter.wire import dataplane

    values = [np.full(dim, i, dtype=np.float32) for i in range(rows)]
    dataplane.write_ipc_file(path, dataplane.encode_results(values, "tensor<float32>", many=True), durable=False)


def _give(root: Path) -> None:
    """As root: the table to AGENT_UID (the agent runs as the root's owner), this Python reachable by it."""
    from helpers import give_to_team  # tests/ is on the path (_common)

    give_to_team(root, AGENT_UID)


def _direct_and_agent(step: str, direct_how: str, direct: list[float], agent: list[float]) -> None:
    """A step's times done directly and through the table agent, and the agent's extra (medians, ms)."""
    print(line_ms(f"   direct ({direct_how})", direct))
    print(line_ms("   through the agent", agent))
    extra = statistics.median(agent) - statistics.median(direct)
    summary(BENCH, f"{step}, direct", round(statistics.median(direct) * 1000, 2), "ms")
    summary(BENCH, f"{step}, through the agent", round(statistics.median(agent) * 1000, 2), "ms")
    summary(BENCH, f"{step}, the agent's extra", round(extra * 1000, 2), "ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fragments", type=int, default=100)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    print_machine()

    from lancefn_jupyter.server.executors.table_agent import TableAgents
    from lancefn_jupyter.server.executors.table_tree import TreeCheck, tree_problem
    from lancefn_jupyter.tables.commit import ChunkPart, commit_fragment, result_columns
    from lancefn_jupyter.tables.slices import read_slice
    from lancefn_jupyter.wire import dataplane

    work = Path(tempfile.mkdtemp(prefix="lancefn-bench-agent-", dir="/tmp"))
    work.chmod(0o755)
    root = work / "root"
    root.mkdir()
    try:
        uri = _make_table(root, args.fragments, args.rows, args.dim)
        files = sum(len(names) for _, _, names in os.walk(uri))
        results = work / "results.arrow"
        _results_file(results, args.rows, args.dim)
        _give(root)
        agents = TableAgents()

        walks, checks = [], []
        check = TreeCheck()
        check.problem(uri, str(root))
        for _ in range(args.reps):
            start = time.perf_counter()
            assert tree_problem(uri, str(root)) is None
            walks.append(time.perf_counter() - start)
            start = time.perf_counter()
            assert check.problem(uri, str(root)) is None
            checks.append(time.perf_counter() - start)
        print(f"\n1. the tree check, {args.fragments} fragments ({files} files)")
        print(line_ms("   full walk", walks))
        print(line_ms("   remembered (directories unchanged)", checks))

        table_slice = {
            "uri": uri,
            "table_version": args.fragments,
            "fragment": 1,
            "ranges": [[0, args.rows]],
            "columns": ["vec"],
            "root": str(root),
        }
        rows_file = str(work / "rows.arrow")
        start = time.perf_counter()
        agents.read_slice(table_slice, {}, rows_file)  # the agent starts: once per owner and server
        first = time.perf_counter() - start
        direct, agent = [], []
        for _ in range(args.reps):
            start = time.perf_counter()
            dataplane.write_ipc_file(rows_file, read_slice(table_slice, {}), durable=False)
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            agents.read_slice(table_slice, {}, rows_file)
            agent.append(time.perf_counter() - start)
        mb = os.path.getsize(rows_file) / 1e6
        print(f"\n2. a slice read: {args.rows} rows x {args.dim} float32 ({mb:.1f} MB rows file)")
        print(f"   the agent's start and first read: {first * 1000:.0f} ms")
        _direct_and_agent("slice read", "read_slice + write_ipc_file", direct, agent)

        def load():
            return result_columns(dataplane.read_ipc(results))

        def opened() -> int:
            return os.open(results, os.O_RDONLY)

        direct, agent = [], []
        for rep in range(args.reps):
            fragment = 2 + rep % (args.fragments - 2)
            start = time.perf_counter()
            commit_fragment(
                uri,
                fragment,
                into="out",
                output_type="tensor<float32>",
                parts=[ChunkPart(list(range(args.rows)), load)],
                version="direct",
            )
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            agents.commit(
                str(root),
                uri,
                fragment,
                into="out",
                output_type="tensor<float32>",
                version="agent",
                parts=[([[0, args.rows]], opened)],
            )
            agent.append(time.perf_counter() - start)
        print(f"\n3. a fragment commit: {args.rows} rows x {args.dim} float32 (one chunk's result file)")
        _direct_and_agent("fragment commit", "commit_fragment", direct, agent)
        summary(BENCH, "tree check, full walk", round(statistics.median(walks) * 1000, 3), "ms", files=files)
        summary(BENCH, "tree check, remembered", round(statistics.median(checks) * 1000, 3), "ms", files=files)
        agents.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
