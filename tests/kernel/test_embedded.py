"""The embedded control plane: started on first use, reused, replaced when dead or corrupt."""

from __future__ import annotations

import os
import signal
import stat
import time

import httpx
import pytest

from lancefn_jupyter.embedded import ensure_server, read_server_info, stop_server
from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state


def _wait_gone(pid: int) -> None:
    for _ in range(200):
        try:
            os.kill(pid, 0)
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except (ProcessLookupError, ChildProcessError):
            return
        time.sleep(0.05)


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "lancefn-home"
    yield path
    stop_server(path)


def test_start_reuse_replace_and_stop(home):
    first = ensure_server(home)
    assert first.url.startswith("http://127.0.0.1:")
    assert httpx.get(first.url + "/v1/health").json()["status"] == "ok"
    assert stat.S_IMODE(os.stat(home / "server.json").st_mode) == 0o600
    # Reused while alive.
    assert ensure_server(home).pid == first.pid
    # A dead one is replaced.
    os.kill(first.pid, signal.SIGKILL)
    _wait_gone(first.pid)
    second = ensure_server(home)
    assert second.pid != first.pid
    assert httpx.get(second.url + "/v1/health").status_code == 200
    # The key authenticates; no key does not.
    assert httpx.get(second.url + "/v1/gpu/usage").status_code == 401
    assert httpx.get(second.url + "/v1/gpu/usage", headers={"x-api-key": second.api_key}).status_code == 200
    assert stop_server(home) is True
    _wait_gone(second.pid)
    assert stop_server(home) is False


def test_corrupt_server_json_is_replaced(home):
    home.mkdir(parents=True)
    (home / "server.json").write_text("{not json")
    info = ensure_server(home)
    assert read_server_info(home).pid == info.pid
    assert httpx.get(info.url + "/v1/health").status_code == 200


def test_versions_survive_an_embedded_restart(home, monkeypatch):
    monkeypatch.delenv("LANCEFN_URL", raising=False)
    client = api.use_local(str(home))
    handle = api.gpu_function(num_gpus=1)(_triple)
    version = handle.register()
    pid = api.connection_info().pid
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    kernel_session.registered.clear()
    api.use_local(str(home))
    assert api.connection_info().pid != pid
    assert api.current_client().functions.describe(version.name, version.version) == version
    client.close()


def _triple(x: int) -> int:
    return 3 * x
