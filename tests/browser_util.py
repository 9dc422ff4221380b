"""Shared helpers for tests that run a real Jupyter server / JupyterLab and a real browser.

- `JupyterProcess` / `start_jupyter(...)`: `jupyter lab` or `jupyter server` as a subprocess on
  127.0.0.1 with a free port, a token, a non-root `base_url` (default `/jl/`), and its own config,
  data, runtime, settings and workspaces directories, so nothing leaks between tests or from the
  user's setup. The lancefn server extension is enabled through that config (or disabled, to test
  the panel's "not enabled" message). A copy of the freshly built labextension
  (`lancefn_jupyter/labextension`) is put first on `JUPYTER_PATH` (`install_labextension`), so the browser
  runs the current build even when an older copy is installed.
- `jupyter_with_control_plane(base, app)`: a control plane and a `jupyter <app>` whose kernels use it.
- `launch_chromium(playwright)`: Debian's `/usr/bin/chromium` driven by the PyPI `playwright`
  package (never `playwright install`); `browser_page(browser)`: a page that keeps its console messages.
- `open_lab(page, server)`, `screenshot(page, name)` (→ `test-artifacts/<name>.png`).
- `notebook(cells)`, and `WAIT_FOR_FILE_CELL`: a GPU function whose jobs run until the test creates a file.

Every wait is bounded. Processes are started in their own session and stopped by their own pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = os.environ.get("LANCEFN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
LABEXTENSION_NAME = "lancefn-jupyter"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def built_labextension() -> Path | None:
    """The built labextension (`lancefn_jupyter/labextension`), or None when it was never built."""
    import lancefn_jupyter

    path = Path(lancefn_jupyter.__file__).resolve().parent / "labextension"
    return path if (path / "package.json").is_file() and (path / "static" / "style.js").is_file() else None


def install_labextension(built: Path, labextensions: Path) -> None:
    """Puts the built labextension into a `labextensions` directory on `JUPYTER_PATH`: a copy, as an install
    makes (Voilà's file handler refuses a symlink that leads out of its directories; JupyterLab's follows it)."""
    target = labextensions / LABEXTENSION_NAME
    if not target.exists():
        shutil.copytree(built, target)


def panel_missing_reason() -> str | None:
    """Why a test of the side panel cannot run here (no Chromium or playwright, or no built labextension), or None."""
    missing = chromium_missing_reason()
    if missing is None and built_labextension() is None:
        return "the labextension is not built: `pip install -e .` (or `npm run build:prod` in labextension/)"
    return missing


def chromium_missing_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does it when root)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    return None


@dataclass
class JupyterProcess:
    """A running `jupyter lab|server`. `base` is the absolute base URL, ending in '/'."""

    proc: subprocess.Popen
    port: int
    base_url: str
    token: str
    root_dir: Path
    log_path: Path
    env: dict = field(repr=False, default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def url(self, path: str = "") -> str:
        return self.base + path.lstrip("/")

    def lab_url(self, path: str = "", workspace: str | None = None) -> str:
        """`<base>lab[/workspaces/<ws>][/tree/<path>][?token=...]`. A named workspace keeps tests
        that share a server from restoring each other's layout."""
        url = "lab"
        if workspace:
            url += f"/workspaces/{workspace}"
        if path:
            url += f"/tree/{path}"
        return self.url(f"{url}?token={self.token}") if self.token else self.url(url)

    def auth_headers(self) -> dict:
        return {"Authorization": f"token {self.token}"} if self.token else {}

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        stop_process_group(self.proc, timeout)


