"""The tutorials in notebooks/ run top to bottom in a real kernel and show what their prose says.

Each tutorial is executed with nbclient the way a reader runs it on a laptop with no GPU: a fresh
kernel with ``NUMBA_ENABLE_CUDASIM=1`` in its environment, its own ``LANCEFN_HOME`` (so the embedded
control plane it starts is its own), and no ``LANCEFN_URL``.  Cells whose outputs are asserted carry
a ``check-…`` tag in their metadata; cells that fail on purpose carry ``raises-exception`` (which
nbclient and JupyterLab's Run All both honour).  Every control plane a tutorial started, embedded or
its own ``lancefn-server``, is stopped at teardown even when the notebook failed half-way.

The notebooks are committed without outputs; ``test_notebooks_are_committed_without_outputs`` keeps
it that way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from helpers import outputs_text
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
TUTORIALS = (
    "01-quickstart.ipynb",
    "02-gpu-classes-and-capacity.ipynb",
    "03-numba-cuda-locally.ipynb",
    "04-profiles-and-remote.ipynb",
    "05-batches-and-tables.ipynb",
    "06-embeddings-into-lancedb.ipynb",
    "07-lancedb-client-and-secrets.ipynb",
    "08-edit-keep-the-model.ipynb",
)
CELL_TIMEOUT_S = 240


def _output_text(output: dict) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return output["text"]
    if kind == "error":
        return f"{output['ename']}: {output['evalue']}"
    data = output.get("data", {})
    return "\n".join(str(data[mime]) for mime in ("text/plain", "text/html") if mime in data)


@dataclass
class Executed:
    """An executed tutorial: outputs by tag, and all of its outputs for leak checks."""

    name: str
    nb: nbformat.NotebookNode
    tmp: Path  # the kernel's TMPDIR

    def cell(self, tag: str) -> nbformat.NotebookNode:
        cells = [c for c in self.nb.cells if tag in c.get("metadata", {}).get("tags", [])]
        assert len(cells) == 1, f"{self.name}: expected one cell tagged {tag!r}, found {len(cells)}"
        return cells[0]

    def text(self, tag: str) -> str:
        """The cell's stream output and text/plain results (what a reader sees as text; a print() a busy kernel
        flushed in pieces, rejoined)."""
        return outputs_text(self.cell(tag))

    def all_outputs(self) -> str:
        return "\n".join(_output_text(o) for c in self.nb.cells for o in c.get("outputs", []))

    def errors_outside(self, allowed_tag: str = "raises-exception") -> list[str]:
        return [
            _output_text(o)
            for c in self.nb.cells
            if allowed_tag not in c.get("metadata", {}).get("tags", [])
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]


def tutorial_env(tmp_path: Path) -> dict[str, str]:
    """A reader's laptop: no control plane configured, no GPU, the simulator on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANCEFN_")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env.update(
        NUMBA_ENABLE_CUDASIM="1",
        LANCEFN_HOME=str(tmp_path / "lancefn-home"),
        LANCEFN_DISABLE_NVML="1",  # the simulated default class even on a machine with GPUs
        TMPDIR=str(tmp_path / "tmp"),  # tutorials' own temp dirs land here, so teardown finds them
    )
    return env


def stop_control_planes(root: Path) -> None:
    """Stop every control plane whose home is under ``root`` (embedded or started by a notebook)."""
    from lancefn_jupyter.embedded import stop_server

    for server_json in root.rglob("server.json"):
        stop_server(server_json.parent)


@pytest.fixture
def run_tutorial(tmp_path):
    def run(name: str) -> Executed:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        client = NotebookClient(
            nb,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOKS)}},  # Jupyter runs a notebook in its folder
        )
        client.execute(env=tutorial_env(tmp_path))  # raises on any error in an untagged cell
        executed = Executed(name, nb, tmp_path / "tmp")
        assert executed.errors_outside() == []
        assert not list(executed.tmp.glob("lancefn-tutorial-*")), "the tutorial removes the directories it made"
        return executed

    yield run
    stop_control_planes(tmp_path)


# ------------------------------------------------------------------------------------ the tutorials


