"""The other front ends, in headless Debian Chromium (Playwright, never `playwright install`): Voilà (the
notebook widgets, and this project's labextension activating without an error), Notebook 7 (the side panel
through View → Left Sidebar) and the team dashboard `lancefn-dashboard` serves.

One control plane and one `jupyter notebook` (Notebook 7, which also serves Voilà's `voila/render/`) are
shared by the module. Jobs change state when the test creates their gate files, never by timing.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil
import pytest
from browser_util import (
    WAIT_FOR_FILE_CELL,
    browser_page,
    built_labextension,
    chromium_missing_reason,
    free_port,
    install_labextension,
    jupyter_with_control_plane,
    notebook,
    register_gate_function,
    screenshot,
    start_logged,
    stop_process_group,
    submit_gate_job,
    wait_job_state,
)
from conftest import ControlPlaneProcess
from helpers import register, submit, text_body, wait_until

_missing = chromium_missing_reason()
if _missing is None and not (importlib.util.find_spec("notebook") and importlib.util.find_spec("voila")):
    _missing = "Notebook 7 and Voilà are test extras (pip install -e '.[test]')"
pytestmark = [pytest.mark.browser, pytest.mark.skipif(_missing is not None, reason=_missing or "")]

TIMEOUT_MS = 90_000
PANEL = "#lancefn-gpu-functions"


class Servers:
    def __init__(self, cp: ControlPlaneProcess, server, tmp: Path, gate_version: str) -> None:
        self.cp, self.server, self.tmp, self.gate_version = cp, server, tmp, gate_version


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[Servers]:
    base = tmp_path_factory.mktemp("front-ends")
    with jupyter_with_control_plane(base, "notebook") as (cp, server):
        with cp.http() as http:
            version = register_gate_function(http, name="wait_for")
        yield Servers(cp, server, base, version)


@pytest.fixture
def page(browser):
    with browser_page(browser, timeout_ms=TIMEOUT_MS) as page:
        yield page


# What this project's extension requires of each shared package (labextension/package.json).
_REQUIRED = {
    name: spec["requiredVersion"]
    for name, spec in json.loads((Path(__file__).resolve().parents[2] / "labextension" / "package.json").read_text())[
        "jupyterlab"
    ]["sharedPackages"].items()
}
_UNSATISFIED = re.compile(r"Unsatisfied version \S+ .* shared singleton module (\S+) \(required (\S+)\)")


def _ours(messages: list[str]) -> list[str]:
    """Console errors and warnings from this project's extension: naming it, a plugin it cannot activate, or
    a shared package's version it requires that the page lacks (other extensions' warnings are theirs)."""
    found = []
    for m in messages:
        if not m.startswith(("error", "warning", "pageerror")):
            continue
        unsatisfied = _UNSATISFIED.search(m)
        ours = bool(unsatisfied) and _REQUIRED.get(unsatisfied.group(1)) == unsatisfied.group(2)
        if ours or "lancefn" in m.lower() or "No provider for" in m:
            found.append(m)
    return found


def test_voila_renders_the_widgets_and_a_pending_job_finishes_live_without_extension_errors(page, servers):
    work = servers.tmp / "voila"
    work.mkdir()
    gates = {name: str(work / f"gate-{name}") for name in "abc"}
    cells = [
        "%load_ext lancefn_jupyter",
        "%gpu_classes",
        WAIT_FOR_FILE_CELL,
        (
            "import json\n"
            f"gates = {json.dumps(gates)}\n"
            "blockers = [wait_for_file.submit(gates['a']), wait_for_file.submit(gates['b'])]  # both GPUs busy\n"
            "watched = wait_for_file.submit(gates['c'])  # pending, position 1\n"
            "ids = {'watched': watched.job_id, 'blockers': [job.job_id for job in blockers]}\n"
            f"json.dump(ids, open({str(work / 'ids.json')!r}, 'w'))\n"
            "watched"
        ),
        "%gpu_jobs",
    ]
    (servers.server.root_dir / "voila.ipynb").write_text(json.dumps(notebook(cells)))
    page.goto(servers.server.url(f"voila/render/voila.ipynb?token={servers.server.token}"), timeout=180_000)
    ids = json.loads(wait_until(lambda: (work / "ids.json").exists() and (work / "ids.json").read_text(), "ids"))
    watched_id = ids["watched"]
    watched = page.locator(".lancefn-job-widget").filter(has=page.locator(f'code[title="{watched_id}"]'))
    watched.locator(".lancefn-state-pending").wait_for(timeout=180_000)
    page.locator(".lancefn-gpu-classes-widget td", has_text="Simulated GPU").first.wait_for()
    page.locator(".lancefn-jobs-dashboard").wait_for()
    page.locator(".lancefn-function-card").first.wait_for()
    screenshot(page, "voila-pending")
    for name in "ac":  # a GPU frees, the watched job runs and finishes, while the page stays open
        Path(gates[name]).touch()
    watched.locator(".lancefn-state-finished").wait_for()
    page.locator(".lancefn-jobs-dashboard .lancefn-jobs-summary", has_text="2 finished").wait_for()
    screenshot(page, "voila-finished")
    Path(gates["b"]).touch()
    with servers.cp.http() as http:  # nothing of this test still runs when the next one starts
        for job_id in ids["blockers"]:
            wait_job_state(http, job_id, {"DONE"})
    assert _ours(page.console_messages) == [], page.console_messages


def test_the_panel_opens_in_notebook_7_from_the_view_menu(page, servers):
    (servers.server.root_dir / "nb7.ipynb").write_text(json.dumps(notebook(["1 + 1"])))
    page.goto(servers.server.url(f"notebooks/nb7.ipynb?token={servers.server.token}"), timeout=120_000)
    page.locator(".jp-NotebookPanel").first.wait_for()
    page.locator(".lm-MenuBar-itemLabel", has_text="View").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Left Sidebar").first.hover()
    page.locator(".lm-Menu-itemLabel", has_text="Show GPU Functions").first.click()
    page.wait_for_selector(f"{PANEL}:visible")
    page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')
    page.locator(PANEL, has_text="Simulated GPU").first.wait_for()  # the classes, live from the control plane
    screenshot(page, "notebook7-panel")
    assert _ours(page.console_messages) == [], page.console_messages


class Dashboard:
    """A running `lancefn-dashboard`: its base URL, the token it printed (None without one), its process."""

    def __init__(self, url: str, proc: subprocess.Popen, log_path: Path) -> None:
        self.url, self.proc, self.log_path = url, proc, log_path
        found = re.search(r"\?token=(\S+)", self.log())
        self.token = found.group(1) if found else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def processes(self) -> list[psutil.Process]:
        """The command's process and every process it started (Voilà's kernels among them)."""
        command = psutil.Process(self.proc.pid)
        return [command, *command.children(recursive=True)]


@contextlib.contextmanager
def _dashboard_command(servers: Servers, workdir: Path, *args: str, env: dict | None = None) -> Iterator[Dashboard]:
    """`lancefn-dashboard --port P *args` (as `python -m lancefn_jupyter.kernel.dashboards.cli`, the console script's
    target) against the module's control plane, in its own Jupyter dirs; yields it once it listens."""
    built = built_labextension()
    if built is not None:
        install_labextension(built, workdir / "jupyter_path" / "labextensions")
    port = free_port()
    process_env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "LANCEFN_DASHBOARD_TOKEN")}
    process_env.update(
        {
            "LANCEFN_URL": servers.cp.url,
            "LANCEFN_API_KEY": servers.cp.api_key,
            "JUPYTER_CONFIG_DIR": str(workdir / "config"),
            "JUPYTER_DATA_DIR": str(workdir / "data"),
            "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
            "JUPYTER_PATH": str(workdir / "jupyter_path"),
            "IPYTHONDIR": str(workdir / "ipython"),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
    )
    log_path = workdir / "dashboard.log"
    command = [sys.executable, "-m", "lancefn_jupyter.kernel.dashboards.cli", f"--port={port}", *args]
    proc = start_logged(command, log_path, process_env, workdir)
    try:

        def listening() -> bool:  # Voilà prints its URL once it listens
            assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
            return f"127.0.0.1:{port}/" in log_path.read_text(errors="replace")

        wait_until(listening, "lancefn-dashboard listens", timeout=90)
        yield Dashboard(f"http://127.0.0.1:{port}/", proc, log_path)
    finally:
        stop_process_group(proc)


def test_lancefn_dashboard_serves_a_team_page_whose_rows_change_as_jobs_run(page, servers):
    """Opened with the token it printed (and by `--open`, through a private file), the page shows the jobs live;
    neither the token nor the key is on a command line of its processes, nor the key in the page."""
    from playwright.sync_api import expect

    work = servers.tmp / "dashboard"
    work.mkdir()
    browser_arg = work / "browser-arg"
    fake_browser = work / "browser"  # what `--open` runs: it records the address it was given
    fake_browser.write_text(f'#!/bin/sh\nprintf %s "$1" > {browser_arg}\n')
    fake_browser.chmod(0o700)
    with (
        servers.cp.http() as http,
        _dashboard_command(servers, work, "--open", env={"BROWSER": f"{fake_browser} %s"}) as dashboard,
    ):
        assert dashboard.token is not None, dashboard.log()
        printed = f"{dashboard.url}?token={dashboard.token}"
        opened = Path(
            urlparse(
                wait_until(lambda: browser_arg.exists() and browser_arg.read_text(), "--open ran the browser")
            ).path
        )
        assert stat.S_IMODE(opened.stat().st_mode) == 0o600 and html.escape(printed) in opened.read_text()
        page.goto(printed, timeout=180_000)
        dashboard_page = page.locator(".lancefn-team-dashboard")
        dashboard_page.wait_for(timeout=180_000)
        dashboard_page.locator(".lancefn-gpu-classes-widget td", has_text="Simulated GPU").first.wait_for()
        # Sections with nothing to show say so (no batch, no failure in this module), never a bare heading or header.
        dashboard_page.locator(".lancefn-no-batches", has_text="no batches yet").wait_for()
        dashboard_page.locator(".lancefn-jobs-empty", has_text="no failed jobs yet").wait_for()
        gate = work / "gate"
        job_id = submit_gate_job(http, "wait_for", servers.gate_version, gate)
        jobs = dashboard_page.locator(".lancefn-jobs-dashboard").first
        jobs.locator(f'code[title="{job_id}"]').wait_for()  # a new row, from the event stream
        jobs.locator(".lancefn-jobs-summary", has_text="1 running").wait_for()
        screenshot(page, "dashboard-running")
        gate.touch()
        jobs.locator(".lancefn-jobs-summary", has_text="finished").wait_for()
        expect(jobs.locator(".lancefn-jobs-summary", has_text="running")).to_have_count(0)
        screenshot(page, "dashboard-finished")
        assert urlparse(page.url).query == ""  # logged in by cookie, the token left the address bar
        assert servers.cp.api_key not in page.content()
        processes = dashboard.processes()
        (kernel,) = [p.cmdline() for p in processes if "ipykernel_launcher" in p.cmdline()]  # the page's
        # The kernel's sockets are Unix sockets in a directory only this user can enter: over TCP any local user
        # could subscribe to its output (the widgets' state).
        connection = Path(kernel[kernel.index("-f") + 1])
        assert json.loads(connection.read_text())["transport"] == "ipc"
        assert stat.S_IMODE(connection.parent.stat().st_mode) & 0o077 == 0
        for process in processes:
            assert dashboard.token not in " ".join(process.cmdline()), process.cmdline()
            assert servers.cp.api_key not in " ".join(process.cmdline()), process.cmdline()
            assert dashboard.token not in "".join(process.environ().values()), process.cmdline()
        assert dashboard.token not in browser_arg.read_text()  # the browser's command line: the file's address
    assert not opened.exists()  # removed when the dashboard stopped
    assert _ours(page.console_messages) == [], page.console_messages


def test_lancefn_dashboard_without_its_token_serves_nothing(servers):
    """The page, the kernels' REST API and a kernel's websocket (of a page opened with the token) all refuse a
    caller without the token, and say nothing of the namespace's work."""
    work = servers.tmp / "dashboard-locked"
    work.mkdir()
    with _dashboard_command(servers, work) as dashboard:
        with httpx.Client(base_url=dashboard.url, timeout=180) as logged_in:
            opened = logged_in.get(f"?token={dashboard.token}", follow_redirects=True)
        assert opened.status_code == 200, opened.text[-2000:]
        kernel_id = re.search(r'"kernelId": "([0-9a-f-]{36})"', opened.text).group(1)
        replies = [
            httpx.request(method, dashboard.url + path, timeout=60)
            for method, path in [
                ("GET", ""),
                ("GET", "?token=not-the-token"),
                ("GET", "api/kernels"),
                ("GET", f"api/kernels/{kernel_id}"),
                ("DELETE", f"api/kernels/{kernel_id}"),
                ("POST", f"voila/api/shutdown/{kernel_id}"),
            ]
        ]
        for reply in replies:
            login = reply.status_code == 302 and reply.headers["location"].startswith("/login")
            assert login or reply.status_code in (401, 403), (reply.request.url, reply.status_code)
            assert "wait_for" not in reply.text and kernel_id not in reply.text
        assert (
            _websocket_status(f"ws://127.0.0.1:{urlparse(dashboard.url).port}/api/kernels/{kernel_id}/channels") == 403
        )
        with httpx.Client(base_url=dashboard.url, timeout=60) as logged_in:  # the kernel still serves its page
            assert logged_in.get(f"api/kernels/{kernel_id}?token={dashboard.token}").json()["id"] == kernel_id


def _websocket_status(url: str) -> int:
    """The HTTP status a websocket handshake to ``url`` gets (101 when it connects)."""
    import asyncio
    import concurrent.futures

    from tornado.httpclient import HTTPClientError
    from tornado.websocket import websocket_connect

    async def connect() -> int:
        try:
            connection = await websocket_connect(url)
        except HTTPClientError as e:
            return e.code
        connection.close()
        return 101

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own: Playwright's runs in this thread
        return pool.submit(asyncio.run, connect()).result()


def test_lancefn_dashboard_no_auth_serves_without_a_token_and_warns(servers):
    work = servers.tmp / "dashboard-open"
    work.mkdir()
    with _dashboard_command(servers, work, "--no-auth") as dashboard:
        assert dashboard.token is None
        page = httpx.get(dashboard.url, timeout=180)
        assert page.status_code == 200 and '"kernelId"' in page.text
        port = urlparse(dashboard.url).port
        assert (
            f"Anyone who can reach 127.0.0.1:{port} — every local user and every job — can act with this "
            "dashboard's key" in dashboard.log()
        )


FAIL_SOURCE = (
    "from __future__ import annotations\n\n\n"
    "def fail(path: str) -> str:\n"
    "    raise ValueError(f'cannot read {path}: the file holds no document, only a very long explanation of why')\n"
)

# A jobs table as the browser lays it out: its tracks' resolved widths, its right edge, and per row the job's id,
# state, and the left and right edges (px) of its state cell and of its Cancel button.
TABLE = """
(table) => {
  const grid = table.querySelector('.widget-gridbox');
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
  const tracks = getComputedStyle(grid).gridTemplateColumns;
  const n = tracks.split(' ').length, cells = [...grid.children], rows = [];
  for (let at = n; at + n <= cells.length; at += n) {
    const row = cells.slice(at, at + n);
    const state = row.find(c => c.querySelector('.lancefn-state'));
    const cancel = row.find(c => c.textContent.includes('Cancel'));
    rows.push({
      id: row[0].querySelector('code').title,
      state: state.textContent.trim(),
      state_cell: box(state),
      cancel: box(cancel),
    });
  }
  return {tracks, right: box(table)[1], rows};
}
"""


def _counts(summary: str) -> tuple[int, dict[str, int]]:
    """A table's summary ("5 shown · 1 running, 3 finished, 1 failed") as (shown, {state: count})."""
    shown, _, parts = summary.partition(" · ")
    counts = {state: int(n) for n, state in (part.split(" ", 1) for part in parts.split(", ") if part)}
    return int(shown.removesuffix(" shown")), counts


def _check_table(table) -> dict:
    """The table's summary adds up to its rows, state by state; returns its layout (TABLE)."""
    laid_out = table.evaluate(TABLE)
    shown, counts = _counts(table.locator(".lancefn-jobs-summary").inner_text())
    states = [row["state"] for row in laid_out["rows"]]
    assert shown == len(states) and counts == {s: states.count(s) for s in set(states)}, (shown, counts, laid_out)
    return laid_out


def test_the_team_dashboard_filled_shows_each_section_with_counts_that_add_up_and_columns_that_stay(page, servers):
    """A batch, a failure, running, pending and finished jobs: every section shows them (no "yet" text left),
    the failures' counts count failures, each summary adds up to its table; columns keep their widths as rows
    change and line up across the two tables; each Cancel sits beside its job, where it stays on a wider page."""
    work = servers.tmp / "dashboard-filled"
    work.mkdir()
    done, gate = work / "done", work / "gate"
    done.touch()
    with servers.cp.http() as http:
        failing = register(http, text_body("fail", FAIL_SOURCE, num_gpus=None))["version"]
        failed = submit(http, "fail", failing, [{"path": "first.txt"}])
        finished = submit_gate_job(http, "wait_for", servers.gate_version, done)
        created = http.post(
            "/v1/batches/create",
            json={"name": "wait_for", "version": servers.gate_version, "chunks": [[{"path": str(done)}]] * 3},
        )
        assert created.status_code == 202, created.text
        batch_id = created.json()["batch_id"]
        for job_id in (failed, finished):
            wait_job_state(http, job_id, {"FAILED", "DONE"}, timeout=60)
        wait_until(
            lambda: http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()["batch_state"] == "DONE",
            "the batch finished",
        )
        running = [submit_gate_job(http, "wait_for", servers.gate_version, gate) for _ in range(2)]  # both GPUs
        pending = submit_gate_job(http, "wait_for", servers.gate_version, gate)
        for job_id in running:
            wait_job_state(http, job_id, {"IN_PROGRESS"}, timeout=60)
        try:
            with _dashboard_command(servers, work) as dashboard:
                page.goto(f"{dashboard.url}?token={dashboard.token}", timeout=180_000)
                board = page.locator(".lancefn-team-dashboard")
                board.wait_for(timeout=180_000)
                jobs, failures = (
                    board.locator(".lancefn-jobs-dashboard").nth(0),
                    board.locator(".lancefn-jobs-dashboard").nth(1),
                )
                jobs.locator(f'code[title="{pending}"]').wait_for()
                failures.locator(f'code[title="{failed}"]').wait_for()
                board.locator(".lancefn-batch-widget", has_text=batch_id[:12]).wait_for()
                board.locator(".lancefn-batch-widget", has_text="3/3 rows").wait_for()
                screenshot(page, "dashboard-filled")
                assert not board.locator(".lancefn-no-batches").is_visible()
                assert board.locator(".lancefn-jobs-empty:visible").count() == 0
                assert failures.locator(".lancefn-jobs-summary").inner_text() == "1 shown · 1 failed"
                assert failures.locator(".lancefn-detail", has_text="cannot read first.txt").count() == 1
                before = _check_table(jobs)
                assert _check_table(failures)["tracks"] == before["tracks"]  # the two tables' columns line up
                assert {r["id"] for r in before["rows"]} >= {failed, finished, pending, *running}

                # Rows change: a running job ends, the pending one starts, a new failure with a longer message.
                Path(gate).touch()
                wait_job_state(http, pending, {"DONE"}, timeout=60)
                again = submit(http, "fail", failing, [{"path": "a-much-longer-name-of-a-second-document.txt"}])
                failures.locator(".lancefn-jobs-summary", has_text="2 shown · 2 failed").wait_for()
                jobs.locator(f'code[title="{again}"]').wait_for()
                jobs.locator(".lancefn-jobs-summary", has_text="running").wait_for(state="detached")
                after = _check_table(jobs)
                assert after["tracks"] == before["tracks"] == _check_table(failures)["tracks"]

                # Each Cancel sits beside its job's state, not at the page's far edge, on a wide page as well.
                for width in (1400, 2400):
                    page.set_viewport_size({"width": width, "height": 1000})
                    page.wait_for_function("w => window.innerWidth === w", arg=width)
                    laid_out = _check_table(jobs)
                    for row in laid_out["rows"]:
                        gap = row["cancel"][0] - row["state_cell"][1]
                        assert 0 <= gap < 40, (width, row)
                        assert laid_out["right"] - row["cancel"][1] > 200, (width, row)
                screenshot(page, "dashboard-filled-wide")
        finally:
            gate.touch()
            for job_id in (*running, pending):
                wait_job_state(http, job_id, {"DONE", "CANCELLED"}, timeout=60)
    assert _ours(page.console_messages) == [], page.console_messages
