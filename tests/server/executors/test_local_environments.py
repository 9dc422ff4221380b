"""A version's environment on the local executor over real HTTP (docs/ARCHITECTURE.md, "Environments"): the
plane builds it with uv in its cache before the job queues (PENDING with a pending reason, no GPU held), once
per key, its output in the job's logs; the job's worker runs its Python (the declared package imports, the
base's numpy too; a pin beside the base's other version wins); the next job and another version of the same
packages use it; failures and refusals are phase ``environment`` (and registration warnings); a job cannot
write into it; a batch builds once; a SIGKILL of the server mid-build, then a restart, still runs the job.

The server runs as root here, so its workers run as ``nobody`` (``LANCEFN_WORKER_USER=""``), each module with its
own world-readable cache, and builds run as ``nobody`` too: its environments live in ``<cache>/uid-<nobody>/``. Builds are made to wait, where a test must see a job waiting, by holding the cache's
build lock (``.locks/<key>.build``), exactly as another process building the same environment would.

Packages: four small ones the server's Python lacks (``absent_packages``: picked at run time); six is there at
another version than the pin (``SIX``: 1.16.0, or 1.15.0 where the base has 1.16.0).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import register, registration_body, remove_tree
from helpers import absent_packages, describe, let_workers_reach_this_python, submit, wait_done, wait_until

from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.environments.cache import EnvironmentCache

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"  # the base's: environments layer over it

PROBE = """from __future__ import annotations


def probe(module: str) -> str:
    import importlib
    import sys

    import numpy

    imported = importlib.import_module(module)
    version = getattr(imported, "__version__", "?")
    return f"{version}|{imported.__file__}|{numpy.__version__}|{sys.prefix}"
"""

WRITE = """from __future__ import annotations


def write(where: str) -> str:
    import os
    import site
    import sys

    target = sys.prefix if where == "prefix" else site.getsitepackages()[0]
    with open(os.path.join(target, "planted.py"), "w") as handle:
        handle.write("x = 1\\n")
    return target