def test_01_quickstart(run_tutorial):
    nb = run_tutorial("01-quickstart.ipynb")

    assert "[embedded (local)]" in nb.text("check-connection")
    assert "status: ok" in nb.text("check-connection")
    classes = nb.text("check-classes")
    assert "default" in classes and "Simulated GPU (numba CUDA simulator)" in classes
    assert "(simulated)" not in classes  # the model already says it

    first = re.search(r"registered version: ([0-9a-f]{16})\b", nb.text("check-version"))
    assert first, nb.text("check-version")
    first = first.group(1)
    card = nb.text("check-register")
    assert "GPU function double_all" in card and first in card and "1 GPU of class default" in card

    result = nb.text("check-result")
    assert "state: finished" in result
    assert "result: array([2., 4.], dtype=float32)" in result
    assert "results: [[2.0], [4.0, 6.0]]" in nb.text("check-map")

    same = nb.text("check-same-version")
    assert f"version now: {first}" in same and "same version as before: True" in same

    changed = nb.text("check-new-version")
    assert "new version: True" in changed
    second = re.search(r"version now: ([0-9a-f]{16})\b", changed).group(1)
    assert second != first

    versions = nb.text("check-versions")
    assert first in versions and second in versions
    assert "double_all: 2 versions" in versions  # unchanged re-run registered nothing new
    assert "code: 2 lines" in versions and f"lancefn_jupyter.lookup('double_all@{second[:8]}')" in versions
    diff = nb.text("check-diff")
    assert f"{first} → {second}" in diff and "+    x = np.asarray(values, dtype=np.float64)" in diff

    local = nb.text("check-local")
    assert "double_all.local() ran on CUDA simulator" in local
    assert "array([2., 4.])" in local  # the float64 version registered last


def test_02_gpu_classes_and_capacity(run_tutorial):
    nb = run_tutorial("02-gpu-classes-and-capacity.ipynb")

    classes = nb.text("check-classes")
    for expected in ("l4", "h100", "NVIDIA L4 (simulated)", "24 GiB", "NVIDIA H100 80GB HBM3", "80 GiB"):
        assert expected in classes, expected

    # Three jobs on a one-GPU class: one placed, two pending in FIFO order.
    pending = nb.text("check-pending").splitlines()
    assert len(pending) == 3, pending
    assert "devices ['sim0']" in pending[0]
    assert "pending" in pending[1] and "queue position 1" in pending[1]
    assert "pending" in pending[2] and "queue position 2" in pending[2]

    # The class table's live columns moved: the l4 row now shows its busy GPU and waiting jobs.
    def l4_row(tag: str) -> str:
        return next(line for line in nb.text(tag).splitlines() if line.startswith("l4 "))

    assert l4_row("check-busy") != l4_row("check-classes")

    cancel = nb.text("check-cancel")
    assert "third job: cancelled" in cancel
    assert "finished, result 1.0" in cancel and "finished, result 4.0" in cancel

    h100 = nb.text("check-h100")
    assert "result: 16.0" in h100
    assert "ran on class h100 with 2 GPUs: ['sim0', 'sim1']" in h100

    # IPython shows a UsageError as a short message (a stderr stream), not as a traceback.
    error = nb.text("check-over-limit")
    assert "UsageError: %%gpu_function: registration failed" in error
    assert "num_gpus=2 exceeds GPU class 'l4'" in error
    assert "max_gpu_count_per_worker of 1" in error
    assert "h100: 2" in error  # names the other classes' limits

    # It cleaned up after itself: its control plane is stopped (and its directory removed: see run_tutorial).
    assert "embedded control plane stopped" in nb.all_outputs()


def test_03_numba_cuda_locally(run_tutorial):
    nb = run_tutorial("03-numba-cuda-locally.ipynb")

    local = nb.text("check-local")
    assert "saxpy_total.local() ran on CUDA simulator" in local
    got, expected = re.search(r"local: ([\d.]+)\s+expected: ([\d.]+)", local).groups()
    assert float(got) == float(expected) == 65536.0
    assert "job: 65536.0" in nb.text("check-remote")

    warp = nb.text("check-warp")
    assert "warp_sum.local() failed in phase run" in warp
    assert "shfl_down_sync" in warp
    assert "cell line 11, in _warp_sum" in warp  # mapped to the notebook cell's own line

    bounds = nb.text("check-bounds")
    assert "IndexError" in bounds and "out of bounds" in bounds
    assert "cell line 9, in _double_unguarded" in bounds


