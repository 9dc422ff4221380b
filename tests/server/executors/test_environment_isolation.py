"""A root server's environments never run package code as root, and one team's build never reaches another team's
jobs (docs/ARCHITECTURE.md, "Environments" and "Isolation").

Two namespaces on a root server with ``--worker-uids``: a direct reference's PEP 517 backend runs as the namespace's
uid and cannot read the admin key (and is refused without ``--allow-direct-references``); option lines are refused
at registration; a ``uv.toml`` and a fake wheel planted in the server's working directory are never read; the same
``pip=`` of two namespaces builds two environments, each readable only by its own namespace; a built environment
holds nothing world-writable and nothing its builder owns.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import register, registration_body, remove_tree
from helpers import (
    ONE_GPU,
    absent_packages,
    left_daemon,
    let_workers_reach_this_python,
    reporting_project,
    submit,
    tiny_wheel,
    two_teams,
    wait_done,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root server (builds as other uids)")

A_KEY, B_KEY = "envs-team-a-key-0001", "envs-team-b-key-0002"
KEYS = two_teams(A_KEY, B_KEY)
RANGE = "61020-61029"
PLANTED, SHARED = absent_packages(2)

PROBE = """
import importlib
import os
import sys


def probe(target: str) -> str:
    if target.startswith("/"):  # another environment: can this uid read it?
        try:
            os.listdir(target)
        except PermissionError:
            return "denied"
        return "listed"
    module = importlib.import_module(target)
    return f"{os.getuid()}|{sys.prefix}|{module.__file__}|{getattr(module, '__version__', '?')}"
