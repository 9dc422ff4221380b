"""Warm state (docs/ARCHITECTURE.md, "Warm state", "Debugging a failure") as a notebook user meets it: cells registered with the real
``%%gpu_function`` magic in notebooks executed by nbclient against a real control plane, local and Ray.

Every version under test appends its process id to a file each time its module (or a class entry's
``setup()``) executes, so the tests count executions per process: the kernel's own execution of the cell is
told apart by the kernel's pid, which the notebook prints first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from helpers import outputs_text
from nbclient import NotebookClient

COUNTED = """%%gpu_function num_gpus=1{options}
import os
with open({path!r}, "a") as _log:
    _log.write(f"{{os.getpid()}}\\n")
_MODEL = {{"w": 3}}

def {name}(x: int) -> int:
    return x * _MODEL["w"]
"""

SCALER = """%%gpu_function num_gpus=1{options}
import os, time

class Scaler:
    def setup(self):
        with open({setups!r}, "a") as log:
            log.write(f"{{os.getpid()}}\\n")
        self.w = 10

    def __call__(self, x: int) -> int:
        if x < 0:
            time.sleep(60)  # held until cancelled
        return x * self.w

    def teardown(self):
        with open({teardowns!r}, "a") as log:
            log.write(f"{{os.getpid()}}\\n")
"""


def scaler_cell(tmp_path: Path, options: str = "") -> str:
    """The ``Scaler`` class entry's cell, logging its setups and teardowns to ``setups.log`` / ``teardowns.log``."""
    return SCALER.format(
        options=options, setups=str(tmp_path / "setups.log"), teardowns=str(tmp_path / "teardowns.log")
    )


def run_notebook(cp, tmp_path: Path, cells: list[str], *, timeout: int = 240) -> dict[str, object]:
    """Execute ``cells`` after connecting to ``cp``; every line ``OUT <tag> <json>`` becomes ``{tag: value}``."""
    head = [
        "%load_ext lancefn_jupyter",
        f"%lancefn connect {cp.url}",
        "import os, json\nprint('OUT kernel', os.getpid())",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in head + cells])
    env = dict(os.environ, LANCEFN_API_KEY=cp.api_key, LANCEFN_HOME=str(tmp_path / "unused-home"))
    env.pop("LANCEFN_URL", None)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=env)
    texts = [outputs_text(cell) for cell in nb.cells]
    out: dict[str, object] = {}
    for text in texts:
        for row in text.splitlines():
            if row.startswith("OUT "):
                _, tag, value = row.split(" ", 2)
                out[tag] = json.loads(value)
    out["_texts"] = texts
    return out


def executions(path: Path, kernel_pid: object) -> list[int]:
    """Worker pids that executed the module, in order (the kernel's own execution left out)."""
    if not path.exists():
        return []
    return [int(pid) for pid in path.read_text().split() if int(pid) != kernel_pid]


def report(tag: str, expr: str) -> str:
    return f"print('OUT {tag}', json.dumps({expr}))"


def jobs_and_a_batch(tmp_path: Path, rows: int, *, options: str = "", suffix: str = "", timeout: int = 180) -> list:
    """Cells: six jobs of ``infer<suffix>`` and a batch of ``rows`` rows (chunks of 2, spread over the GPUs) of
    ``chunked<suffix>``; each version logs its module's executions to ``jobs.log`` / ``batch.log`` in ``tmp_path``."""
    infer, chunked = f"infer{suffix}", f"chunked{suffix}"
    batch = f"b = {chunked}.map(range({rows}), chunk_size=2, parallel='auto')\n"
    return [
        COUNTED.format(options=options, path=str(tmp_path / "jobs.log"), name=infer),
        report("jobs", f"[{infer}.submit(i).result() for i in range(6)]"),
        COUNTED.format(options=options, path=str(tmp_path / "batch.log"), name=chunked),
        batch + report("batch", f"b.result(timeout={timeout})"),
    ]


def batch_executions(out: dict, tmp_path: Path, rows: int) -> list[int]:
    """Checks what ``jobs_and_a_batch`` ran (six jobs, one module execution; the batch's results), and returns
    the worker pids that executed the batch's module."""
    assert out["jobs"] == [3 * i for i in range(6)], out["_texts"]
    assert len(executions(tmp_path / "jobs.log", out["kernel"])) == 1  # six jobs, one module execution
    assert out["batch"] == [3 * i for i in range(rows)]
    return executions(tmp_path / "batch.log", out["kernel"])


