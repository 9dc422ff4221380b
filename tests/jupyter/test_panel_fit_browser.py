"""The "GPU Functions" side panel fits JupyterLab's default left sidebar and Notebook 7's, measured in headless
Chromium.

Long function names, versions, a diff, finished (cold and warm) and pending jobs: no text or element reaches
past the panel's edge, nothing breaks mid-word, cut text carries its whole self in its title, the header
covers no row however far the body scrolls, and registrations are not job rows (as `%gpu_jobs`). In Notebook 7,
a pending job's widget and the panel word its place and estimate the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_util import (
    WAIT_FOR_FILE_CELL,
    browser_page,
    jupyter_with_control_plane,
    notebook,
    open_lab,
    panel_missing_reason,
    run_command,
    screenshot,
    submit_gate_job,
    wait_job_state,
)
from helpers import hold_version
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

_missing = panel_missing_reason()

pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing is not None, reason=_missing or "")]

PANEL = "#lancefn-gpu-functions"
LONG_NAME = "double_all_the_embeddings_of_every_document_in_the_corpus"

# What the panel shows that does not fit: text past the edge of its scroller, words broken across lines,
# text cut by an ellipsis without its whole self in a title. Code blocks (diff, traceback) wrap as code does.
MEASURE = """
(panel) => {
  const scroller = panel.querySelector('.lf-body') || panel;
  const problems = [];
  const visible = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const limitOf = e => {
    const box = (scroller.contains(e) ? scroller : panel).getBoundingClientRect();
    const inner = scroller.contains(e) ? scroller.clientWidth : panel.clientWidth;
    return { left: box.left - 0.5, right: box.left + inner + 0.5 };
  };
  for (const e of panel.querySelectorAll('*')) {
    if (!visible(e)) continue;
    const r = e.getBoundingClientRect(), lim = limitOf(e);
    if (r.width && (r.left < lim.left || r.right > lim.right)) {
      problems.push(`element ${e.className} [${r.left}, ${r.right}] outside [${lim.left}, ${lim.right}]`);
    }
  }
  const walker = document.createTreeWalker(panel, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    const text = node.textContent;
    if (!text.trim() || !visible(parent) || parent.closest('.lf-diff, .lf-job-failure')) continue;
    const style = getComputedStyle(parent);
    if (style.textOverflow === 'ellipsis') {
      if (parent.scrollWidth > parent.clientWidth && !(parent.title || '').includes(text)) {
        problems.push(`"${text}" is cut without its whole text in a title`);
      }
      continue;
    }
    range.selectNodeContents(node);
    const box = range.getBoundingClientRect(), lim = limitOf(parent);
    if (box.left < lim.left || box.right > lim.right) {
      problems.push(`text "${text}" [${box.left}, ${box.right}] outside [${lim.left}, ${lim.right}]`);
    }
    let previousTop = null;
    for (let i = 0; i < text.length; i++) {
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const rects = range.getClientRects();
      if (!rects.length) continue;
      const top = rects[0].top;
      if (previousTop !== null && top > previousTop + 1 && /\\S/.test(text[i]) && /[^\\s\\-/,·]/.test(text[i - 1])) {
        problems.push(`"${text}" breaks mid-word: "${text.slice(0, i)}" / "${text.slice(i)}"`);
      }
      previousTop = top;
    }
  }
  return problems;
}
"""

# Whether a row is seen where it lies inside its scroller (no header or other element over it).
UNCOVERED = """
(row) => {
  const scroller = row.closest('.lf-body') || row.closest('.lf-panel');
  const r = row.getBoundingClientRect(), s = scroller.getBoundingClientRect();
  const y = Math.max(r.top, s.top) + 3;
  const hit = document.elementFromPoint(r.left + 20, y);
  return hit !== null && row.contains(hit);
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple]:
    base = tmp_path_factory.mktemp("panel-fit")
    with jupyter_with_control_plane(base, "lab") as (cp, server):
        yield cp, server, base


def _dismiss_dialogs(page, seen: list[str]) -> None:
    """Close whatever modal dialog JupyterLab shows (by its reject button, else Escape), keeping its text in ``seen``: on
    a loaded machine one has held the page (CI twice, its kind not caught), and it blocks every click beneath it."""
    dialogs = page.locator(".jp-Dialog")
    for _ in range(5):
        if not dialogs.count():
            return
        try:
            seen.append(" ".join(dialogs.first.inner_text(timeout=5_000).split())[:300])
            reject = dialogs.first.locator(".jp-Dialog-button.jp-mod-reject")
            if reject.count():
                reject.first.click(timeout=5_000)
            else:
                page.keyboard.press("Escape")
            dialogs.first.wait_for(state="detached", timeout=5_000)
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")


