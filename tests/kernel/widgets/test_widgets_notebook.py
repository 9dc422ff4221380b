"""Widgets in a real kernel: nbclient runs a notebook that submits three jobs onto two simulated GPUs.

The notebook's saved widget state (`metadata.widgets` → `application/vnd.jupyter.widget-state+json`,
what nbconvert/GitHub render without a kernel) must show a pending job with its queue position while
the GPUs are busy, and at the end every job finished with its progress bar at 100 %. The updates
come from the kernel's background listener thread; nbclient records them because they carry the
executing cell's parent header. Jobs wait for files a notebook cell creates, so nothing depends on
timing; in-kernel waits are bounded loops. A second kernel (what a restart gives) then shows the same
jobs again through `%gpu_jobs` and `Job.attach(job_id)`.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"

WAIT_STATES = """\
import time
from lancefn_jupyter.kernel.widgets import job_widget
views = [job_widget(job) for job in jobs]
deadline = time.monotonic() + 60
while sorted(v.state for v in views) != {expected!r} and time.monotonic() < deadline:
    time.sleep(0.01)
print([v.state for v in views])
"""


def _cells(url: str, gate_dir: Path) -> list[str]:
    return [
        f"%load_ext lancefn_jupyter\n%lancefn connect {url}",
        (
            "%%gpu_function num_gpus=1\n"
            "def wait_for_file(path: str) -> str:\n"
            "    import os, time\n"
            "    while not os.path.exists(path):\n"
            "        time.sleep(0.01)\n"
            "    return path\n"
        ),
        (
            "from IPython.display import display\n"
            f"gates = [{str(gate_dir)!r} + f'/gate-{{i}}' for i in range(3)]\n"
            "jobs = [wait_for_file.submit(gate) for gate in gates]  # 3 jobs, 2 simulated GPUs\n"
            "for job in jobs:\n"
            "    display(job)\n"
        ),
        WAIT_STATES.format(expected=["pending", "running", "running"]),
        (
            "import pathlib\n"
            "for gate in gates:\n"
            "    pathlib.Path(gate).touch()\n"
            "print([job.wait(60).state for job in jobs])\n"
        )
        + WAIT_STATES.format(expected=["finished", "finished", "finished"]),
        "%gpu_jobs",
    ]


class WidgetState:
    """Reads a saved widget state: models by id, and each job widget's descendants."""

    def __init__(self, state: dict):
        self.models = state

    def _children(self, model_id: str) -> list[str]:
        children = self.models.get(model_id, {}).get("state", {}).get("children", [])
        return [child.removeprefix("IPY_MODEL_") for child in children]

    def descendants(self, model_id: str) -> list[dict]:
        out, todo = [], list(self._children(model_id))
        while todo:
            child = todo.pop(0)
            model = self.models.get(child)
            if model is not None:
                out.append(model)
                todo.extend(self._children(child))
        return out

    def boxes(self, dom_class: str) -> list[str]:
        return [mid for mid, m in self.models.items() if dom_class in m.get("state", {}).get("_dom_classes", [])]

    def job_widgets(self) -> list[dict]:
        """Per job widget: its HTML values, progress (value, max) and label texts."""
        found = []
        for box in self.boxes("lancefn-job-widget"):
            parts = self.descendants(box)
            html = [m["state"].get("value", "") for m in parts if m["model_name"] == "HTMLModel"]
            bars = [
                (m["state"].get("value", 0), m["state"].get("max", 100))
                for m in parts
                if m["model_name"] == "IntProgressModel"
            ]
            labels = [m["state"].get("value", "") for m in parts if m["model_name"] == "LabelModel"]
            found.append({"html": " ".join(html), "progress": bars[0], "label": labels[0]})
        return found


