"""Shared fixtures: a real ``lancefn-server`` subprocess on 127.0.0.1 per test.

    def test_x(control_plane):                     # default: simulated `default` class, 2 GPUs
        with control_plane.http() as http:         # httpx.Client with base_url + x-api-key
            http.get("/v1/gpu/classes")

    def test_y(control_plane_factory):
        cp = control_plane_factory(gpu_classes=TOML_TEXT, env={...}, args=[...], api_keys=TOML_TEXT)
        cp.kill(); cp.restart()                    # SIGKILL, then a new server on the same home

Isolation: the child gets a fresh home under ``tmp_path``, ``--port 0``, and an environment
without the developer's ``LANCEFN_*`` settings; ``LANCEFN_DISABLE_NVML=1`` is set unless a
test overrides it, so the default class is the simulated one on every machine (GPU tests
pass ``gpu_classes=`` or ``env={"LANCEFN_DISABLE_NVML": "0"}``).  Every process started
here is stopped at teardown.  Server output goes to ``<home>/../server-N.log`` and is shown
when a start fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

SERVER_CMD = [sys.executable, "-m", "lancefn_jupyter.server.cli"]
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
_SCRUBBED_ENV = ("LANCEFN_HOME", "LANCEFN_API_KEY", "LANCEFN_GPU_CLASSES", "LANCEFN_URL")


def _session_env_cache() -> Path:
    """One environment cache for the whole run (docs/ARCHITECTURE.md, "Environments"), never the developer's: every
    server and kernel the tests start inherits ``LANCEFN_ENV_CACHE``. World-traversable (0755, under /tmp) so a
    root server's ``nobody`` workers can read it; removed at the end of the run."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="lancefn-envs-", dir="/tmp" if os.path.isdir("/tmp") else None))
    path.chmod(0o755)
    os.environ["LANCEFN_ENV_CACHE"] = str(path)
    return path


ENV_CACHE = _session_env_cache()


def remove_tree(path: Path) -> None:
    """``rm -rf`` of a tree whose directories may be read-only (built environments are)."""
    import shutil

    if not path.exists():
        return
    for parent, dirs, _files in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(parent, name), 0o755)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    remove_tree(ENV_CACHE)


