"""The kernel's side of a version's environment (docs/ARCHITECTURE.md, "Environments"): the create reply's
``warnings`` become a :class:`LancefnEnvironmentWarning` that ``%%gpu_function`` shows under the cell and the card
notes; ``.local()`` builds and uses the version's environment in the kernel's cache, and refuses what it cannot
honour with ``LocalRunError`` phase ``environment``."""

from __future__ import annotations

import sys
import warnings

import pytest
from helpers import absent_packages, kernel_shell
from IPython.utils.capture import capture_output

from lancefn_jupyter import LancefnEnvironmentWarning
from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client import Client
from lancefn_jupyter.kernel.client._http import Transport
from lancefn_jupyter.kernel.handles.local_run import LocalRunError, run_local

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
FILENAME = "<gpu_function uses@v1>"
CELL = """\
def shout(text: str) -> str:
    return text.upper()
"""


@pytest.fixture
def warned(monkeypatch):
    """Make the create reply carry a warning, as a control plane that cannot honour the environment sends it
    (the real server's side is tested in the integrated test below)."""
    original = Transport.post

    def post(self, path, body=None, *args, **kwargs):
        reply = original(self, path, body, *args, **kwargs)
        if path == "/v1/functions/create":
            reply = {**reply, "warnings": ["python_version=3.99 is not available on this machine (it has 3.11)"]}
        return reply

    monkeypatch.setattr(Transport, "post", post)


@pytest.fixture
def ip(control_plane):
    yield from kernel_shell(control_plane)


def test_register_raises_the_servers_warnings_as_lancefn_environment_warnings(control_plane, warned):
    from lancefn_jupyter.kernel.packaging import package_cell

    namespace: dict = {}
    exec(CELL, namespace)
    packaged = package_cell(CELL, namespace)
    from lancefn_jupyter.kernel.options import build_options
    from lancefn_jupyter.wire.models import FunctionRegistrationRequest

    request = FunctionRegistrationRequest(
        name="shout", artifact=packaged.artifact_request(), signature=packaged.signature,
        runtime=build_options(name="shout").runtime(HERE),
    )  # fmt: skip
    client = Client(control_plane.url, control_plane.api_key)
    with pytest.warns(LancefnEnvironmentWarning, match=r"shout: python_version=3\.99 is not available"):
        version = client.functions.register(request)
    assert version.name == "shout"
    assert issubclass(LancefnEnvironmentWarning, UserWarning)


def test_gpu_function_shows_the_warning_under_the_cell_and_on_the_card_and_again_when_rerun(ip, warned):
    for _ in range(2):  # the second run is a cached registration: it warns again
        with warnings.catch_warnings(record=True) as leaked, capture_output() as out:
            warnings.simplefilter("always")
            ip.run_cell_magic("gpu_function", "num_gpus=1", CELL)
        assert "[lancefn] warning: shout: python_version=3.99 is not available on this machine" in out.stderr
        assert not [w for w in leaked if issubclass(w.category, LancefnEnvironmentWarning)]  # shown once, in words
    handle = ip.user_ns["shout"]
    assert handle.environment_warnings == ("shout: python_version=3.99 is not available on this machine (it has 3.11)",)
    text, markup = handle.card()
    assert "warning: shout: python_version=3.99" in text and "python_version=3.99" in markup


def test_no_warning_no_line(ip):
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "num_gpus=1", CELL)
    assert "warning" not in out.stderr
    assert ip.user_ns["shout"].environment_warnings == ()


# ------------------------------------------------------------------------------ .local()

USES = b"""import importlib
import importlib.metadata
import sys


def uses(name: str) -> str:
    module = importlib.import_module(name)
    return importlib.metadata.version(name) + " " + module.__file__ + " " + sys.executable
"""


def test_local_builds_the_versions_environment_and_the_worker_imports_the_package_the_kernel_lacks():
    package = absent_packages(1)[0]
    request = EnvironmentRequest(packages=(package,), python_version=HERE)
    run = run_local(USES, "uses", FILENAME, [{"name": package}], mode="simulator", environment=request)
    version, path, python = run.results[0].split(" ")
    assert version and python != sys.executable and package in path
    again = run_local(USES, "uses", FILENAME, [{"name": package}], mode="simulator", environment=request)
    assert again.results == run.results  # the same warm worker, on the same environment
    with pytest.raises(LocalRunError) as missing:  # the kernel's own Python still lacks it
        run_local(USES, "uses", FILENAME, [{"name": package}], mode="simulator")
    assert missing.value.phase in ("environment", "run")


def test_local_refuses_a_python_this_machine_lacks_in_phase_environment():
    request = EnvironmentRequest(python_version="3.99")
    with pytest.raises(LocalRunError) as refused:
        run_local(USES, "uses", FILENAME, [{"name": "sys"}], mode="simulator", environment=request)
    assert refused.value.phase == "environment" and "3.99" in refused.value.message


def test_local_of_a_package_that_does_not_exist_fails_in_phase_environment_naming_it():
    request = EnvironmentRequest(packages=("definitely-not-installed-lancefn-pkg",))
    with pytest.raises(LocalRunError) as failed:
        run_local(USES, "uses", FILENAME, [{"name": "sys"}], mode="simulator", environment=request)
    assert failed.value.phase == "environment" and "definitely-not-installed-lancefn-pkg" in failed.value.message


def test_gpu_function_local_uses_the_declared_package(ip):
    package = absent_packages(1)[0]
    cell = f"def uses_it(x: int) -> str:\n    import {package}\n    return {package}.__name__ + str(x)\n"
    with capture_output():
        ip.run_cell_magic("gpu_function", f"num_gpus=1 pip={package}", cell)
    with capture_output() as out:
        assert ip.user_ns["uses_it"].local(3) == f"{package}3"
    assert ".local() ran on" in out.stdout
    assert api.GpuFunction  # the public API still imports


def test_a_python_the_server_lacks_warns_under_the_cell_from_the_real_control_plane(ip):
    with capture_output() as out:
        ip.run_cell_magic("gpu_function", "num_gpus=1 python_version=3.99", CELL)
    assert "[lancefn] warning: shout: " in out.stderr and "3.99" in out.stderr, out.stderr
    assert "3.99" in ip.user_ns["shout"].card()[0]
