"""The "GPU Functions" side panel in a real JupyterLab, driven by headless Debian Chromium.

`jupyter lab --allow-root --no-browser --ServerApp.base_url=/jl/ --IdentityProvider.token=...`
on 127.0.0.1 with a real control plane (simulated `default` class, 2 GPUs). Jobs run
`wait_for(path)`, which returns once the test creates the file, so every state change happens
when the test says so. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_util import (
    browser_page,
    free_port,
    jupyter_with_control_plane,
    notebook,
    open_lab,
    panel_missing_reason,
    register_gate_function,
    run_command,
    screenshot,
    start_jupyter,
    submit_gate_job,
    wait_job_state,
    wait_lab_ready,
)
from conftest import ControlPlaneProcess, register, registration_body
from helpers import api_keys_toml, wait_until
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

_missing = panel_missing_reason()

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(_missing is not None, reason=_missing or ""),
]

OPEN_PANEL = "Open GPU Functions Panel"
PANEL = "#lancefn-gpu-functions"
TIMEOUT_MS = 45_000


@pytest.fixture
def page(browser):
    with browser_page(browser, timeout_ms=TIMEOUT_MS, height=900) as page:
        yield page


class Lab:
    def __init__(self, cp: ControlPlaneProcess, server, tmp: Path) -> None:
        self.cp, self.server, self.tmp = cp, server, tmp


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[Lab]:
    """A control plane and a tokened `jupyter lab` under /jl/ proxying to it (shared by the module)."""
    base = tmp_path_factory.mktemp("panel")
    with jupyter_with_control_plane(base, "lab") as (cp, server):
        yield Lab(cp, server, base)


def saves_open_panel(request) -> bool:
    """A workspace save (PUT <base>api/workspaces/...) whose left area shows the panel."""
    if "api/workspaces" not in request.url or request.method != "PUT":
        return False
    try:
        data = json.loads(request.post_data or "{}")
    except ValueError:
        return False
    left = data.get("data", {}).get("layout-restorer:data", {}).get("left", {})
    return left.get("current") == "lancefn-gpu-functions" and not left.get("collapsed", True)


def path_of(url: str) -> str:
    """The URL without its query (JupyterLab adds a cache-busting timestamp to GETs)."""
    return url.split("?", 1)[0]


def job_row(page, job_id: str, state: str):
    return page.locator(f'{PANEL} .lf-job[data-job-id="{job_id}"][data-state="{state}"]')


def open_panel(page) -> None:
    run_command(page, OPEN_PANEL)
    page.wait_for_selector(f"{PANEL}:visible")
    page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')


def panel_status(page, server, status: str):
    """Opens Lab and the panel, waits for the panel's connection status ``status``; returns that element."""
    open_lab(page, server)
    run_command(page, OPEN_PANEL)
    element = page.locator(f'{PANEL} .lf-status[data-status="{status}"]')
    element.wait_for()
    return element


def open_notebook(page, server, name: str, source: str, workspace: str):
    """Writes a one-cell notebook, opens it and waits for its kernel; returns the cell's editor."""
    (server.root_dir / name).write_text(json.dumps(notebook([source])))
    open_lab(page, server, path=name, workspace=workspace)
    # Run only once the kernel is up: a cell run while the kernel is still starting is dropped.
    page.locator(".jp-StatusBar-TextItem", has_text="| Idle").first.wait_for(timeout=90_000)
    editor = page.locator(".jp-NotebookPanel:visible .jp-Cell .cm-content").first
    editor.wait_for()
    return editor


def start_busy_notebook(page, server, marker: Path) -> None:
    """Opens a new notebook (its own kernel) whose cell writes `marker` then sleeps: the kernel
    stays busy for the rest of the test."""
    source = f"import time\nopen({str(marker)!r}, 'w').write('busy')\ntime.sleep(600)"
    editor = open_notebook(page, server, f"busy-{marker.name}.ipynb", source, workspace=marker.name)
    editor.click()
    page.keyboard.press("Shift+Enter")
    wait_until(marker.exists, "the notebook cell started", timeout=90)


