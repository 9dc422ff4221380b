"""Remakes the docs' images from a real session, so they can be made again whenever the front ends change.

A control plane (the simulated `default` class, 2 GPUs) and JupyterLab with the built side panel, driven in headless
Debian Chromium as the browser tests drive it (tests/browser_util.py): a notebook registers a function, submits a job
that holds both GPUs for ten minutes and one that waits
behind it (both cancelled at the end), and lists them with `%gpu_jobs`; the GPU Functions panel is open.

    PYTHONPATH=$PWD .venv/bin/python scripts/make_images.py     # writes docs/images/panel.png and widgets.png

Needs the test extra (playwright) and /usr/bin/chromium, as the browser tests do.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the browser tests' helpers start the session

from browser_util import (  # noqa: E402
    browser_page,
    jupyter_with_control_plane,
    launch_chromium,
    notebook,
    open_lab,
    run_command,
)

IMAGES = REPO / "docs" / "images"
PANEL_IMAGE = "panel.png"  # README's screenshot; the user guide's side panel
WIDGETS_IMAGE = "widgets.png"  # the user guide's notebook widgets


CELLS = [
    "%load_ext lancefn_jupyter\n%gpu_classes",
    "%%gpu_function num_gpus=2\n"
    "import time\n\n"
    "def embed_documents(seconds: float) -> float:\n"
    "    time.sleep(seconds)  # stands in for a model's work\n"
    "    return seconds",
    "running = embed_documents.submit(600.0)\nrunning",
    "queued = embed_documents.submit(600.0)  # waits for the two GPUs\nqueued",
    "%gpu_jobs",
]


def main() -> None:
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lancefn-images-") as tmp:
        base = Path(tmp)
        with jupyter_with_control_plane(base, "lab") as (cp, server), sync_playwright() as p:
            (server.root_dir / "quickstart.ipynb").write_text(json.dumps(notebook(CELLS)))
            browser = launch_chromium(p)
            try:
                with browser_page(browser, timeout_ms=90_000, height=860) as page:
                    open_lab(page, server, path="quickstart.ipynb", workspace="images")
                    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=120_000)
                    run_command(page, "Run All Cells")
                    page.locator(".lancefn-jobs-summary", has_text="1 pending").first.wait_for(timeout=120_000)
                    run_command(page, "Open GPU Functions Panel")
                    page.locator('#lancefn-gpu-functions .lf-job[data-state="pending"]').wait_for()
                    page.locator("#lancefn-gpu-functions .lf-job-queue", has_text="position 1").wait_for()
                    page.wait_for_timeout(500)  # the last paint of the widgets' fonts
                    page.screenshot(path=str(IMAGES / PANEL_IMAGE))
                    page.locator('.lm-TabBar-tab[data-id="lancefn-gpu-functions"]').click()  # folds the sidebar
                    # From the first submit down: the job widgets and the %gpu_jobs dashboard.
                    page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(2).evaluate(
                        "cell => cell.scrollIntoView({block: 'start'})"
                    )
                    page.locator(".lancefn-jobs-dashboard:visible").first.wait_for()
                    page.wait_for_timeout(500)
                    page.locator(".jp-NotebookPanel:visible .jp-WindowedPanel-outer").first.screenshot(
                        path=str(IMAGES / WIDGETS_IMAGE)
                    )
            finally:
                browser.close()
                with cp.http() as http:
                    for job in http.post("/v1/jobs/list", json={}).json().get("jobs", []):
                        http.post("/v1/jobs/cancel", json={"job_id": job["job_id"]})
    print(f"wrote {IMAGES / PANEL_IMAGE} and {IMAGES / WIDGETS_IMAGE}")


if __name__ == "__main__":
    main()