# Under pytest-xdist (scripts/test.sh runs the suite on several workers, --dist loadgroup): the tests that start a
# Ray cluster run one after another on one worker, as do the browser tests (each starts JupyterLab and Chromium), so
# that the machine never carries two of either at once; everything else spreads over the workers. The two groups are
# the longest units, so they are collected first (each module's tests stay together and in order): they start at
# once rather than last.
_SERIAL_GROUPS = ("ray", "browser")


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist") or not getattr(config.option, "numprocesses", None):
        return
    rank = {}
    for item in items:
        group = next((name for name in _SERIAL_GROUPS if item.get_closest_marker(name)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        rank[item.nodeid] = _SERIAL_GROUPS.index(group) if group is not None else len(_SERIAL_GROUPS)
    items.sort(key=lambda item: rank[item.nodeid])


class ControlPlaneProcess:
    """A running ``lancefn-server`` child process and how to reach it."""

    def __init__(self, home: Path, *, args: list[str], env: dict[str, str], log_dir: Path, cwd: Path | None = None):
        self.home = home
        self.args = list(args)
        self.env = env
        self.cwd = cwd  # the server's working directory (None: the test's)
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.api_key = ""
        self.log_path: Path | None = None
        self._starts = 0

    # ------------------------------------------------------------------ info

    @property
    def command(self) -> list[str]:
        """The exact command line used (handy for starting a competing server)."""
        return [*SERVER_CMD, "--home", str(self.home), "--port", "0", *self.args]

    @property
    def client_headers(self) -> dict[str, str]:
        return {"x-api-key": self.api_key}

    @property
    def server_json(self) -> Path:
        return self.home / "server.json"

    def info(self) -> dict:
        return json.loads(self.server_json.read_text())

    def http(self, key: str | None = None, **kwargs) -> httpx.Client:
        """``httpx.Client`` bound to this server with ``key`` (default: the admin key); use as a context manager."""
        kwargs.setdefault("timeout", 30.0)
        headers = {"x-api-key": key} if key is not None else self.client_headers
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    # ------------------------------------------------------------- lifecycle

    def start(self) -> ControlPlaneProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self._starts += 1
        self.log_path = self.log_dir / f"server-{self.home.name}-{self._starts}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"lancefn-server exited with {self.proc.returncode} during startup:\n{self.log_text()}"
                )
            info = self._ready_info()
            if info is not None:
                self.url, self.api_key = info["url"], info["api_key"]
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"lancefn-server did not become ready in {START_TIMEOUT_S}s:\n{self.log_text()}")
            time.sleep(0.05)

    def _ready_info(self) -> dict | None:
        try:
            info = self.info()
        except (OSError, ValueError):
            return None
        if info.get("pid") != self.proc.pid:
            return None  # a stale file from a killed predecessor
        try:
            if httpx.get(info["url"] + "/v1/health", timeout=2.0).status_code == 200:
                return info
        except httpx.HTTPError:
            pass
        return None

    def stop(self) -> int | None:
        """SIGTERM and wait (SIGKILL if it does not stop in time); returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: the server gets no chance to clean up (durability tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> ControlPlaneProcess:
        """Stop (if still running) and start again on the same home; ``url`` may change."""
        self.stop()
        return self.start()


def http(cp: ControlPlaneProcess, **kwargs) -> httpx.Client:
    """Plain-httpx client for ``cp`` with its admin key."""
    return cp.http(**kwargs)


def make_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env["LANCEFN_DISABLE_NVML"] = "1"
    # Workers run as the test's own user; isolation tests pass LANCEFN_WORKER_USER="" to get the
    # product default (an unprivileged user when the server runs as root, as in CI).
    env["LANCEFN_WORKER_USER"] = str(os.geteuid())
    env.update(extra or {})
    return env


class _Factory:
    """Starts servers in fresh homes and stops them all at ``close``."""

    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self.started: list[ControlPlaneProcess] = []

    def __call__(
        self,
        gpu_classes: str | None = None,
        *,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        api_keys: str | None = None,
        executor: str = "local",
        home: Path | None = None,
        start: bool = True,
        cwd: Path | None = None,
    ) -> ControlPlaneProcess:
        base = self._tmp.mktemp("lancefn")
        home = Path(home) if home is not None else base / "home"
        argv = list(args or [])
        if gpu_classes is not None:
            path = base / "gpu_classes.toml"
            path.write_text(gpu_classes)
            argv += ["--gpu-classes", str(path)]
        if api_keys is not None:
            path = base / "api_keys.toml"
            path.write_text(api_keys)
            path.chmod(0o600)  # the server refuses a key file others can read
            argv += ["--api-keys", str(path)]
        if executor != "local":
            argv += ["--executor", executor]
        cp = ControlPlaneProcess(home, args=argv, env=make_env(env), log_dir=base, cwd=cwd)
        self.started.append(cp)
        return cp.start() if start else cp

    def close(self) -> None:
        for cp in self.started:
            try:
                cp.stop()
            except Exception:  # teardown must reach every process
                cp.kill()


@pytest.fixture
def control_plane_factory(tmp_path_factory) -> Iterator[Callable[..., ControlPlaneProcess]]:
    """``factory(gpu_classes=None, *, env=None, args=None, api_keys=None, executor="local",
    home=None, start=True, cwd=None) -> ControlPlaneProcess``; all stopped at teardown."""
    factory = _Factory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_control_plane_factory(tmp_path_factory) -> Iterator[Callable[..., ControlPlaneProcess]]:
    """``control_plane_factory`` for a whole test module: servers that several of its tests share."""
    factory = _Factory(tmp_path_factory)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def shared_control_plane(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    """One default server for a whole test module: for tests that only read or that
    tolerate each other's functions and jobs (e.g. bad-input tables)."""
    factory = _Factory(tmp_path_factory)
    yield factory()
    factory.close()


@pytest.fixture(scope="session")
def _ray_session_cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    pytest.importorskip("ray")
    from helpers import module_ray_server  # helpers imports this module, so not at the top

    with module_ray_server(tmp_path_factory) as cp:
        yield cp