"""


PKG_A, PKG_B, PKG_C, PKG_D = absent_packages(4)  # the module is skipped if this Python has too many of them
# Whom the server builds as: its workers' user (nobody for a root server), else itself
_NOBODY = pwd.getpwnam("nobody")
BUILDER = BuildUser(_NOBODY.pw_uid, _NOBODY.pw_gid) if os.geteuid() == 0 else None


def _base_six() -> str | None:
    try:
        return importlib.metadata.version("six")
    except importlib.metadata.PackageNotFoundError:
        return None


SIX = "1.15.0" if _base_six() == "1.16.0" else "1.16.0"  # never the base's six


def body(
    name: str,
    packages: tuple[str, ...] = (),
    *,
    source: str = PROBE,
    entry: str = "probe",
    num_gpus: int | None = 1,
    **runtime: str,
) -> dict:
    arg = "where" if entry == "write" else "module"
    reg = registration_body(
        name,
        source=source,
        entrypoint=entry,
        inputs=((arg, "utf8", False),),
        output_type="utf8",
        packages=packages,
        num_gpus=num_gpus,
    )
    reg["runtime"]["python_version"] = PYTHON
    for key, value in runtime.items():
        if key in ("image", "kind"):
            reg["runtime"]["environment"][key] = value
        else:
            reg["runtime"][key] = value
    return reg


@pytest.fixture(scope="module")
def env_cache() -> Iterator[Path]:
    """This module's own cache: world-traversable, since workers run as ``nobody``."""
    path = Path(tempfile.mkdtemp(prefix="lancefn-envtest-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    remove_tree(path)


@pytest.fixture
def server(control_plane_factory, env_cache):
    let_workers_reach_this_python()
    return control_plane_factory(env={"LANCEFN_WORKER_USER": "", "LANCEFN_ENV_CACHE": str(env_cache)})


def built(cache: Path) -> Path:
    """Where the server's environments live in ``cache``."""
    return EnvironmentCache(cache).directory(BUILDER)


def environments(cache: Path) -> set[str]:
    return {p.name for p in built(cache).iterdir() if not p.name.startswith(".")}


def key_of(cache: Path, packages: tuple[str, ...], gpu: bool = True) -> str:
    """The key the server computes: same base Python, same pip settings — computed in a fresh process as the
    server's is (this one's ``sys.path`` holds what earlier tests added, which may change the base's packages)."""
    code = (
        "import sys\n"
        "from lancefn_jupyter.environments.cache import EnvironmentCache\n"
        "from lancefn_jupyter.environments.request import EnvironmentRequest\n"
        "from lancefn_jupyter.environments.builders import BuildUser\n"
        f"request = EnvironmentRequest(packages={packages!r}, python_version={PYTHON!r})\n"
        f"print(EnvironmentCache({str(cache)!r}, shared=True).key(request, gpu={gpu!r}, builder={BUILDER!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@contextlib.contextmanager
def build_held(cache: Path, key: str) -> Iterator[None]:
    """Hold the cross-process build lock of ``key``: the server's build of it waits until the block ends."""
    locks = cache / ".locks"
    locks.mkdir(exist_ok=True, mode=0o755)
    with open(locks / f"{key}.build", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


def logs(http, job_id: str) -> list[str]:
    return http.post("/v1/jobs/logs", json={"job_id": job_id}).json()["lines"]


def building(http, job_id: str) -> dict:
    """The job once it shows it waits for its environment."""
    return wait_until(
        lambda: (job := describe(http, job_id))["placement"].get("pending_reason") and job, f"{job_id} building"
    )


def create(http, reg: dict) -> dict:
    reply = http.post("/v1/functions/create", json=reg)
    assert reply.status_code == 202, reply.text
    return reply.json()


def test_a_packaged_version_builds_once_runs_in_its_environment_and_shares_it(server, env_cache):
    key = key_of(env_cache, (PKG_A,))
    with server.http() as http:
        reg = create(http, body("tab", (PKG_A,)))
        assert "warnings" not in reg  # nothing to warn about
        version = describe(http, reg["job_id"])["result"]["version"]
        with build_held(env_cache, key):
            job_id = submit(http, "tab", version, [{"module": PKG_A}])
            job = building(http, job_id)
            assert job["job_state"] == "PENDING"
            assert job["placement"]["pending_reason"].startswith("building environment (1 package, ")
            assert job["placement"]["devices"] == [] and job["placement"]["waiting_on_capacity"] is False
            usage = http.get("/v1/gpu/usage").json()["classes"][0]
            assert usage["gpus_busy"] == 0
        job = wait_done(http, job_id)
        assert job["job_state"] == "DONE", job
        _tab_version, tab_file, numpy_version, prefix = job["result"][0].split("|")
        assert tab_file.startswith(str(built(env_cache) / key)) and prefix == str(built(env_cache) / key)
        assert numpy_version == importlib.metadata.version("numpy")  # the base's numpy, layered under it
        lines = logs(http, job_id)
        assert f"[env] building the environment ({PKG_A}, Python {PYTHON})" in lines
        assert any(line.startswith("[env] ") and f"{PKG_A}==" in line for line in lines), lines
        assert any(line.startswith("[env] environment ready in ") for line in lines)
        first = job["timings"]
        assert first["environment_ms"] > 0 and first["cold"] is True
        assert environments(env_cache) == {key}

        # Warm: the cache has it, the worker holds the version.
        again = wait_done(http, submit(http, "tab", version, [{"module": PKG_A}]))
        assert again["job_state"] == "DONE" and again["timings"]["environment_ms"] == 0
        assert not any(line.startswith("[env]") for line in logs(http, again["job_id"]))

        # Another version (other code) of the same packages: the same environment, nothing built.
        other = register(http, body("tab2", (PKG_A,), source=PROBE.replace("version =", "version  =")))["version"]
        shared = wait_done(http, submit(http, "tab2", other, [{"module": PKG_A}]))
        assert shared["job_state"] == "DONE" and shared["result"][0].split("|")[3] == str(built(env_cache) / key)
        assert shared["timings"]["environment_ms"] == 0
        assert environments(env_cache) == {key}

        # Each job of it leaves a spare worker of this environment behind (once its devices are free), so a new
        # version of the same packages soon starts on a worker that is already up.
        for attempt in range(20):
            name = f"tab{attempt + 3}"
            source = PROBE.replace("version =", "version" + " " * (attempt + 3) + "=")
            new = register(http, body(name, (PKG_A,), source=source))["version"]
            started = wait_done(http, submit(http, name, new, [{"module": PKG_A}]))
            assert started["job_state"] == "DONE" and started["result"][0].split("|")[3] == str(built(env_cache) / key)
            if started["timings"]["start_ms"] == 0:
                break
            time.sleep(1.0)  # its spare is still starting
        else:
            raise AssertionError("no new version of the environment found a spare of it waiting")


def test_four_first_jobs_share_one_build_and_a_pin_beats_the_bases_version(server, env_cache):
    packages = (f"six=={SIX}",)
    key = key_of(env_cache, packages, gpu=False)
    with server.http() as http:
        version = register(http, body("six", packages, num_gpus=None))["version"]
        with build_held(env_cache, key):
            jobs = [submit(http, "six", version, [{"module": "six"}]) for _ in range(4)]
            for job_id in jobs:
                building(http, job_id)
        results = [wait_done(http, job_id) for job_id in jobs]
        assert [job["job_state"] for job in results] == ["DONE"] * 4, results
        assert {job["result"][0].split("|")[0] for job in results} == {SIX}
        assert key in environments(env_cache)
        built = [
            job_id
            for job_id in jobs
            if f"[env] building the environment (six=={SIX}, Python {PYTHON})" in logs(http, job_id)
        ]
        assert len(built) == 1  # the others waited for it
        assert all(any(f"six=={SIX}" in line for line in logs(http, job_id)[1:]) for job_id in jobs)


def test_a_package_that_does_not_exist_fails_each_job_in_phase_environment(server, env_cache):
    name = "lancefn-no-such-package-xyz"
    with server.http() as http:
        version = register(http, body("missing", (name,)))["version"]
        for _ in range(2):  # no failure is cached: the second job builds (and fails) again
            started = time.monotonic()
            job = wait_done(http, submit(http, "missing", version, [{"module": "x"}]))
            assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "environment", job
            assert name in job["failure"]["message"]
            assert time.monotonic() - started < 30
            assert "timings" not in job
            assert any(line.startswith("[env] ") and name in line for line in logs(http, job["job_id"]))
        assert not any(key.startswith(".build") for key in os.listdir(built(env_cache)))


def test_a_job_cannot_write_into_its_environment(server, env_cache):
    with server.http() as http:
        version = register(http, body("writer", (PKG_A,), source=WRITE, entry="write"))["version"]
        for where in ("prefix", "site"):
            job = wait_done(http, submit(http, "writer", version, [{"where": where}]))
            assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "run", job
            assert "PermissionError" in job["failure"]["message"], job


def test_refusals_warn_at_registration_and_fail_jobs_in_phase_environment(server):
    with server.http() as http:
        cases = {
            "py399": (body("py399", python_version="3.99"), ["3.99", PYTHON]),
            "img": (body("img", (PKG_A,), image="ghcr.io/x/y:1"), ["image='ghcr.io/x/y:1'", "Ray executor"]),
            "conda_missing": (body("conda_missing", ("lancefn-nosuch",), kind="conda"), ["lancefn-nosuch"]),
        }
        for name, (reg, words) in cases.items():
            reply = create(http, reg)
            (warning,) = reply["warnings"]
            assert all(word in warning for word in words), (name, warning)
            version = describe(http, reply["job_id"])["result"]["version"]
            job = wait_done(http, submit(http, name, version, [{"module": "sys"}]))
            assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "environment", job
            assert job["failure"]["message"] == warning
            assert "timings" not in job
        # conda packages the base has: it runs, on the base.
        reply = create(http, body("conda_ok", ("numpy",), kind="conda"))
        assert "warnings" not in reply
        version = describe(http, reply["job_id"])["result"]["version"]
        job = wait_done(http, submit(http, "conda_ok", version, [{"module": "numpy"}]))
        assert job["job_state"] == "DONE", job


def test_a_batch_of_a_packaged_version_builds_once(server, env_cache):
    key = key_of(env_cache, (PKG_B,))
    with server.http() as http:
        version = register(http, body("tz", (PKG_B,)))["version"]
        chunks = [[{"module": PKG_B}] for _ in range(4)]
        with build_held(env_cache, key):
            reply = http.post("/v1/batches/create", json={"name": "tz", "version": version, "chunks": chunks})
            assert reply.status_code == 202, reply.text
            batch_id = reply.json()["batch_id"]
            batch = wait_until(
                lambda: (
                    (b := http.post("/v1/batches/describe", json={"batch_id": batch_id}).json())["chunks"]
                    and all(c.get("job_id") for c in b["chunks"])
                    and b
                ),
                "the chunk jobs",
            )
            for chunk in batch["chunks"]:
                building(http, chunk["job_id"])
        batch = http.post("/v1/batches/wait", json={"batch_id": batch_id, "timeout_s": 60}, timeout=70).json()
        assert batch["batch_state"] == "DONE", batch
        job_ids = [chunk["job_id"] for chunk in batch["chunks"]]
        assert [(f"[env] building the environment ({PKG_B}, Python {PYTHON})" in logs(http, j)) for j in job_ids].count(
            True
        ) == 1
        assert key in environments(env_cache)


def test_a_sigkill_during_a_build_then_a_restart_runs_the_job(server, env_cache):
    key = key_of(env_cache, (PKG_C,))
    with server.http() as http:
        version = register(http, body("hz", (PKG_C,)))["version"]
        with build_held(env_cache, key):
            job_id = submit(http, "hz", version, [{"module": PKG_C}])
            building(http, job_id)
            server.kill()
            server.start()
            with server.http() as again:
                assert building(again, job_id)["job_state"] == "PENDING"
        with server.http() as again:
            job = wait_done(again, job_id)
            assert job["job_state"] == "DONE", job
            assert job["result"][0].split("|")[3] == str(built(env_cache) / key)


def test_cancelling_a_job_while_its_environment_builds(server, env_cache):
    key = key_of(env_cache, (PKG_D,))
    with server.http() as http:
        version = register(http, body("tc", (PKG_D,)))["version"]
        with build_held(env_cache, key):
            job_id = submit(http, "tc", version, [{"module": PKG_D}])
            building(http, job_id)
            reply = http.post("/v1/jobs/cancel", json={"job_id": job_id}).json()
            assert reply == {"job_id": job_id, "cancelled": True}
            job = describe(http, job_id)
            assert job["job_state"] == "CANCELLED" and "pending_reason" not in job["placement"]
        # The build goes on for the next job, which finds it (or joins it).
        job = wait_done(http, submit(http, "tc", version, [{"module": PKG_D}]))
        assert job["job_state"] == "DONE", job
        assert describe(http, job_id)["job_state"] == "CANCELLED"


def test_env_cache_flags_refuse_bad_values_and_an_unreachable_cache(control_plane_factory, tmp_path):
    import subprocess

    cases = [
        ({"args": ["--env-cache-max-bytes", "lots"]}, "--env-cache-max-bytes must be a whole number of bytes > 0"),
        ({"args": ["--env-cache-max-bytes", "0"]}, "--env-cache-max-bytes must be a whole number of bytes > 0"),
        ({"env": {"LANCEFN_ENV_CACHE_MAX_BYTES": "-1"}}, "LANCEFN_ENV_CACHE_MAX_BYTES must be a whole number"),
    ]
    if os.geteuid() == 0:  # workers run as nobody, who cannot traverse pytest's 0700 tmp dirs
        let_workers_reach_this_python()  # so the refusal is the cache's, not the interpreter's
        closed = tmp_path / "closed"
        closed.mkdir(mode=0o700)
        closed.chmod(0o700)
        cases.append(
            (
                {"env": {"LANCEFN_WORKER_USER": "", "LANCEFN_ENV_CACHE": str(closed / "envs")}},
                "cannot reach the environment cache",
            )
        )
    for options, message in cases:
        cp = control_plane_factory(start=False, **options)
        result = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not cp.server_json.exists()


def test_an_inline_wait_answers_at_once_while_the_environment_builds(server, env_cache):
    packages = (PKG_C, PKG_A)  # an environment of its own
    key = key_of(env_cache, packages)
    with server.http() as http:
        version = register(http, body("fig", packages))["version"]
        with build_held(env_cache, key):
            started = time.monotonic()
            reply = http.post(
                "/v1/functions/run",
                json={"name": "fig", "version": version, "rows": [{"module": PKG_C}], "wait_s": 30},
            ).json()
            assert time.monotonic() - started < 10
            assert reply["job"]["job_state"] == "PENDING"
            assert reply["job"]["placement"]["pending_reason"].startswith("building environment (2 packages, ")
        assert wait_done(http, reply["job_id"])["job_state"] == "DONE"
