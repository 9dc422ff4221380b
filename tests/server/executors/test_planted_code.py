"""No planted code (docs/ARCHITECTURE.md, "Isolation"): modules planted in the server's working directory, one the
worker user can write, run neither in the server (``python -m``, as root), nor in its artifact checker, nor in its
workers; each worker runs in a private directory with a reduced environment (real root server, workers as
``nobody``)."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import register, registration_body
from helpers import ONE_GPU, let_workers_reach_this_python, wait_done

from lancefn_jupyter.kernel.client import Client
from lancefn_jupyter.server.executors.isolation import worker_environment
from lancefn_jupyter.wire import dataplane

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root server (workers as another user)")

PLANTED = ("base64", "ast", "pyarrow")

WHERE = """
import os


def where(x: int) -> str:
    return "|".join([os.getcwd(), str(os.stat(os.getcwd()).st_uid), oct(os.stat(os.getcwd()).st_mode & 0o777),
                     os.environ.get("HOME", ""), os.environ.get("PLANTED_SECRET", "-")])
"""


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """(a directory every user can write holding planted modules, the directory they leave markers in)."""
    shared = Path(tempfile.mkdtemp(prefix="lancefn-planted-", dir="/tmp"))
    markers = shared / "markers"
    markers.mkdir()
    for path in (shared, markers):
        path.chmod(0o777)
    for name in PLANTED:
        (shared / f"{name}.py").write_text(
            f"import os\nopen(os.path.join({str(markers)!r}, {name!r} + '-' + str(os.getuid())), 'w').close()\n"
        )
    yield shared, markers
    for path in sorted(shared.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    shared.rmdir()


@pytest.fixture
def planted_server(control_plane_factory, planted) -> tuple:
    """(a root server started in the planted directory, workers as ``nobody``, a secret in its environment; that
    directory; the markers directory)."""
    shared, markers = planted
    let_workers_reach_this_python()
    cp = control_plane_factory(ONE_GPU, env={"LANCEFN_WORKER_USER": "", "PLANTED_SECRET": "s3cret"}, cwd=shared)
    return cp, shared, markers


@as_root
def test_modules_planted_in_the_servers_cwd_run_nowhere(planted_server):
    cp, _shared, markers = planted_server
    with cp.http() as http:
        double = register(http, registration_body("double"))  # a job in a worker (base64 decodes its artifact)
        big = registration_body(
            "big",
            source="PAD = " + repr("x" * 20_000) + "\n\ndef big(x: int) -> int:\n    return x\n",
            entrypoint="big",
        )
        assert len(big["artifact"]["content"]["data"]) > 16 * 1024
        register(http, big)  # over 16 KiB: checked by the artifact_check child (ast)
        client = Client(cp.url, cp.api_key)
        table = dataplane.encode_rows([{"x": 3}, {"x": 4}], {"x": "int64"})
        job_id = client.functions.run("double", double["version"], None, arrow=dataplane.to_ipc_bytes(table))
        assert wait_done(http, job_id)["job_state"] == "DONE"
        result = client.jobs.result(job_id)
        assert (result if isinstance(result, list) else dataplane.decode_results(dataplane.read_ipc(result))) == [6, 8]
    assert sorted(os.listdir(markers)) == []  # no planted module ran, as root or as the worker user


@as_root
def test_a_worker_runs_in_a_private_directory_with_a_reduced_environment(planted_server):
    cp, shared, _markers = planted_server
    with cp.http() as http:
        version = register(http, registration_body("where", source=WHERE, entrypoint="where", output_type="string"))
        reply = http.post(
            "/v1/functions/run", json={"name": "where", "version": version["version"], "rows": [{"x": 1}]}
        )
        job = wait_done(http, reply.json()["job_id"])
    assert job["job_state"] == "DONE", job
    cwd, owner, mode, home, secret = job["result"][0].split("|")
    assert cwd != str(shared) and not cwd.startswith(str(cp.home))
    assert int(owner) == pwd.getpwnam("nobody").pw_uid and mode == "0o700"  # owned by nobody, private
    assert home == cwd
    assert secret == "-"  # the server's other variables stay with the server


def test_a_switched_worker_gets_only_the_variables_it_needs():
    server = {"PATH": "/bin", "LC_ALL": "C", "CUDA_HOME": "/cuda", "AWS_SECRET_ACCESS_KEY": "x", "HF_TOKEN": "y"}
    assert worker_environment(server, switched=True) == {
        "PATH": "/bin",
        "LC_ALL": "C",
        "CUDA_HOME": "/cuda",
        "PYTHONSAFEPATH": "1",
    }
    assert worker_environment(server, switched=False) == {**server, "PYTHONSAFEPATH": "1"}  # a same-user server


def test_the_check_of_a_built_environment_runs_nothing_planted_in_the_servers_cwd(planted, monkeypatch):
    import sys

    from lancefn_jupyter.environments import build

    shared, markers = planted
    (shared / "json.py").write_text(
        f"import os\nopen(os.path.join({str(markers)!r}, 'json-' + str(os.getuid())), 'w').close()\n"
    )
    monkeypatch.chdir(shared)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}  # however the server was started
    plan = build.Plan(python=sys.executable, requirements=(), base=None, preferred={}, uv="uv", uv_args=(), env=env)
    with build._workspace(plan) as work:  # a build's private directory: its processes' cwd
        build._check(sys.executable, [], work)  # imports json (and lancefn_jupyter.worker) in the environment's Python
    assert list(markers.iterdir()) == []