def test_module_runs_once_per_worker_for_jobs_batches_and_local(control_plane, tmp_path):
    local, per_job = tmp_path / "local.log", tmp_path / "per_job.log"
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            *jobs_and_a_batch(tmp_path, 32),
            COUNTED.format(options="", path=str(local), name="near"),
            report("local", "[near.local(i) for i in range(3)]"),
            COUNTED.format(options=" state=per_job", path=str(per_job), name="fresh"),
            report("per_job", "[fresh.submit(i).result() for i in range(4)]"),
            report("versions", "[infer.version.version, fresh.version.version]"),
        ],
    )
    kernel = out["kernel"]
    chunk_runs = batch_executions(out, tmp_path, 32)
    assert 1 <= len(chunk_runs) <= 2 and len(set(chunk_runs)) == len(chunk_runs)  # 16 chunks, ≤ one per GPU worker
    assert out["local"] == [0, 3, 6] and len(executions(local, kernel)) == 1
    assert out["per_job"] == [0, 3, 6, 9] and len(executions(per_job, kernel)) == 4
    first, second = out["versions"]
    assert first != second


def test_class_entry_setup_once_teardown_on_stop_and_lookup_from_another_kernel(control_plane_factory, tmp_path):
    cp = control_plane_factory()
    setups, teardowns = tmp_path / "setups.log", tmp_path / "teardowns.log"
    out = run_notebook(
        cp,
        tmp_path,
        [
            scaler_cell(tmp_path),
            report("results", "[Scaler.submit(i).result() for i in range(4)]"),
            report("kernel_call", "Scaler(2)"),
            report("card", "Scaler.card()[0]"),
        ],
    )
    kernel = out["kernel"]
    assert out["results"] == [0, 10, 20, 30], out["_texts"]
    assert out["kernel_call"] == 20  # the handle calls a kernel-side instance, set up once in the kernel
    assert "class Scaler" in out["card"] and "setup once per worker" in out["card"]
    workers = executions(setups, kernel)
    assert len(workers) == 1

    (tmp_path / "other").mkdir()
    other = run_notebook(
        cp,
        tmp_path / "other",
        [
            "from lancefn_jupyter import lookup\nS = lookup('Scaler')\n" + report("looked", "[S.submit(5).result()]"),
            report("looked_card", "S.card()[0]"),
        ],
    )
    assert other["looked"] == [50], other["_texts"]
    assert "class Scaler" in other["looked_card"]
    assert executions(setups, kernel) == workers  # the same warm worker served the other kernel's job

    cp.stop()  # the server retires its workers: each one that set up tears down
    assert set(workers) <= set(executions(teardowns, kernel))


def test_failing_setup_fails_in_phase_setup_and_a_batch_fails_fast(control_plane, tmp_path):
    attempts = tmp_path / "attempts.log"
    broken = f"""%%gpu_function num_gpus=1
import os

class Broken:
    def setup(self):
        with open({str(attempts)!r}, "a") as log:
            log.write(f"{{os.getpid()}}\\n")
        raise RuntimeError("weights missing")

    def __call__(self, x: int) -> int:
        return x
"""
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            broken,
            "try:\n    Broken.submit(1).result()\nexcept Exception as e:\n"
            "    print('OUT job', json.dumps([type(e).__name__, getattr(e, 'phase', None), str(e)]))",
            "b = Broken.map(range(20), chunk_size=1, parallel='auto')\nb.wait(timeout=120)\n"
            "print('OUT batch', json.dumps([b.state, sum(1 for c in b._describe().chunks if c.state == 'DONE')]))",
        ],
    )
    kind, phase, message = out["job"]
    assert (kind, phase) == ("RemoteFunctionError", "setup"), out["_texts"]
    assert "weights missing" in message and "cell line" in message
    state, done = out["batch"]
    assert state == "failed" and done == 0
    # one for the job, then for the batch at most one more try after the first failure on each of 2 GPUs
    assert 2 <= len(executions(attempts, out["kernel"])) <= 4


def test_timings_cold_then_warm_and_cancel_replaces_the_worker(control_plane, tmp_path):
    setups = tmp_path / "setups.log"
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            scaler_cell(tmp_path),
            "j1 = Scaler.submit(1); j1.result(); j2 = Scaler.submit(2); j2.result()\n"
            + report("timings", "[j1.timings.to_wire(), j2.timings.to_wire()]"),
            "import time\nheld = Scaler.submit(-1)\n"
            "while held.state != 'running': time.sleep(0.05)\n"
            "held.cancel()\nj3 = Scaler.submit(3)\n" + report("after_cancel", "[j3.result(), j3.timings.cold]"),
        ],
    )
    cold, warm = out["timings"]
    assert cold["cold"] is True and cold.get("setup_ms", 0) > 0, out["_texts"]
    assert warm.get("cold", False) is False and warm.get("setup_ms", 0) == 0 and warm.get("start_ms", 0) == 0
    assert warm.get("run_ms", 0) >= 0
    assert out["after_cancel"] == [30, True]
    assert len(executions(setups, out["kernel"])) == 2  # the cancelled worker was replaced: setup again