def assert_kernel_busy(page) -> None:
    prompt = page.locator(".jp-NotebookPanel:visible .jp-Cell .jp-InputPrompt").first
    assert "[*]" in prompt.inner_text()


# --------------------------------------------------------------------------------- tests


def test_panel_shows_classes_and_live_jobs_while_the_kernel_is_busy(page, lab):
    start_busy_notebook(page, lab.server, lab.tmp / "busy-started")
    open_panel(page)

    gpu_class = page.locator(f'{PANEL} .lf-class[data-class-name="default"]')
    gpu_class.wait_for()
    text = gpu_class.inner_text()
    assert "simulated" in text
    assert "max 2 GPUs per worker" in text
    assert "GPU memory not reported" in text  # the simulated class has no memory size
    page.wait_for_selector(f'{PANEL} .lf-class[data-class-name="default"] .lf-usage-text:text("0 busy / 2 free of 2")')

    with lab.cp.http() as http:
        version = register_gate_function(http, num_gpus=2)
        gate_a, gate_b = lab.tmp / "gate-a", lab.tmp / "gate-b"
        job_a = submit_gate_job(http, "wait_for", version, gate_a)
        wait_job_state(http, job_a, {"IN_PROGRESS"})
        job_b = submit_gate_job(http, "wait_for", version, gate_b)  # needs both GPUs too: waits

        job_row(page, job_a, "running").wait_for()
        pending = job_row(page, job_b, "pending")
        pending.wait_for()
        assert "position 1, start time unknown" in pending.inner_text()
        # The module's first test: no run has finished on this control plane, so nothing to estimate from.
        assert "start time unknown" in pending.inner_text()
        assert f"wait_for@{version}" in pending.inner_text()
        running_text = job_row(page, job_a, "running").inner_text()
        assert "default" in running_text and "2 GPUs (sim0, sim1)" in running_text
        page.wait_for_selector(f'{PANEL} .lf-usage-text:text("2 busy / 0 free of 2 · 1 pending")')
        page.wait_for_selector(f'{PANEL} .lf-function[data-function-name="wait_for"] code:text("{version}")')
        assert_kernel_busy(page)
        screenshot(page, "panel-running-and-pending")

        gate_a.write_text("go")
        job_row(page, job_a, "finished").wait_for()
        job_row(page, job_b, "running").wait_for()
        gate_b.write_text("go")
        finished = job_row(page, job_b, "finished")
        finished.wait_for()
        assert "1/1 row" in finished.inner_text()
        assert finished.locator(".lf-job-cancel").is_hidden()
        page.wait_for_selector(f'{PANEL} .lf-usage-text:text("0 busy / 2 free of 2")')
        assert_kernel_busy(page)
        screenshot(page, "panel-finished")
    assert page.errors == []


def test_cancel_in_the_panel_stops_a_running_job_while_the_kernel_is_busy(page, lab):
    start_busy_notebook(page, lab.server, lab.tmp / "busy-started-2")
    open_panel(page)
    with lab.cp.http() as http:
        version = register_gate_function(http, num_gpus=1)
        job_id = submit_gate_job(http, "wait_for", version, lab.tmp / "gate-never")  # never opened
        wait_job_state(http, job_id, {"IN_PROGRESS"})
        row = job_row(page, job_id, "running")
        row.wait_for()
        assert_kernel_busy(page)
        row.locator(".lf-job-cancel").click()
        job_row(page, job_id, "cancelled").wait_for()
        assert wait_job_state(http, job_id, {"CANCELLED"})["job_state"] == "CANCELLED"
        # Its GPU is free again.
        page.wait_for_selector(f'{PANEL} .lf-usage-text:text("0 busy / 2 free of 2")')
        assert_kernel_busy(page)
        screenshot(page, "panel-cancelled")

        # A job that runs out of time shows "timed out" and the failure message, without Cancel.
        late = submit_gate_job(http, "wait_for", version, lab.tmp / "gate-never-2", timeout_s=1)
        timed_out = job_row(page, late, "timed out")
        timed_out.wait_for()
        failure = timed_out.locator(".lf-job-failure")
        assert failure.is_visible() and failure.inner_text().startswith("timeout:")
        assert timed_out.locator(".lf-job-cancel").is_hidden()