"""


def _body(name: str, packages: tuple[str, ...]) -> dict:
    return registration_body(
        name, source=PROBE, entrypoint="probe", inputs=(("target", "utf8", False),), output_type="utf8",
        packages=packages,
    )  # fmt: skip


@pytest.fixture(scope="module")
def env_cache() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lancefn-enviso-", dir="/tmp"))
    path.chmod(0o755)  # the namespaces' uids reach their own directories in it
    yield path
    remove_tree(path)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    """The server's working directory, where a team planted a ``uv.toml`` pointing at its fake wheel of
    ``PLANTED`` (a version above every real one)."""
    cwd = tmp_path_factory.mktemp("server-cwd")
    (cwd / "wheels").mkdir()
    tiny_wheel(cwd / "wheels", PLANTED, "99.0", source="__version__ = '99.0'\nPOISONED = True\n")
    (cwd / "uv.toml").write_text(f'[pip]\nfind-links = ["{cwd / "wheels"}"]\nprerelease = "allow"\n')
    return cwd


def _server(factory, cache: Path, *args: str, cwd: Path | None = None, **env: str):
    let_workers_reach_this_python()
    return factory(
        ONE_GPU,
        api_keys=KEYS,
        env={"LANCEFN_WORKER_USER": "", "LANCEFN_ENV_CACHE": str(cache), **env},
        args=["--worker-uids", RANGE, *args],
        cwd=cwd,
    )


def _refused(http, name: str, packages: tuple[str, ...]) -> str:
    reply = http.post("/v1/functions/create", json=_body(name, packages))
    assert reply.status_code == 400, reply.text
    return reply.json()["error"]["message"]


def _run(http, name: str, version: str, target: str) -> dict:
    return wait_done(http, submit(http, name, version, [{"target": target}]))


def test_a_direct_references_backend_runs_as_the_namespaces_uid_and_is_refused_without_the_flag(
    control_plane_factory, env_cache
):
    allowing = _server(control_plane_factory, env_cache, LANCEFN_ALLOW_DIRECT_REFERENCES="1")
    admin_key = (allowing.home / "api_key").read_text().strip()
    with reporting_project(allowing.home / "api_key") as reference:
        with allowing.http(A_KEY, timeout=60.0) as a:
            version = register(a, _body("evil", (reference,)))["version"]
            job = _run(a, "evil", version, "evilpkg")
            logs = a.post("/v1/jobs/logs", json={"job_id": job["job_id"]}).json()["lines"]
        assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "environment", job
        message = job["failure"]["message"]
        assert "evilpkg backend: uid 610" in message and "api_key PermissionError" in message, message
        uid = int(message.split("evilpkg backend: uid ")[1].split(",")[0])
        assert uid in range(61020, 61030)  # the namespace's own uid, never root
        assert admin_key not in message and admin_key not in "\n".join(logs)
        # What the backend detached ended with its build step (a pid namespace of its own), before the seal
        daemon = left_daemon(reference)
        assert daemon is not None and not _alive(daemon), daemon

        strict = _server(control_plane_factory, env_cache)  # two namespaces, no flag: refused at registration
        with strict.http(A_KEY) as a:
            refusal = _refused(a, "evil", (reference,))
        assert reference in refusal and "is a direct reference" in refusal and "--allow-direct-references" in refusal


def test_option_lines_are_refused_at_registration_and_no_file_they_name_is_read(control_plane_factory, env_cache):
    cp = _server(control_plane_factory, env_cache, "--allow-direct-references")
    key_file = cp.home / "api_key"
    admin_key = key_file.read_text().strip()
    with cp.http(A_KEY) as a:
        for entry in (f"-r {key_file}", "-c /etc/shadow", f"numpy\n-r {key_file}", "--index-url=file:///tmp"):
            message = _refused(a, "opt", ("numpy", entry))
            assert message.startswith(f"runtime.environment.packages: pip entry {entry!r} "), message
            assert "numpy>=1.26" in message and admin_key not in message
        assert a.post("/v1/functions/list", json={}).json()["functions"] == []


@pytest.fixture(scope="module")
def two_teams(module_control_plane_factory, env_cache, planted):
    """One root server of two namespaces, started in a working directory a team planted a ``uv.toml`` in; the
    same ``pip=`` run by each: ``{"a": (uid, prefix, file, version), "b": …}``."""
    cp = _server(module_control_plane_factory, env_cache, cwd=planted)
    outcomes = {}
    for team, key in (("a", A_KEY), ("b", B_KEY)):
        with cp.http(key, timeout=60.0) as http:
            version = register(http, _body("shared", (SHARED, PLANTED)))["version"]
            job = _run(http, "shared", version, PLANTED)
            assert job["job_state"] == "DONE", job
            uid, prefix, module_file, module_version = job["result"][0].split("|")
            shared = _run(http, "shared", version, SHARED)["result"][0].split("|")
            outcomes[team] = (int(uid), Path(prefix), module_file, module_version, shared)
    return cp, outcomes


def test_a_uv_toml_planted_in_the_servers_working_directory_is_not_read(two_teams):
    _cp, outcomes = two_teams
    for uid, prefix, module_file, module_version, _shared in outcomes.values():
        assert module_version != "99.0", (uid, module_version)  # the index's package, not the planted wheel
        assert module_file.startswith(str(prefix))


def test_the_same_pip_of_two_namespaces_runs_in_two_environments_each_unreadable_by_the_other(two_teams, env_cache):
    cp, outcomes = two_teams
    (uid_a, prefix_a, *_), (uid_b, prefix_b, *_) = outcomes["a"], outcomes["b"]
    assert uid_a != uid_b and prefix_a != prefix_b
    assert prefix_a.parent == env_cache / f"uid-{uid_a}" and prefix_b.parent == env_cache / f"uid-{uid_b}"
    assert outcomes["a"][4][1] == str(prefix_a) and outcomes["b"][4][1] == str(prefix_b)
    with cp.http(A_KEY, timeout=60.0) as a:
        version = register(a, _body("shared", (SHARED, PLANTED)))["version"]
        assert _run(a, "shared", version, str(prefix_b))["result"] == ["denied"]
        assert _run(a, "shared", version, str(prefix_a))["result"] == ["listed"]
    as_a = subprocess.run(
        [sys.executable, "-c", "import sys; open(sys.argv[1])", str(prefix_b / "pyvenv.cfg")],
        user=uid_a, group=uid_a, extra_groups=[], capture_output=True, text=True, cwd="/", timeout=60,
    )  # fmt: skip
    assert as_a.returncode != 0 and "PermissionError" in as_a.stderr


def test_a_built_environment_holds_nothing_world_writable_and_nothing_its_builder_owns(two_teams):
    _cp, outcomes = two_teams
    for uid, prefix, *_ in outcomes.values():
        assert stat.S_IMODE((prefix / ".lock").lstat().st_mode) == 0o644  # uv makes it 0666
        for parent, dirs, files in os.walk(prefix):
            for name in [".", *dirs, *files]:
                found = os.lstat(os.path.join(parent, name))
                assert found.st_uid == 0 != uid, os.path.join(parent, name)
                if not stat.S_ISLNK(found.st_mode):
                    assert not found.st_mode & 0o022, (os.path.join(parent, name), oct(found.st_mode))
                    assert not found.st_mode & (stat.S_ISUID | stat.S_ISGID), os.path.join(parent, name)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