@pytest.fixture(scope="module")
def ray_cp(_ray_session_cp) -> ControlPlaneProcess:
    """One ``lancefn-server --executor ray`` on its own local Ray with ``helpers.RAY_CLASSES`` (``small``: 2 simulated
    GPUs, ``big``: 1), shared by every module that uses it: a Ray cluster costs ~20 s of a 2-core machine to start, so
    it starts once per session. Tests tolerate each other's functions and jobs; a module whose tests stopped it (e.g.
    test_ray_executor.py's last ones) leaves it to be started again here. Skips where Ray is missing."""
    from helpers import ray_driver

    if _ray_session_cp.proc is None or _ray_session_cp.proc.poll() is not None:
        _ray_session_cp.start()
        _ray_session_cp.sessions.append(ray_driver(_ray_session_cp).pid)
    return _ray_session_cp


@pytest.fixture
def control_plane(control_plane_factory) -> ControlPlaneProcess:
    """A server with the default (simulated, 2 GPUs) class."""
    return control_plane_factory()


@pytest.fixture
def ip(control_plane):
    """An IPython shell with the extension loaded, connected to ``control_plane``."""
    from helpers import kernel_shell  # helpers imports this module: not at the top

    yield from kernel_shell(control_plane)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Headless Debian Chromium for a browser test module (``browser_util.launch_chromium``); pages come from
    ``browser_util.browser_page``."""
    from browser_util import launch_chromium
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = launch_chromium(p)
        try:
            yield launched
        finally:
            launched.close()


# ------------------------------------------------------------- request bodies by hand

DOUBLE_SOURCE = "from __future__ import annotations\n\n\ndef double(x: int) -> int:\n    return 2 * x\n"


def registration_body(
    name: str = "double",
    *,
    source: str = DOUBLE_SOURCE,
    entrypoint: str = "double",
    inputs: tuple[tuple[str, str, bool], ...] = (("x", "int64", False),),
    output_type: str = "int64",
    num_gpus: int | None = 1,
    gpu_class: str | None = None,
    packages: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    bundle: dict[str, str] | None = None,
) -> dict:
    """A FunctionRegistrationRequest as plain JSON data (base64 artifact, sha256 digest),
    built without ``lancefn_jupyter.kernel.packaging``.  ``num_gpus=None`` → a CPU (``python``) function.
    ``bundle``: LanceDB 0.40's ``python_bundle`` of these files (path → source) beside ``source`` as its entry."""
    import base64
    import hashlib

    if bundle is not None:
        source = json.dumps({"files": {"user_function.py": source, **bundle}}, sort_keys=True)
    data = source.encode("utf-8")
    runtime: dict = {
        "kind": "python_v2" if num_gpus is not None else "python",
        "python_version": f"{sys.version_info.major}.{sys.version_info.minor}",  # the base: no environment to build
        "environment": {"kind": "pip", "packages": list(packages)},
    }
    if num_gpus is not None:
        runtime["resources"] = {"num_gpus": num_gpus, **({"gpu_class": gpu_class} if gpu_class else {})}
    if env:
        runtime["env"] = env
    return {
        "name": name,
        "artifact": {
            "kind": "python_callable" if bundle is None else "python_bundle",
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "entrypoint": entrypoint,
            "content": {"encoding": "base64", "data": base64.b64encode(data).decode()},
            "adapter": {"kind": "scalar_to_arrow_batch", "version": 1},
        },
        "signature": {
            "inputs": [{"name": n, "arrow_type": t, "nullable": nullable} for n, t, nullable in inputs],
            "output": {"kind": "scalar", "arrow_type": output_type, "nullable": False},
        },
        "runtime": runtime,
    }


INT_INPUT = (("n", "int64", False),)


def python_body(name: str, source: str, inputs=INT_INPUT, output_type: str = "int64") -> dict:
    """:func:`registration_body` of a CPU (``python``) function whose entry is named like the function."""
    return registration_body(
        name, source=source, entrypoint=name, inputs=inputs, output_type=output_type, num_gpus=None
    )


@pytest.fixture
def make_registration() -> Callable[..., dict]:
    """The :func:`registration_body` builder, as a fixture for tests in any module."""
    return registration_body


def register(client: httpx.Client, body: dict) -> dict:
    """POST /v1/functions/create and return the finished job's FunctionVersion (asserts success)."""
    reply = client.post("/v1/functions/create", json=body)
    assert reply.status_code == 202, reply.text
    job = client.post("/v1/jobs/describe", json={"job_id": reply.json()["job_id"]}).json()
    assert job["job_state"] == "DONE", job
    return job["result"]