def test_insert_puts_a_job_handle_into_the_notebook(page, lab):
    """A job row's Insert adds a `Job.attach` cell below the active cell of the current notebook;
    run, it shows the job as the kernel sees it."""
    open_lab(page, lab.server, workspace="insert-no-notebook")
    open_panel(page)
    with lab.cp.http() as http:
        version = register_gate_function(http, num_gpus=1)
        gate = lab.tmp / "gate-insert"
        gate.write_text("go")
        job_id = submit_gate_job(http, "wait_for", version, gate)
        assert wait_job_state(http, job_id, {"DONE"})["job_state"] == "DONE"
    job_row(page, job_id, "finished").locator(".lf-job-insert").click()  # no notebook open yet
    page.wait_for_selector(f'{PANEL} .lf-job[data-job-id="{job_id}"] .lf-job-error:text("open a notebook first")')

    open_notebook(page, lab.server, "insert.ipynb", "x = 1", workspace="insert").click()
    open_panel(page)
    row = job_row(page, job_id, "finished")
    row.wait_for()
    assert page.locator(f"{PANEL} .lf-job", has_text="register wait_for").count() == 0  # not job rows
    row.locator(".lf-job-insert").click()

    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    cells.nth(1).wait_for()
    assert cells.count() == 2 and cells.nth(0).locator(".cm-content").inner_text() == "x = 1"
    inserted = cells.nth(1).locator(".cm-content")
    lines = [line for line in inserted.inner_text().splitlines() if line.strip()]  # CodeMirror pads blank lines
    assert lines == ["from lancefn_jupyter import Job", f'job = Job.attach("{job_id}")', "job"]
    inserted.click()
    page.keyboard.press("Shift+Enter")
    output = cells.nth(1).locator(".jp-OutputArea-output")
    output.filter(has_text="finished").first.wait_for(timeout=90_000)
    assert f"wait_for@{version}" in output.first.inner_text()
    assert row.locator(".lf-job-error").is_hidden()
    screenshot(page, "panel-insert")
    assert page.errors == []


def test_panel_layout_is_restored_after_reload(page, lab):
    open_lab(page, lab.server, workspace="restore")
    # Reload only once the workspace saved with the panel as the open left-area widget.
    with page.expect_request(saves_open_panel, timeout=60_000) as saved:
        open_panel(page)
    assert saved.value.response().ok
    page.reload()
    wait_lab_ready(page)
    # No command this time: the restorer reopens it, and it reconnects by itself.
    page.wait_for_selector(f"{PANEL}:visible")
    page.wait_for_selector(f'{PANEL} .lf-status[data-status="connected"]')
    page.wait_for_selector(f'{PANEL} .lf-class[data-class-name="default"]')


def test_panel_works_under_a_tokenless_server(page, tmp_path, control_plane_factory):
    cp = control_plane_factory()
    server = start_jupyter(tmp_path, token="", env={"LANCEFN_URL": cp.url, "LANCEFN_API_KEY": cp.api_key})
    try:
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url) if "/lancefn/" in r.url else None)
        open_lab(page, server)
        open_panel(page)
        page.wait_for_selector(f'{PANEL} .lf-class[data-class-name="default"]')
        assert server.lab_url() == server.url("lab")
        with cp.http() as http:
            version = register_gate_function(http)
            gate = tmp_path / "gate"
            gate.write_text("open")
            job_id = submit_gate_job(http, "wait_for", version, gate)
            job_row(page, job_id, "finished").wait_for()  # arrived over the token-less stream
            # Cancel is a POST: without a token it is authorised by JupyterLab's XSRF cookie.
            stuck = submit_gate_job(http, "wait_for", version, tmp_path / "never")
            job_row(page, stuck, "running").locator(".lf-job-cancel").click()
            job_row(page, stuck, "cancelled").wait_for()
            assert wait_job_state(http, stuck, {"CANCELLED"})["job_state"] == "CANCELLED"
        assert not any("token=" in u for u in urls)
        assert server.url("lancefn/api/v1/jobs/events") in urls
    finally:
        server.stop()


