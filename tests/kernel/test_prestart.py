"""The first `%%gpu_function` starts the embedded control plane before its own imports and
packaging (`embedded.prestart`), and the connection adopts that process instead of starting a
second one."""

from __future__ import annotations

import httpx
import pytest
from IPython.core.interactiveshell import InteractiveShell

from lancefn_jupyter import embedded
from lancefn_jupyter.embedded import ensure_server, prestart, read_server_info, stop_server
from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "lancefn-home"
    monkeypatch.setenv("LANCEFN_HOME", str(path))
    monkeypatch.delenv("LANCEFN_URL", raising=False)
    yield path
    embedded._starting.pop(path, None)
    stop_server(path)


def test_a_prestarted_server_is_adopted_not_started_twice(home):
    prestart(home)
    spawned = embedded._starting[home]
    prestart(home)  # already starting: no second process
    assert embedded._starting[home] is spawned
    info = ensure_server(home)
    assert info.pid == spawned.pid and home not in embedded._starting
    assert httpx.get(info.url + "/v1/health").json()["status"] == "ok"
    prestart(home)  # one is recorded alive: nothing to start
    assert home not in embedded._starting


def test_a_prestarted_server_that_failed_is_replaced_by_a_working_one(home):
    home.mkdir(parents=True)
    (home / "classes.toml").write_text("this is not toml [")
    embedded._starting[home] = embedded._spawn(home, str(home / "classes.toml"))  # exits: bad config
    embedded._starting[home].wait(60)
    info = ensure_server(home)
    assert httpx.get(info.url + "/v1/health").status_code == 200
    assert read_server_info(home).pid == info.pid


def test_the_first_gpu_function_cell_prestarts_and_registers_on_that_server(home, monkeypatch):
    shell = InteractiveShell.instance()
    shell.reset()
    monkeypatch.setattr(kernel_session, "client", None)
    monkeypatch.setattr(kernel_session, "info", None)
    kernel_session.registered.clear()
    spawned: list = []
    real_spawn = embedded._spawn
    monkeypatch.setattr(embedded, "_spawn", lambda *a: spawned.append(real_spawn(*a)) or spawned[-1])
    shell.run_line_magic("load_ext", "lancefn_jupyter")
    result = shell.run_cell("%%gpu_function num_gpus=1\ndef first(x: float) -> float:\n    return x + 1\n")
    assert result.success
    assert len(spawned) == 1  # started once, by the prestart, and adopted
    assert api.connection_info().pid == spawned[0].pid
    assert shell.user_ns["first"].remote(1.0) == 2.0
    shell.reset()