def _run_all_cells(page) -> None:
    """Run > Run All Cells, by its exact label: a substring match may take "Restart Kernel and Run All Cells…", whose
    confirmation dialog then holds every cell. Any dialog in the way is closed first (and named if nothing ran); tried
    again while no cell was queued within 30 s — a queued cell shows ``[*]`` at once, however busy the kernel, so a
    click that took is never repeated."""
    started = page.locator(".jp-InputPrompt:has-text('[*]'), .jp-InputPrompt:has-text('[1]')").first
    seen: list[str] = []
    for _ in range(4):
        _dismiss_dialogs(page, seen)
        try:
            page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click(timeout=20_000)
            page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click(timeout=20_000)
            started.wait_for(timeout=30_000)
            if seen:
                print(f"dialogs closed before Run All Cells: {seen}")
            return
        except PlaywrightTimeoutError:
            page.keyboard.press("Escape")  # a menu left open
    raise AssertionError(f"no cell ran after Run All Cells, four times; dialogs closed on the way: {seen}")


def test_in_notebook_7_the_panel_fits_and_says_what_the_widget_says_of_a_pending_job(browser, lab):
    """First in the module: no run has finished yet, so the estimate is "start time unknown" in both (a number of
    seconds would tick in the panel between the two reads)."""
    cp, server, base = lab
    gate = base / "gate-nb7"
    with cp.http() as http:
        holder = submit_gate_job(http, LONG_NAME, hold_version(http, LONG_NAME, 2), gate)  # both GPUs busy
        wait_job_state(http, holder, {"IN_PROGRESS"}, timeout=60)
        cell = f"job = wait_for_file.submit({str(gate)!r})\njob"
        (server.root_dir / "nb7.ipynb").write_text(
            json.dumps(notebook(["%load_ext lancefn_jupyter", WAIT_FOR_FILE_CELL, cell]))
        )
        try:
            with browser_page(browser, timeout_ms=60_000, height=720) as page:
                page.goto(server.url(f"notebooks/nb7.ipynb?token={server.token}"), timeout=120_000)
                page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(timeout=120_000)
                _run_all_cells(page)
                widget = page.locator(".lancefn-job-widget").filter(has=page.locator(".lancefn-state-pending"))
                widget.wait_for(timeout=120_000)
                page.locator(".lm-MenuBar-itemLabel", has_text="View").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Left Sidebar").first.hover()
                page.locator(".lm-Menu-itemLabel", has_text="Show GPU Functions").first.click()
                pending = page.locator(f'{PANEL} .lf-job[data-state="pending"] .lf-job-queue')
                pending.wait_for()
                words = pending.inner_text()
                assert words == "position 1, start time unknown", words
                assert words in widget.locator(".lancefn-job-status").inner_text()
                screenshot(page, "panel-fit-notebook7")
                panel = page.locator(PANEL)
                assert panel.evaluate(MEASURE) == []
        finally:
            gate.write_text("go")
            wait_job_state(http, holder, {"DONE"}, timeout=60)


def test_panel_fits_the_default_sidebar_with_long_names_diff_and_pending_jobs(browser, lab):
    cp, server, base = lab
    gate = base / "gate"
    with cp.http() as http:
        one = hold_version(http, LONG_NAME, 1)
        two = hold_version(http, LONG_NAME, 2)  # a second version (or the first, after Notebook 7's): a change and Diff
        newest = http.post("/v1/functions/history", json={"name": LONG_NAME}).json()["functions"][0]["versions"][0][
            "version"
        ]
        done = base / "done"
        done.write_text("go")
        for _ in range(2):  # cold, then warm
            finished = submit_gate_job(http, LONG_NAME, one, done)
            assert wait_job_state(http, finished, {"DONE"}, timeout=60)["job_state"] == "DONE"
        holder = submit_gate_job(http, LONG_NAME, two, gate)
        wait_job_state(http, holder, {"IN_PROGRESS"}, timeout=60)
        pending = [submit_gate_job(http, LONG_NAME, one, gate) for _ in range(2)]
        try:
            with browser_page(browser, timeout_ms=45_000, height=640) as page:
                check_panel(page, server, pending[-1], newest)
        finally:
            gate.write_text("go")
            for job_id in pending:
                wait_job_state(http, job_id, {"DONE"}, timeout=60)