def test_unreachable_control_plane_backs_off_then_recovers(page, tmp_path, control_plane_factory):
    port = free_port()
    key = "panel-test-admin-key-0123456789abcdef"
    server = start_jupyter(tmp_path, env={"LANCEFN_URL": f"http://127.0.0.1:{port}", "LANCEFN_API_KEY": key})
    try:
        requests: list[tuple[float, str]] = []
        page.on("request", lambda r: requests.append((time.monotonic(), r.url)) if "/lancefn/" in r.url else None)
        statuses: list[int] = []
        page.on("response", lambda r: statuses.append(r.status) if "/lancefn/" in r.url else None)
        status = panel_status(page, server, "unreachable")
        assert "control plane unreachable" in status.inner_text()
        assert "retrying in" in status.inner_text()
        screenshot(page, "panel-unreachable")
        start = requests[0][0]
        page.wait_for_timeout(6_500)  # (not time.sleep: Playwright delivers events while it waits)
        early = [t - start for t, _ in requests if t - start < 6.5]
        # Backoff 1 s, 2 s, 4 s: at most 4 status checks in 6.5 s, never a stream of requests.
        assert 2 <= len(early) <= 4, early
        assert 404 not in statuses
        assert all(path_of(u).endswith("/jl/lancefn/status") for _, u in requests)

        # The control plane appears on that port: "Retry now" connects at once.
        control_plane_factory(env={"LANCEFN_API_KEY": key}, args=["--port", str(port)])
        connected = page.locator(f'{PANEL} .lf-status[data-status="connected"]')
        try:
            page.locator(f"{PANEL} .lf-retry").click(timeout=10_000)
        except PlaywrightTimeoutError:
            # On a slow machine the server can take longer to start than the next backoff step,
            # so the panel's own retry may connect first (the button is gone); either way it connects.
            assert connected.count() == 1
        connected.wait_for()
        page.wait_for_selector(f'{PANEL} .lf-class[data-class-name="default"]')
        assert key not in page.content()
    finally:
        server.stop()


def test_missing_server_extension_is_explained_not_polled(page, tmp_path):
    server = start_jupyter(tmp_path, server_extension=False)
    try:
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if "/lancefn/" in r.url else None)
        status = panel_status(page, server, "no-extension")
        assert (
            "lancefn server extension is not enabled: run `jupyter server extension enable lancefn_jupyter`"
            in status.inner_text()
        )
        page.wait_for_timeout(3_000)
        assert [path_of(u) for u in requests] == [server.url("lancefn/status")], requests
        screenshot(page, "panel-no-server-extension")
    finally:
        server.stop()


