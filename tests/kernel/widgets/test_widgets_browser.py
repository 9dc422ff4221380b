"""The job widgets in a real JupyterLab, in headless Debian Chromium (Playwright, never `playwright install`).

A notebook submits five jobs onto the two simulated GPUs and then keeps its kernel busy in a loop of
`time.sleep` (until the test lets it go). While that cell runs, the test releases jobs by creating
files and watches the DOM: a pending job's badge (with its queue position) turns into running and
then finished, which only the kernel's background listener thread can cause. Once the kernel is
idle again the test clicks a pending job's Cancel button and sees it cancelled (button callbacks
need an idle kernel; the side panel covers the busy case). Screenshots go to test-artifacts/.

Helpers to start `jupyter lab --allow-root` and Chromium come from `tests/browser_util.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_util import (
    WAIT_FOR_FILE_CELL,
    browser_page,
    chromium_missing_reason,
    jupyter_with_control_plane,
    notebook,
    screenshot,
)
from helpers import wait_until

_missing = chromium_missing_reason()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing is not None, reason=_missing or "")]

TIMEOUT_MS = 60_000
BUSY_CELL = 5  # the cell that keeps the kernel busy


def _notebook(tmp: Path) -> dict:
    gates = {name: str(tmp / f"gate-{name}") for name in "abcde"}
    cells = [
        "%load_ext lancefn_jupyter\n%lancefn",
        WAIT_FOR_FILE_CELL,
        (
            "import json\n"
            f"gates = {json.dumps(gates)}\n"
            "blockers = [wait_for_file.submit(gates['a']), wait_for_file.submit(gates['b'])]  # both GPUs busy\n"
            "watched = wait_for_file.submit(gates['c'])   # pending, position 1\n"
            "follower = wait_for_file.submit(gates['d'])  # pending, position 2; takes the GPU the watched job frees\n"
            "victim = wait_for_file.submit(gates['e'])    # pending, position 3: cancelled from its widget\n"
            "jobs = blockers + [watched, follower, victim]\n"
            f"json.dump({{name: job.job_id for name, job in zip('abcde', jobs)}}, open({str(tmp / 'ids.json')!r}, 'w'))\n"
            "display(watched)\n"
            "display(victim)\n"
        ),
        "%gpu_classes",
        "%gpu_jobs",
        (
            "import os, time\n"
            f"open({str(tmp / 'busy')!r}, 'w').close()\n"
            f"while not os.path.exists({str(tmp / 'release')!r}):  # the kernel stays busy in this cell\n"
            "    time.sleep(0.05)\n"
            "print('released')\n"
        ),
    ]
    return notebook(cells)


@pytest.fixture
def lab(tmp_path) -> Iterator[tuple]:
    with jupyter_with_control_plane(tmp_path, "lab") as servers:
        yield servers


@pytest.fixture
def page(browser):
    with browser_page(browser, timeout_ms=TIMEOUT_MS) as page:
        yield page


def expect(locator):
    from playwright.sync_api import expect as _expect

    return _expect(locator)


def job_widget(page, job_id: str):
    """The widget of one job in the notebook's outputs (its title carries the full job id)."""
    return page.locator(".lancefn-job-widget").filter(has=page.locator(f'code[title="{job_id}"]'))


def busy_prompt(page):
    return page.locator(".jp-Notebook .jp-Cell").nth(BUSY_CELL).locator(".jp-InputPrompt")


def test_job_widgets_update_live_while_another_cell_runs_and_cancel_works(page, lab, tmp_path):
    cp, server = lab
    work = tmp_path / "nbwork"
    work.mkdir()
    (server.root_dir / "widgets.ipynb").write_text(json.dumps(_notebook(work)))

    page.goto(server.url(f"lab/tree/widgets.ipynb?token={server.token}"), timeout=120_000)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=120_000)
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.press("Escape")
    # Run the cells one by one (Shift+Enter), as a user would.
    for _ in range(BUSY_CELL + 1):
        page.keyboard.press("Shift+Enter")
    wait_until((work / "busy").exists, "the last cell started (the kernel is now busy)", timeout=120)
    ids = json.loads((work / "ids.json").read_text())

    watched, victim = job_widget(page, ids["c"]), job_widget(page, ids["e"])

    def shows(state: str, status: str, victim_position: int) -> None:
        """The watched job's state and status line, the victim's queue position, the kernel still busy."""
        watched.locator(f".lancefn-state-{state}").wait_for()
        watched.locator(".lancefn-job-status", has_text=status).wait_for()
        victim.locator(".lancefn-job-status", has_text=f"position {victim_position}").wait_for()
        assert "[*]" in busy_prompt(page).inner_text()
        victim.scroll_into_view_if_needed()
        screenshot(page, f"widgets-{state}")

    shows("pending", "waiting for GPU capacity in class default, position 1", 3)
    (work / "gate-a").touch()  # a GPU frees up: the watched job starts, the victim moves up
    shows("running", "running on default [sim", 2)

    (work / "gate-c").touch()
    watched.locator(".lancefn-state-finished").wait_for()
    watched.locator(".widget-label", has_text="1/1 rows (100%)").wait_for()
    assert "[*]" in busy_prompt(page).inner_text()  # all of that while the other cell still ran
    assert watched.locator(".lancefn-state-pending").count() == 0
    # The dashboard and the classes table, displayed before the busy cell, followed too.
    dashboard = page.locator(".lancefn-jobs-dashboard")
    dashboard.locator(".lancefn-jobs-summary", has_text="2 finished").wait_for()
    dashboard.locator(".lancefn-placement", has_text="waiting for default, position 1").wait_for()
    classes = page.locator(".lancefn-gpu-classes-widget")
    classes.locator("td", has_text="Simulated GPU (numba CUDA simulator)").wait_for()
    # b and d run, e waits: 2 busy, 0/2 free, 2 running / 1 pending.
    classes.locator("tr").filter(has=page.locator("td", has_text="0/2")).filter(
        has=page.locator("td", has_text="2/1")
    ).wait_for()
    dashboard.scroll_into_view_if_needed()
    screenshot(page, "widgets-dashboard-while-busy")
    victim.scroll_into_view_if_needed()
    screenshot(page, "widgets-finished-while-busy")

    victim.locator(".lancefn-job-status", has_text="position 1").wait_for()  # the follower took the GPU
    (work / "release").touch()  # the kernel goes idle; button clicks now reach it
    page.locator(".jp-Notebook .jp-Cell").nth(BUSY_CELL).locator(
        ".jp-OutputArea-output", has_text="released"
    ).wait_for()
    victim.locator(".lancefn-state-pending").wait_for()
    victim.locator("button", has_text="Cancel").click()
    victim.locator(".lancefn-state-cancelled").wait_for()
    expect(victim.locator("button", has_text="Cancel")).to_be_disabled()
    victim.scroll_into_view_if_needed()
    screenshot(page, "widgets-cancelled")
    with cp.http() as http:
        assert http.post("/v1/jobs/describe", json={"job_id": ids["e"]}).json()["job_state"] == "CANCELLED"
    for name in "bd":
        (work / f"gate-{name}").touch()