def test_bare_calls_run_in_the_worker_and_trial_calls_are_left_out(control_plane, tmp_path):
    cell = """%%gpu_function num_gpus=1
_STATE = {"mode": "train"}
_STATE.update(mode="eval")

def mode(x: int) -> str:
    return _STATE["mode"] + str(x)

mode(1)
"""
    out = run_notebook(control_plane, tmp_path, [cell, report("mode", "[mode.submit(2).result(), mode.card()[0]]")])
    result, card = out["mode"]
    assert result == "eval2", out["_texts"]
    assert "left out: line 8, mode(1)" in card  # notebook lines, the magic line being 1


def test_a_leaking_function_is_retired_past_the_memory_limit(control_plane_factory, tmp_path):
    cp = control_plane_factory(args=["--worker-max-rss-mb", "250"])
    cell = """%%gpu_function num_gpus=1
import os
_HOLD = []

def leak(x: int) -> int:
    _HOLD.append(b"\\x01" * (100 << 20))  # 100 MiB each call, kept on purpose
    return os.getpid()
"""
    out = run_notebook(cp, tmp_path, [cell, report("pids", "[leak.submit(i).result() for i in range(5)]")])
    pids = out["pids"]
    assert len(pids) == 5, out["_texts"]
    assert len(set(pids)) >= 2  # a worker over 250 MB was replaced
    # 100 MiB a call over a worker of well under 100 MiB: past 250 MB by its third call at the latest
    assert max(pids.count(pid) for pid in set(pids)) <= 3


@pytest.mark.ray
def test_ray_actor_keeps_module_state_for_jobs_batches_and_classes(ray_cp, tmp_path):
    setups = tmp_path / "setups.log"
    out = run_notebook(
        ray_cp,
        tmp_path,
        [
            *jobs_and_a_batch(tmp_path, 16, options=" gpu_class=small", suffix="_ray", timeout=240),
            scaler_cell(tmp_path, " gpu_class=small"),
            report("scaler", "[Scaler.submit(i).result() for i in range(3)]"),
        ],
        timeout=400,
    )
    kernel = out["kernel"]
    assert 1 <= len(batch_executions(out, tmp_path, 16)) <= 2
    assert out["scaler"] == [0, 10, 20] and len(executions(setups, kernel)) == 1


EDITED = """%%gpu_function num_gpus=1{options}
import os{extra_import}

class Edited:
    def setup(self):
        with open({setups!r}, "a") as log:
            log.write(f"{{os.getpid()}}\\n")
        self.w, self.calls = {w}, 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return {expr}
"""

KEPT = """%%gpu_function num_gpus=1
import os
with open({loads!r}, "a") as log:
    log.write(f"{{os.getpid()}}\\n")
MODEL = {{"w": 5}}

def kept(x: int) -> int:
    return {expr}
"""


def edit_cells(tmp_path: Path, tag: str, *, w: int = 10, expr: str, extra_import: str = "", options: str = "") -> list:
    """An edit of ``Edited`` and a job of it: ``OUT <tag> [result, timings text, reused from, version]``."""
    cell = EDITED.format(
        options=options, extra_import=extra_import, setups=str(tmp_path / "setups.log"), w=w, expr=expr
    )
    run = (
        "from lancefn_jupyter.kernel.display.timings import timings_text\n"
        "j = Edited.submit(2); value = j.result()\n"
        + report(tag, "[value, timings_text(j.timings), j.timings.setup_reused_from, Edited.version.version]")
    )
    return [cell, run]


def test_edits_outside_setup_keep_the_live_instance_and_a_changed_setup_or_import_gets_a_fresh_one(
    control_plane, tmp_path
):
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            *edit_cells(tmp_path, "e1", expr="x * self.w + self.calls"),
            *edit_cells(tmp_path, "e2", expr="x * self.w + 100 * self.calls"),
            *edit_cells(tmp_path, "e3", expr="-(x * self.w) - self.calls"),
            report("card", "Edited.card()[0]"),
            *edit_cells(tmp_path, "s1", w=7, expr="-(x * self.w) - self.calls"),  # setup edited: a new setup
            *edit_cells(tmp_path, "i1", w=7, expr="-(x * self.w) - self.calls", extra_import=", json"),
            *edit_cells(tmp_path, "n1", w=7, expr="x * self.w", options=" reuse_setup=no"),
            KEPT.format(loads=str(tmp_path / "loads.log"), expr="x * MODEL['w']"),
            report("k1", "[kept(2), kept.submit(3).result()]"),
            KEPT.format(loads=str(tmp_path / "loads.log"), expr="x * MODEL['w'] + 1"),
            report("k2", "kept.submit(3).result()"),
        ],
    )
    kernel = out["kernel"]
    assert "e1" in out, out["_texts"]
    e1, e2, e3 = out["e1"], out["e2"], out["e3"]
    assert [e1[0], e2[0], e3[0]] == [21, 220, -23], out["_texts"]  # the instance's calls count on: 1, 2, 3
    assert e1[2] is None and e2[2] == e1[3] and e3[2] == e2[3]
    assert e2[1].startswith(f"setup reused from @{e1[3][:6]}")
    assert (
        "setup       module statements, Edited.setup (edits elsewhere" in out["card"]
    )  # the card names the setup part
    assert out["s1"][0] == -15 and out["s1"][2] is None  # setup edited: a fresh instance (calls from 0)
    assert out["i1"][0] == -15 and out["i1"][2] is None  # an import added: a fresh module
    assert out["n1"][0] == 14 and out["n1"][2] is None  # reuse_setup=no
    setups = executions(tmp_path / "setups.log", kernel)
    assert len(setups) == 4, setups  # e1 (e2, e3 reused it), s1, i1, n1
    assert out["k1"] == [10, 15] and out["k2"] == 16
    assert len(executions(tmp_path / "loads.log", kernel)) == 1  # the module-level model kept across the edit