def test_a_batch_row_shows_rows_chunks_by_state_and_cancels(page, lab):
    open_lab(page, lab.server, workspace="batches")
    open_panel(page)
    with lab.cp.http() as http:
        version = register_gate_function(http, num_gpus=1)
        done, never = lab.tmp / "batch-done", lab.tmp / "batch-never"
        done.write_text("open")
        chunks = [[{"path": str(path)}] * 2 for path in (done, done, never, never, never)]
        reply = http.post("/v1/batches/create", json={"name": "wait_for", "version": version, "chunks": chunks})
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        row = page.locator(f'{PANEL} .lf-batch[data-batch-id="{batch_id}"][data-state="running"]')
        row.wait_for()
        # Two chunks finished, two running on the two GPUs, one waiting: one strip cell per chunk. The fourth chunk
        # starts a moment after the second ends, so wait for the settled detail line before reading the strip.
        page.wait_for_selector(f'{PANEL} .lf-batch[data-batch-id="{batch_id}"] .lf-progress-text:text("4/10 rows")')
        settled = "2 finished, 2 running, 1 pending of 5 chunks"
        page.wait_for_selector(f'{PANEL} .lf-batch[data-batch-id="{batch_id}"] .lf-batch-detail:has-text("{settled}")')
        cells = row.locator(".lf-chunk")
        assert [cells.nth(i).get_attribute("title") for i in range(5)] == [
            "finished",
            "finished",
            "running",
            "running",
            "pending",
        ]
        assert settled in row.locator(".lf-batch-detail").inner_text()
        screenshot(page, "panel-batch")
        # Pause: the badge says paused and the button offers Resume; Resume brings it back ("Batches": pause).
        row.locator(".lf-batch-toggle:text('Pause')").click()
        paused = page.locator(f'{PANEL} .lf-batch[data-batch-id="{batch_id}"][data-state="paused"]')
        paused.wait_for()
        assert paused.locator(".lf-badge").inner_text() == "paused"
        assert http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()["paused"] is True
        paused.locator(".lf-batch-toggle:text('Resume')").click()
        row.wait_for()
        assert "paused" not in http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()
        row.locator(".lf-job-cancel").click()
        cancelled = page.locator(f'{PANEL} .lf-batch[data-batch-id="{batch_id}"][data-state="cancelled"]')
        cancelled.wait_for()
        assert cancelled.locator(".lf-job-cancel").is_hidden()
        state = http.post("/v1/batches/describe", json={"batch_id": batch_id}).json()
        assert state["batch_state"] == "CANCELLED" and state["strip"] == "ddccc"


SCALE_V1 = "from __future__ import annotations\n\n\ndef scale(x: int) -> int:\n    y = 2 * x\n    return y\n"
SCALE_V2 = "from __future__ import annotations\n\n\ndef scale(x: int) -> int:\n    y = 3 * x\n    return y + 1\n"


def test_functions_section_lists_versions_with_changes_diff_and_lookup_insert(page, lab):
    """Issue 17: versions newest first with their one-line change; Diff opens the unified diff against
    the version before; Insert adds a `lancefn_jupyter.lookup("name@prefix")` cell that, run, gives a
    handle on that version."""
    open_notebook(page, lab.server, "versions.ipynb", "x = 1", workspace="versions").click()
    open_panel(page)
    with lab.cp.http() as http:
        old = register(http, registration_body("scale", source=SCALE_V1, entrypoint="scale"))["version"]
        new = register(http, registration_body("scale", source=SCALE_V2, entrypoint="scale"))["version"]
        history = http.post("/v1/functions/history", json={"name": "scale"}).json()
    function = page.locator(f'{PANEL} .lf-function[data-function-name="scale"]')
    function.locator(f'.lf-version-row[data-version="{old}"]').wait_for()
    rows = function.locator(".lf-version-row")
    rows.nth(1).wait_for()
    assert [rows.nth(i).get_attribute("data-version") for i in range(rows.count())] == [new, old]
    changes = [rows.nth(i).locator(".lf-version-change").inner_text() for i in range(2)]
    assert changes == ["code: 2 lines", "first version"], (changes, history)
    newer, first = rows.nth(0), rows.nth(1)
    assert first.locator(".lf-version-diff").count() == 0  # nothing before the first version

    newer.locator(".lf-version-diff").click()
    diff = newer.locator(".lf-diff")
    diff.wait_for()
    text = diff.inner_text()
    assert text.startswith(f"{old} → {new}: code: 2 lines"), text
    assert "-    y = 2 * x" in text and "+    y = 3 * x" in text
    assert "-    return y" in text and "+    return y + 1" in text
    screenshot(page, "panel-version-diff")
    newer.locator(".lf-version-diff").click()  # Diff again closes it
    diff.wait_for(state="hidden")

    first.locator(".lf-version-insert").click()  # the older version, by its prefix
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    cells.nth(1).wait_for()
    assert cells.count() == 2 and cells.nth(0).locator(".cm-content").inner_text() == "x = 1"
    inserted = cells.nth(1).locator(".cm-content")
    lines = [line for line in inserted.inner_text().splitlines() if line.strip()]
    assert lines == ["import lancefn_jupyter", f'scale = lancefn_jupyter.lookup("scale@{old[:8]}")', "scale"]
    inserted.click()
    page.keyboard.press("Shift+Enter")
    output = cells.nth(1).locator(".jp-OutputArea-output")
    output.filter(has_text=old[:8]).first.wait_for(timeout=90_000)
    shown = output.first.inner_text()
    assert "scale" in shown and new[:8] not in shown, shown
    screenshot(page, "panel-version-insert")
    assert first.locator(".lf-version-error").is_hidden()
    assert page.errors == []