def test_notebook_widget_state_shows_queue_position_then_all_finished_and_again_after_restart(control_plane, tmp_path):
    cp = control_plane  # the default class: 2 simulated GPUs
    gate_dir = tmp_path / "gates"
    gate_dir.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in _cells(cp.url, gate_dir)])
    env = dict(os.environ, LANCEFN_API_KEY=cp.api_key, LANCEFN_HOME=str(tmp_path / "unused-home"))
    env.pop("LANCEFN_URL", None)
    env.pop("LANCEFN_WIDGETS", None)
    client = NotebookClient(
        nb,
        timeout=180,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    with client.setup_kernel(env=env):
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
            if index == 3:  # GPUs busy, one job waiting: save the notebook's widget state as it is now
                client.set_widgets_metadata()
                busy = copy.deepcopy(nb.metadata["widgets"][WIDGET_STATE])
        client.set_widgets_metadata()
    final = nb.metadata["widgets"][WIDGET_STATE]
    ARTIFACTS.mkdir(exist_ok=True)
    nbformat.write(nb, str(ARTIFACTS / "widgets_notebook.ipynb"))

    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    # Every job display is the widget view plus text and HTML fallbacks.
    job_outputs = [o for o in nb.cells[2].outputs if o.get("output_type") == "display_data"]
    assert len(job_outputs) == 3
    for output in job_outputs:
        assert {"application/vnd.jupyter.widget-view+json", "text/plain", "text/html"} <= set(output["data"])
    assert nb.cells[3].outputs[0]["text"].strip() == "['running', 'running', 'pending']"

    # While the GPUs were busy: two running, one pending with its place in the queue.
    during = WidgetState(busy["state"]).job_widgets()
    assert len(during) == 3
    pending = [w for w in during if "lancefn-state-pending" in w["html"]]
    running = [w for w in during if "lancefn-state-running" in w["html"]]
    assert len(pending) == 1 and len(running) == 2
    assert "waiting for GPU capacity in class default, position 1" in pending[0]["html"]
    assert pending[0]["progress"] == (0, 1) and pending[0]["label"] == "0/1 rows (0%)"
    assert all("running on default [sim" in w["html"] for w in running)

    # At the end: every job finished, progress at 100 %.
    after = WidgetState(final["state"]).job_widgets()
    assert len(after) == 3
    for widget in after:
        assert "lancefn-state-finished" in widget["html"] and "lancefn-state-pending" not in widget["html"]
        assert widget["progress"] == (1, 1) and widget["label"] == "1/1 rows (100%)"
    assert "['finished', 'finished', 'finished']" in nb.cells[4].outputs[-1]["text"]

    # The dashboard (%gpu_jobs) was saved too: three finished rows, and a text fallback for GitHub.
    state = WidgetState(final["state"])
    (dashboard,) = state.boxes("lancefn-jobs-dashboard")
    values = [m["state"].get("value") for m in state.descendants(dashboard)]
    badges = [v for v in values if isinstance(v, str) and "lancefn-state-" in v]
    assert len(badges) == 3 and all("lancefn-state-finished" in b for b in badges)
    dashboard_output = nb.cells[5].outputs[0]["data"]
    assert dashboard_output["text/plain"].count("finished") == 3
    json.dumps(final)  # the saved state is plain JSON

    # After a kernel restart (a new kernel process): `%gpu_jobs` and `Job.attach` show the jobs again.
    job_id = re.search(r"<code title='([0-9a-f]+)'>", after[0]["html"]).group(1)
    again = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(src)
            for src in (
                f"%load_ext lancefn_jupyter\n%lancefn connect {cp.url}",
                "%gpu_jobs",
                f"from lancefn_jupyter import Job\nJob.attach({job_id!r})",
            )
        ]
    )
    NotebookClient(
        again,
        timeout=180,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute(env=env)
    state = WidgetState(again.metadata["widgets"][WIDGET_STATE]["state"])
    (dashboard,) = state.boxes("lancefn-jobs-dashboard")
    values = [m["state"].get("value") for m in state.descendants(dashboard)]
    assert sum(isinstance(v, str) and "lancefn-state-finished" in v for v in values) == 3
    (attached,) = state.job_widgets()
    assert job_id in attached["html"] and "lancefn-state-finished" in attached["html"]
    assert attached["progress"] == (1, 1)