def start_logged(command: list[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> subprocess.Popen:
    """`command` in its own session (so `stop_process_group` stops what it starts too), output into `log_path`."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=str(cwd),
            start_new_session=True,
        )


def stop_process_group(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM to the process group `start_logged` made (the process and what it started), SIGKILL after `timeout`."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def start_jupyter(
    workdir: Path,
    *,
    app: str = "lab",
    base_url: str = "/jl/",
    token: str = "lancefn-test-token",
    env: Mapping[str, str] | None = None,
    server_extension: bool = True,
    labextension: bool = True,
    extra_args: tuple[str, ...] = (),
    timeout: float = 90.0,
) -> JupyterProcess:
    """Starts `jupyter <app>` and waits until it answers `GET <base>api/status`.

    `env` is added to the process environment (e.g. `LANCEFN_URL`, `LANCEFN_API_KEY`,
    `LANCEFN_HOME`). `server_extension=False` disables the lancefn server extension.
    """
    workdir = Path(workdir)
    config_dir = workdir / "config"
    data_dir = workdir / "data"
    runtime_dir = workdir / "runtime"
    root_dir = workdir / "root"
    jpath = workdir / "jupyter_path"
    for d in (config_dir, data_dir, runtime_dir, root_dir, jpath / "labextensions"):
        d.mkdir(parents=True, exist_ok=True)
    (config_dir / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"lancefn_jupyter": server_extension}}})
    )
    # Quiet JupyterLab: no news prompt and no update check (the machine is offline).
    labconfig = config_dir / "labconfig"
    labconfig.mkdir(exist_ok=True)
    (labconfig / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}})
    )
    built = built_labextension()
    if labextension and built is not None:
        install_labextension(built, jpath / "labextensions")

    port = free_port()
    log_path = workdir / f"jupyter-{app}-{port}.log"
    process_env = dict(os.environ)
    for key in ("LANCEFN_URL", "LANCEFN_API_KEY", "JUPYTER_TOKEN"):
        process_env.pop(key, None)
    process_env.update(
        {
            "JUPYTER_CONFIG_DIR": str(config_dir),
            "JUPYTER_DATA_DIR": str(data_dir),
            "JUPYTER_RUNTIME_DIR": str(runtime_dir),
            "JUPYTER_PATH": str(jpath),
            "JUPYTERLAB_SETTINGS_DIR": str(workdir / "lab-settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(workdir / "lab-workspaces"),
            "IPYTHONDIR": str(workdir / "ipython"),
            "LANCEFN_HOME": str(workdir / "lancefn-home"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    process_env.update(env or {})
    bindir = Path(sys.executable).parent
    jupyter = bindir / "jupyter"
    command = [
        str(jupyter) if jupyter.exists() else shutil.which("jupyter") or "jupyter",
        app,
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--ServerApp.base_url={base_url}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
    ]
    if app == "lab":
        command += ["--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    command += list(extra_args)
    proc = start_logged(command, log_path, process_env, root_dir)
    server = JupyterProcess(proc, port, base_url, token, root_dir, log_path, env=process_env)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter {app} exited with {proc.returncode}:\n{server.log()[-4000:]}")
        try:
            r = httpx.get(server.url("api/status"), headers=server.auth_headers(), timeout=2.0)
            if r.status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"jupyter {app} did not answer within {timeout:.0f}s:\n{server.log()[-4000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def running_jupyter(workdir: Path, **kwargs) -> Iterator[JupyterProcess]:
    server = start_jupyter(workdir, **kwargs)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def jupyter_with_control_plane(base: Path, app: str) -> Iterator[tuple]:
    """A control plane (home `base/home`, simulated classes) and a tokened `jupyter <app>` under `base/jupyter`
    whose kernels and proxy use it; yields (control plane, `JupyterProcess`) and stops both."""
    from conftest import ControlPlaneProcess, make_env

    cp = ControlPlaneProcess(base / "home", args=[], env=make_env(), log_dir=base).start()
    try:
        with running_jupyter(
            base / "jupyter", app=app, env={"LANCEFN_URL": cp.url, "LANCEFN_API_KEY": cp.api_key}
        ) as server:
            yield cp, server
    finally:
        cp.stop()


def launch_chromium(playwright, **kwargs):
    """Headless Debian Chromium through Playwright (`executable_path`, never `playwright install`)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True, **kwargs)


@contextlib.contextmanager
def browser_page(browser, *, timeout_ms: int, height: int = 1000) -> Iterator:
    """A page 1400 px wide in a fresh context (closed after). It keeps what the page said: `page.console_messages`
    ("<type>: <text>" for console messages, "pageerror: <error>" for uncaught errors) and `page.errors` (the
    uncaught errors alone)."""
    context = browser.new_context(viewport={"width": 1400, "height": height})
    page = context.new_page()
    page.set_default_timeout(timeout_ms)
    page.console_messages, page.errors = [], []

    def page_error(exc) -> None:
        page.errors.append(str(exc))
        page.console_messages.append(f"pageerror: {exc}")

    page.on("console", lambda m: page.console_messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", page_error)
    try:
        yield page
    finally:
        context.close()


def open_lab(
    page, server: JupyterProcess, path: str = "", workspace: str | None = None, timeout_ms: int = 90_000
) -> None:
    """Opens JupyterLab (optionally a file, in a named workspace) and waits until the shell is up
    and the splash screen is gone."""
    page.goto(server.lab_url(path, workspace), timeout=timeout_ms)
    wait_lab_ready(page, timeout_ms)


def wait_lab_ready(page, timeout_ms: int = 90_000) -> None:
    page.wait_for_selector("#jp-main-dock-panel", timeout=timeout_ms)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=timeout_ms)


def run_command(page, label: str, timeout_ms: int = 30_000) -> None:
    """Runs a command through the command palette, by its label. The palette opens with
    Ctrl+Shift+C, or through View › Activate Command Palette when an editor kept the keys. The
    palette is modal and closes when something else takes focus while JupyterLab settles, so
    each try is short and retried."""
    palette_input = page.locator(".lm-CommandPalette-input")
    deadline = time.monotonic() + timeout_ms / 1000
    attempt = 0
    while True:
        attempt += 1
        try:
            if not palette_input.is_visible():
                page.keyboard.press("Escape")
                if attempt % 2:
                    page.keyboard.press("Control+Shift+C")
                else:
                    page.locator(".lm-MenuBar-itemLabel", has_text="View").first.click(timeout=3_000)
                    page.locator(".lm-Menu-itemLabel", has_text="Activate Command Palette").first.click(timeout=3_000)
            palette_input.fill(label, timeout=3_000)
            item = page.locator(".lm-CommandPalette-item", has_text=label).first
            item.click(timeout=3_000)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            page.wait_for_timeout(250)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# ------------------------------------------------------------------ notebooks and deterministic jobs


def notebook(cells: list[str]) -> dict:
    """An nbformat 4 notebook (JSON data) of code cells `c0`, `c1`, … with these sources, for a Python 3 kernel."""
    return {
        "cells": [
            {"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [], "source": s}
            for i, s in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


# A notebook cell: `wait_for_file(path)`, a one-GPU function whose job runs until the test creates `path`.
WAIT_FOR_FILE_CELL = (
    "%%gpu_function num_gpus=1\n"
    "def wait_for_file(path: str) -> str:\n"
    "    import os, time\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    return path\n"
)


def register_gate_function(http: httpx.Client, *, name: str = "wait_for", num_gpus: int = 1) -> str:
    """Registers a function whose job runs until the test creates its file (helpers.HOLD_SOURCE):
    state changes happen when the test says so, never by timing. Returns its version id."""
    from helpers import hold_version

    return hold_version(http, name, num_gpus)


def submit_gate_job(http: httpx.Client, name: str, version: str, gate: Path, *, timeout_s: float = 300) -> str:
    from helpers import submit

    return submit(http, name, version, [{"path": str(gate)}], timeout_s=timeout_s)


def wait_job_state(http: httpx.Client, job_id: str, states: set[str], timeout: float = 30.0) -> dict:
    """Polls `jobs/describe` (bounded) until the job is in one of `states`."""
    from helpers import wait_state

    return wait_state(http, job_id, *states, timeout=timeout)