def test_04_profiles_and_remote(run_tutorial):
    nb = run_tutorial("04-profiles-and-remote.ipynb")

    assert "profile 'small' defined" in nb.text("check-profile")
    assert "2 GPUs of class default" in nb.text("check-override")
    values = json.loads(nb.text("check-standardize").strip())
    assert values == pytest.approx([-1.224744871391589, 0.0, 1.224744871391589])

    # env values reach the function but are never shown back.
    assert "env: API_TOKEN, GREETING" in nb.text("check-env-card")
    assert "hello, notebook! (API_TOKEN is set)" in nb.text("check-env-job")
    assert "tutorial-not-a-secret" not in nb.all_outputs()

    # pip= packages are built for the version (uv, layered over the control plane's packages).
    built = nb.text("check-built")
    assert "x²" in built and "waited for the environment:" in built, built
    # The table's rows (after the environment's build lines, when this cell waited for its build, and the header)
    table = [line.split() for line in built.splitlines() if line.strip() and not line.startswith("[env]")]
    assert table[2:5] == [["1", "1"], ["2", "4"], ["3", "9"]], built
    environment = nb.text("check-environment")
    assert "failed in phase: environment" in environment
    assert "lancefn-tutorial-no-such-package" in environment and "uv could not build" in environment, environment

    runtime = json.loads(nb.text("check-conda").strip())
    assert runtime["environment"] == {
        "channels": ["conda-forge"],
        "kind": "conda",
        "packages": ["cuda-version=12", "numba"],
    }
    assert runtime["resources"] == {"gpu_class": "default", "num_gpus": 1}

    connect = nb.text("check-connect")
    assert "[remote]" in connect and "status: ok" in connect
    assert "a100" in nb.text("check-remote-classes")
    assert "result from the shared control plane: 42.0" in nb.text("check-remote-job")
    assert "lancefn-server stopped with exit code 0" in nb.all_outputs()


def test_05_batches_and_tables(run_tutorial):
    nb = run_tutorial("05-batches-and-tables.ipynb")

    assert "slow_square" in nb.text("check-register")
    assert "Batch " in nb.text("check-batch")
    result = nb.text("check-result")
    assert "first five: [0.0, 1.0, 4.0, 9.0, 16.0] rows: 24" in result and "24/24 rows (100%)" in result
    assert "array([ 0.,  1.,  4.,  9., 16., 25.])" in nb.text("check-numpy")
    assert "rows received: True" in nb.text("check-as-completed")
    failure = nb.text("check-failure")
    assert "chunk 2 (rows 6–8) failed in phase run: ValueError: 7 needs the fix file" in failure
    assert "3 of 4 chunks finished" in failure and "cell line 6, in fragile" in failure
    assert "after retry: [100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]" in nb.text("check-retry")
    backfill = nb.text("check-backfill")
    assert "300/300 rows written" in backfill
    assert "rows: 300 | still empty: 0 | same as a plain loop: True" in backfill
    assert "0/0 rows written" in nb.text("check-backfill-again")


def test_06_embeddings_into_lancedb(run_tutorial):
    nb = run_tutorial("06-embeddings-into-lancedb.ipynb")

    assert "Embed" in nb.text("check-register") and "batched" in nb.text("check-register")
    assert "Batch " in nb.text("check-backfill-widget")
    backfill = nb.text("check-backfill")
    assert "backfill of 'embedding': 200/200 rows written" in backfill
    assert "embedding column: fixed_size_list<item: float>[16]" in backfill
    assert "rows still empty: 0" in backfill and "attached by id: 200 rows written" in backfill
    hits = nb.text("check-search").splitlines()
    assert len(hits) == 3 and all(hit.startswith("gpus | ") for hit in hits), hits
    assert "baking rows done: 2 | still empty: 3" in nb.text("check-where")
    skip = nb.text("check-skip")
    assert "2/3 rows written · 1 row skipped" in skip
    assert "skipped id 203 (fragment 1, offset 3): " in skip and "empty text: nothing to embed" in skip
    assert "still empty: [203]" in skip