def check_panel(page, server, pending_id: str, newest: str) -> None:
    open_lab(page, server, workspace="fit")
    run_command(page, "Open GPU Functions Panel")
    panel = page.locator(PANEL)
    page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')
    page.locator(f'{PANEL} .lf-job[data-job-id="{pending_id}"][data-state="pending"]').wait_for()
    page.locator(f"{PANEL} .lf-job-timings", has_text="warm").first.wait_for()
    newer = panel.locator(f'.lf-function[data-function-name="{LONG_NAME}"] .lf-version-row[data-version="{newest}"]')
    newer.locator(".lf-version-diff").click()
    newer.locator(".lf-diff").wait_for()
    screenshot(page, "panel-fit")

    width = panel.bounding_box()["width"]
    assert 200 < width < 400, width  # JupyterLab's default sidebar, not a widened one
    assert panel.evaluate(MEASURE) == []
    title = panel.locator(f'.lf-job[data-job-id="{pending_id}"] .lf-job-title')
    assert title.get_attribute("title").startswith(f"{LONG_NAME}@")  # the whole, cut text on hover
    assert pending_id in title.get_attribute("title")

    # Registrations (four here) are the function's versions, not job rows.
    assert panel.locator(".lf-job", has_text="register").count() == 0
    assert panel.locator(".lf-jobs .lf-count").inner_text() == " (3 active)"

    rows = panel.locator(".lf-jobs .lf-job")
    for i in (0, rows.count() - 1):  # each scrolled to the top of the panel's body
        rows.nth(i).evaluate("r => r.scrollIntoView({block: 'start'})")
        assert rows.nth(i).evaluate(UNCOVERED), f"the header covers job row {i}"
    assert page.errors == []


def test_measure_finds_a_mid_word_break_and_an_overflow(browser, lab, tmp_path: Path):
    """The measure itself can fail: a narrow box that breaks a word, and one wider than the panel."""
    _, server, _ = lab
    with browser_page(browser, timeout_ms=45_000) as page:
        open_lab(page, server, workspace="fit-measure")
        run_command(page, "Open GPU Functions Panel")
        panel = page.locator(PANEL)
        page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')
        panel.evaluate(
            """p => {
              const body = p.querySelector('.lf-body');
              const narrow = document.createElement('div');
              narrow.style.cssText = 'width: 30px; word-break: break-all';
              narrow.textContent = 'first version';
              const wide = document.createElement('div');
              wide.style.cssText = 'width: 2000px';
              wide.textContent = 'wide';
              body.append(narrow, wide);
            }"""
        )
        problems = panel.evaluate(MEASURE)
        assert any("breaks mid-word" in p and "first" in p for p in problems), problems
        assert any("outside" in p for p in problems), problems


def test_each_class_says_its_warm_workers_and_when_they_retire(browser, lab):
    """An idle worker that holds a version is counted under its class with the time it retires unused (the server's
    default `--worker-idle-s`, 10 minutes), counted down live; the line fits the panel like the rest."""
    cp, server, base = lab
    done = base / "warm-done"
    done.write_text("go")
    with cp.http() as http:
        job = submit_gate_job(http, "warm_one", hold_version(http, "warm_one", 1), done)
        wait_job_state(http, job, {"DONE"}, timeout=60)
        (usage,) = http.get("/v1/gpu/usage").json()["classes"]
    assert usage["warm_retire_ms"], usage
    with browser_page(browser, timeout_ms=45_000, height=640) as page:
        open_lab(page, server, workspace="fit-warm")
        run_command(page, "Open GPU Functions Panel")
        panel = page.locator(PANEL)
        page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')
        warm = panel.locator('.lf-class[data-class-name="default"] .lf-class-warm')
        warm.wait_for()
        count = len(usage["warm_retire_ms"])
        words = "1 worker, retires" if count == 1 else f"{count} workers, retire"
        assert re.fullmatch(rf"warm: {words} in (9|10) min", warm.inner_text()), warm.inner_text()
        screenshot(page, "panel-warm")
        assert panel.evaluate(MEASURE) == []
        assert page.errors == []