RANKER = """%%gpu_function num_gpus=1
class Ranker:
    def setup(self):
        self.weights = [1, 2, 3]

    def __call__(self, i: int) -> int:
        picked = i * 2
        return self.weights[picked]
"""


def test_a_failing_row_is_stepped_into_with_job_debug_and_its_remote_locals_shown(control_plane, tmp_path):
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            RANKER,
            "job = Ranker.submit(2)\ntry:\n    job.result()\nexcept Exception as e:\n"
            "    print('OUT error', json.dumps(str(e)))",
            report("frames", "[[f.function, f.locals] for f in job.failure.frames]"),
            report("rows", "job.failure.rows"),
            "job.debug(commands=['p picked + 100', 'p self.weights', 'q'])",
        ],
    )
    assert "IndexError" in out["error"] and "Remote locals" in out["error"], out["_texts"]
    assert "picked = 4" in out["error"]
    function, local = out["frames"][-1]
    assert function == "__call__" and local["picked"] == "4" and local["i"] == "2"
    assert local["self"].startswith("<__gpu_function__.Ranker object")
    assert out["rows"] == [{"i": 2}]
    debugged = out["_texts"][-1]
    assert "the row fails here too" in debugged and "104" in debugged and "[1, 2, 3]" in debugged, debugged


@pytest.mark.ray
def test_on_ray_edits_outside_setup_keep_the_live_actor_and_a_failing_row_keeps_its_rows_and_frames(ray_cp, tmp_path):
    options = " gpu_class=small"
    out = run_notebook(
        ray_cp,
        tmp_path,
        [
            *edit_cells(tmp_path, "e1", expr="x * self.w + self.calls", options=options),
            *edit_cells(tmp_path, "e2", expr="x * self.w + 100 * self.calls", options=options),
            *edit_cells(tmp_path, "e3", expr="-(x * self.w) - self.calls", options=options),
            *edit_cells(tmp_path, "s1", w=7, expr="-(x * self.w) - self.calls", options=options),
            RANKER.replace("num_gpus=1", "num_gpus=1" + options),
            "job = Ranker.submit(2)\ntry:\n    job.result()\nexcept Exception as e:\n"
            "    print('OUT error', json.dumps(str(e)))",
            report("failure", "[job.failure.failing_rows, job.failure.rows]"),
            report("frames", "[[f.function, f.locals] for f in job.failure.frames]"),
            f"%%gpu_function num_gpus=1{options}\ndef noisy(x: int) -> int:\n    print(f'row {{x}}')\n    return x\n",
            report("row_logs", "noisy.map([5, 6, 7]).wait().logs(row=1)"),
        ],
        timeout=400,
    )
    assert "e1" in out, out["_texts"]
    e1, e2, e3 = out["e1"], out["e2"], out["e3"]
    assert [e1[0], e2[0], e3[0]] == [21, 220, -23], out["_texts"]  # one live instance: its calls count on
    assert e1[2] is None and e2[2] == e1[3] and e3[2] == e2[3]
    assert e2[1].startswith(f"setup reused from @{e1[3][:6]}")
    assert out["s1"][0] == -15 and out["s1"][2] is None  # setup edited: a fresh actor
    assert len(executions(tmp_path / "setups.log", out["kernel"])) == 2  # e1 (e2, e3 reused it), s1
    # Debugging a failure: the same on Ray as on the local executor.
    assert "IndexError" in out["error"] and "picked = 4" in out["error"], out["_texts"]
    assert out["failure"] == [[0, 1], [{"i": 2}]]
    function, local = out["frames"][-1]
    assert function == "__call__" and local["picked"] == "4" and local["i"] == "2"
    assert out["row_logs"] == "row 6"  # a Ray actor's prints carry their row too
