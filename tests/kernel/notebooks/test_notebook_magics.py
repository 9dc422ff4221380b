"""A tutorial-style notebook using the magics, executed by a real kernel (nbclient) against a real server."""

from __future__ import annotations

import os

import nbformat
from helpers import outputs_text
from nbclient import NotebookClient


def test_magics_notebook_runs_top_to_bottom(control_plane, tmp_path):
    cp = control_plane
    cells = [
        "%load_ext lancefn_jupyter",
        f"%lancefn connect {cp.url}",
        "%gpu_classes",
        ("%%gpu_function num_gpus=1\ndef normalize_score(value: float) -> float:\n    return value / 100.0\n"),
        "print(normalize_score(42.0), normalize_score.version.version)",
        "%gpu_versions",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    env = dict(os.environ, LANCEFN_API_KEY=cp.api_key, LANCEFN_HOME=str(tmp_path / "unused-home"))
    env.pop("LANCEFN_URL", None)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute(env=env)

    texts = [outputs_text(cell) for cell in nb.cells]
    assert "remote" in texts[1] and cp.url in texts[1]
    assert "default" in texts[2] and "Simulated GPU (numba CUDA simulator)" in texts[2]
    assert "(simulated)" not in texts[2]  # the model already says it
    assert "GPU function normalize_score" in texts[3] and "python_v2" in texts[3]
    value, version = texts[4].split()
    assert value == "0.42"
    assert version in texts[3] and version in texts[5]
    assert cp.api_key not in "".join(texts)