NAP_SOURCE = "from __future__ import annotations\n\nimport time\n\n\ndef nap(s: float) -> float:\n    time.sleep(s)\n    return s\n"


def test_pending_jobs_show_their_expected_start_behind_busy_gpus(page, lab):
    """A queued job shows "starts in about N s" once the control plane has run times to estimate from
    (the module's first test checks "start time unknown" before any), or "start time uncertain (best guess N s)"
    while it waits behind a running function without history that outlived the class's runs."""
    open_lab(page, lab.server, workspace="expected-start")
    open_panel(page)
    with lab.cp.http() as http:
        nap = register(
            http,
            registration_body(
                "nap",
                source=NAP_SOURCE,
                entrypoint="nap",
                inputs=(("s", "float64", False),),
                output_type="float64",
                num_gpus=2,
            ),
        )["version"]
        history = http.post("/v1/functions/run", json={"name": "nap", "version": nap, "rows": [{"s": 2.0}]}).json()[
            "job_id"
        ]
        assert wait_job_state(http, history, {"DONE", "FAILED"}, timeout=60)["job_state"] == "DONE"
        holder_version = register_gate_function(http, name="hold_gpus", num_gpus=2)
        gate = lab.tmp / "gate-expected-start"
        holder = submit_gate_job(http, "hold_gpus", holder_version, gate)
        wait_job_state(http, holder, {"IN_PROGRESS"})
        # Eight 2-GPU naps of ~2 s queue behind it: the last one starts some 14 s after the holder ends
        # (the panel counts down to "starts any moment", so the margin keeps a slow machine from racing it).
        queued = [
            http.post("/v1/functions/run", json={"name": "nap", "version": nap, "rows": [{"s": 2.0}]}).json()["job_id"]
            for _ in range(8)
        ]
        try:
            last = job_row(page, queued[-1], "pending")
            last.wait_for()
            page.wait_for_selector(f'{PANEL} .lf-usage-text:text("2 busy / 0 free of 2 · 8 pending")')
            text = last.locator(".lf-job-queue").inner_text()
            # The holder's function has no history: its end rests on the class's runs, and once it outlived
            # them (how soon depends on the machine) the estimate says so (issue 29).
            assert re.fullmatch(r"position 8, (starts in about|start time uncertain \(best guess) \d+ s\)?", text), text
            screenshot(page, "panel-expected-start")
        finally:
            for job_id in queued:
                http.post("/v1/jobs/cancel", json={"job_id": job_id})
            gate.write_text("go")
        job_row(page, holder, "finished").wait_for()
    assert page.errors == []


TEAM_KEYS = api_keys_toml(
    {
        "name": "alice",
        "key": "alice-key-000000001",
        "namespace": "team-a",
        "privileges": ["functions", "jobs", "system_usage"],
    },
    {"name": "carol", "key": "carol-key-000000003", "privileges": ["functions", "jobs", "system_usage"]},
)