def test_07_lancedb_client_and_secrets(run_tutorial):
    nb = run_tutorial("07-lancedb-client-and-secrets.ipynb")

    assert "against the embedded control plane: True" in nb.text("check-connect")
    assert "secrets: ['api_token']" in nb.text("check-secret")
    assert "described: api_token (created at" in nb.text("check-secret")
    udf_text = nb.text("check-udf")
    assert "registered Scale version 1" in udf_text and "initialization: ['factor', 'offset']" in udf_text
    assert "bound secrets: ['api_token']" in udf_text
    run = nb.text("check-run")
    assert "factor 3: 6.0" in run and "factor 10, offset 0.5: [10.5, 20.5, 30.5]" in run
    assert "api_token as API_TOKEN" in nb.text("check-cell")
    edited = nb.text("check-edited")
    assert "lancedb version: 2" in edited and "result: 6.0" in edited
    assert "paused: True | state: paused | lancedb sees: PAUSED" in nb.text("check-pause")
    resume = nb.text("check-resume")
    assert "resumed: True" in resume and "results: [0.0, 2.0, 4.0, 6.0" in resume
    assert "tok-0000-demo-4321" not in nb.all_outputs()  # the secret's value is nowhere in the notebook's outputs


def test_08_edit_keep_the_model(run_tutorial):
    nb = run_tutorial("08-edit-keep-the-model.ipynb")

    assert "setup       module statements, Scorer.setup (edits elsewhere keep the worker)" in nb.text("check-register")
    first = nb.text("check-first")
    assert "result: 20.0" in first and "reused from: None" in first and "setup: 0 ms" not in first
    versions = [re.search(r"version: ([0-9a-f]{16})", first).group(1)]
    # Three edits of __call__, one setup: each runs on the instance setup() made (its call count goes on).
    for run, result, calls in (("check-run-1", "20.0", 2), ("check-run-2", "100.0", 3), ("check-run-3", "400.0", 4)):
        text = nb.text(run)
        found = re.search(r"version: ([0-9a-f]{16})", text)
        assert found is not None, text
        version = found.group(1)
        assert version not in versions, text  # each edit is a version of its own
        assert f"result: {result}" in text and f"printed: call {calls}:" in text, text
        assert f"setup: 0 ms | reused from: {versions[-1]}" in text, text
        versions.append(version)

    failure = nb.text("check-failure")
    assert "IndexError: list index out of range" in failure and "Remote locals" in failure
    assert "nxt = 4" in failure and "x = 3" in failure
    frames = nb.text("check-frames")
    assert "failing row: [{'x': 3}]" in frames and "'nxt': '4'" in frames
    debugged = nb.text("check-debug")
    assert "the row fails here too" in debugged and "stepping into it in this kernel" in debugged
    assert debugged.rstrip().splitlines()[-2:] == ["4", "4"]  # the scripted `p nxt`, `p len(self.weights)`


def test_headless_quickstart_prints_a_version_and_a_finished_job(tmp_path):
    """README: `scripts/quickstart.sh --headless` runs scripts/run_notebook.py on the quickstart."""
    env = tutorial_env(tmp_path)
    try:
        proc = subprocess.run(
            [sys.executable, "scripts/run_notebook.py", "notebooks/01-quickstart.ipynb"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        stop_control_planes(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"registered version: [0-9a-f]{16}", proc.stdout), proc.stdout
    assert "state: finished" in proc.stdout and "result: array([2., 4.], dtype=float32)" in proc.stdout
    assert "notebooks/01-quickstart.ipynb: all cells ran" in proc.stdout


# ------------------------------------------------------------------------------------ the files


def test_every_tutorial_is_executed_by_this_suite():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(TUTORIALS)


@pytest.mark.parametrize("name", TUTORIALS)
def test_notebooks_are_committed_without_outputs(name):
    """Outputs are stripped in git: no outputs, no execution counts, no widget state, valid nbformat."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name} cell {index} has outputs; clear them before committing"
            assert cell.execution_count is None, f"{name} cell {index} has an execution count"
        assert "execution" not in cell.metadata, f"{name} cell {index} has execution timing metadata"
    assert set(nb.metadata) <= {"kernelspec", "language_info"}, (
        f"{name}: unexpected notebook metadata {set(nb.metadata)}"
    )
    assert nb.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("name", TUTORIALS)
def test_tutorials_read_top_to_bottom(name):
    """A title first, prose between the code, and no intentional error without its tag."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), f"{name}: start with a title"
    kinds = [cell.cell_type for cell in nb.cells]
    assert kinds.count("markdown") * 2 >= kinds.count("code"), f"{name}: too little prose between the cells"
    longest_code_run = max(len(run) for run in "".join("c" if k == "code" else " " for k in kinds).split())
    assert longest_code_run <= 3, f"{name}: more than three code cells in a row without prose"