def test_namespace_label_shows_only_when_jobs_of_two_namespaces_are_listed(page, tmp_path, control_plane_factory):
    """Issue 14: an admin key on a shared server (`--api-keys`) sees every team's jobs; the panel names
    each job's namespace once more than one is listed, and not before."""
    cp = control_plane_factory(api_keys=TEAM_KEYS)
    server = start_jupyter(tmp_path, env={"LANCEFN_URL": cp.url, "LANCEFN_API_KEY": cp.api_key})
    try:
        open_lab(page, server)
        open_panel(page)
        runs = {}
        for who, key in (("alice", "alice-key-000000001"), ("carol", "carol-key-000000003")):
            with cp.http(key, timeout=60.0) as http:
                version = register_gate_function(http, num_gpus=1)
                gate = tmp_path / f"gate-{who}"
                gate.write_text("go")
                runs[who] = submit_gate_job(http, "wait_for", version, gate)
            row = job_row(page, runs[who], "finished")
            row.wait_for()
            if who == "alice":
                # Only team-a's job so far (its run; its registration is no job row): no namespace label.
                assert page.locator(f"{PANEL} .lf-job").count() == 1
                assert row.locator(".lf-job-namespace").is_hidden()
        alice_row, carol_row = job_row(page, runs["alice"], "finished"), job_row(page, runs["carol"], "finished")
        alice_row.locator(".lf-job-namespace:visible").wait_for()
        assert alice_row.locator(".lf-job-namespace").inner_text() == "team-a"
        assert carol_row.locator(".lf-job-namespace").inner_text() == "carol"
        screenshot(page, "panel-namespaces")
        assert page.errors == []
    finally:
        server.stop()


def finished_jobs(lab, name: str, count: int) -> list[str]:
    """`count` jobs of a fresh gate function `name`, one after the other, each finished (gates open)."""
    with lab.cp.http() as http:
        version = register_gate_function(http, name=name, num_gpus=1)
        ids = []
        for i in range(count):
            gate = lab.tmp / f"gate-{name}-{i}"
            gate.write_text("go")
            ids.append(submit_gate_job(http, name, version, gate))
            assert wait_job_state(http, ids[-1], {"DONE"})["job_state"] == "DONE"
    return ids


def timings_of(page, job_id: str):
    row = job_row(page, job_id, "finished")
    row.wait_for()
    return row.locator(".lf-job-timings")


def test_job_rows_say_cold_or_warm_from_the_jobs_timings(page, lab):
    """A finished job's row says how it started ("cold start 1.2 s, setup 1.0 s", "warm"), its tooltip
    every phase; a job without `timings` shows nothing. The timings are the wire's (set here on the
    jobs/list reply, so the row's wording is checked whatever the control plane measured)."""
    cold, warm, legacy = finished_jobs(lab, "timings_wire", 3)
    given = {
        cold: {"queued_ms": 15.0, "start_ms": 1234.0, "setup_ms": 1000.0, "run_ms": 12.3, "cold": True},
        warm: {"queued_ms": 2.0, "run_ms": 12.3},  # zeros and `cold: false` are omitted on the wire
        legacy: None,  # a server before issue 24
    }

    def with_timings(route) -> None:
        response = route.fetch()
        body = response.json()
        for job in body.get("jobs", []):
            if job.get("job_id") in given:
                job.pop("timings", None)
                if given[job["job_id"]] is not None:
                    job["timings"] = given[job["job_id"]]
        route.fulfill(response=response, json=body)

    page.route("**/lancefn/api/v1/jobs/list*", with_timings)
    open_lab(page, lab.server, workspace="timings-wire")
    open_panel(page)
    cold_text = timings_of(page, cold)
    assert cold_text.inner_text() == "cold start 1.2 s, setup 1.0 s"
    assert cold_text.get_attribute("title") == "queued 15 ms · start 1.2 s · environment 0 ms · setup 1.0 s · run 12 ms"
    assert timings_of(page, warm).inner_text() == "warm"
    assert timings_of(page, legacy).inner_text() == "" and timings_of(page, legacy).is_hidden()
    screenshot(page, "panel-cold-and-warm")
    assert page.errors == []


def test_real_jobs_say_cold_then_warm(page, lab):
    """End to end with the control plane's own timings (issue 24): a new version's first job paid a
    start or a setup, the next one on the same GPU found the worker warm."""
    first, second = finished_jobs(lab, "timings_real", 2)
    open_lab(page, lab.server, workspace="timings-real")
    open_panel(page)
    first_text = timings_of(page, first)
    assert re.fullmatch(
        r"(cold start|environment|setup) [0-9.<]+ (ms|s|min)(, (environment|setup) .+)?", first_text.inner_text()
    )
    assert first_text.get_attribute("title").startswith("queued ")
    assert timings_of(page, second).inner_text() == "warm"
    assert page.errors == []
