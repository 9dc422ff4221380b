"""EnvironmentCache with real uv builds over this interpreter (docs/ARCHITECTURE.md, "Environments").

Packages are chosen among small pure-Python ones this base lacks, so each build installs one or two wheels (from
uv's cache after the first run).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from pathlib import Path

import pytest
from conftest import remove_tree
from helpers import absent_packages, let_workers_reach_this_python, tiny_wheel, wait_until
from uv import find_uv_bin

from lancefn_jupyter.environments import build as build_module
from lancefn_jupyter.environments import interpreters
from lancefn_jupyter.environments.builders import BuildUser
from lancefn_jupyter.environments.cache import EnvironmentCache, EnvironmentFailure, default_cache_dir
from lancefn_jupyter.environments.request import EnvironmentRequest

BASE_PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _base_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _need(count):
    return absent_packages(count)


@pytest.fixture
def root(tmp_path):
    path = tmp_path / "envs"
    yield path
    remove_tree(path)


def _pip(*packages, **kwargs):
    return EnvironmentRequest(packages=tuple(packages), **kwargs)


def _run(python, code, **kwargs):
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, **kwargs)


def test_layered_environment_has_the_declared_package_and_the_base(root):
    (name,) = _need(1)
    cache = EnvironmentCache(root)
    request = _pip(name)
    assert cache.problem(request) is None and cache.needs_build(request)
    assert cache.lookup(request) is None
    lines: list[str] = []
    env = cache.ensure(request, log=lines.extend)
    assert env is not None and env.path == root / env.key and env.key == cache.key(request)
    assert [pin.split("==")[0] for pin in env.installed] == [name]
    assert any(name in line for line in lines)  # uv's output came through
    code = (
        f"import {name}, numpy, lancefn_jupyter.worker.main, json; print(json.dumps([{name}.__file__, numpy.__file__]))"
    )
    done = _run(env.python, code)
    assert done.returncode == 0, done.stderr
    package_file, numpy_file = json.loads(done.stdout)
    assert package_file.startswith(str(env.path))
    assert not numpy_file.startswith(str(env.path))  # the base's numpy, not a copy
    meta = json.loads((env.path / "meta.json").read_text())
    assert meta["key"] == env.key and meta["installed"] == list(env.installed) and meta["size_bytes"] > 0
    found = cache.lookup(request)
    assert found == env
    assert not list(root.glob(".build-*"))


def test_a_dependency_the_base_has_is_not_reinstalled_and_a_pin_wins(root):
    base_six = _base_version("six")
    if base_six is None or _base_version("ecdsa") is not None:
        pytest.skip("needs six in the base and ecdsa not")
    pin = "1.16.0" if base_six != "1.16.0" else "1.15.0"
    cache = EnvironmentCache(root)
    plain = cache.ensure(_pip("ecdsa"))
    assert plain is not None
    assert [p.split("==")[0] for p in plain.installed] == ["ecdsa"]  # six comes from the base
    assert not list(plain.path.glob("lib/python*/site-packages/six*"))
    assert cache.plan(_pip("ecdsa")) == plain.installed
    pinned = cache.ensure(_pip("ecdsa", f"six=={pin}"))
    assert pinned is not None and f"six=={pin}" in pinned.installed
    done = _run(pinned.python, "import six, ecdsa; print(six.__version__)")
    assert done.stdout.strip() == pin, done.stderr


def test_the_base_satisfying_everything_needs_no_environment(root):
    cache = EnvironmentCache(root)
    request = _pip("numpy", "packaging")
    assert not cache.needs_build(request)
    assert cache.ensure(request) is None and cache.lookup(request) is None and cache.plan(request) == ()
    assert not cache.needs_build(EnvironmentRequest(python_version=BASE_PYTHON))
    conda = EnvironmentRequest(kind="conda", packages=("conda-forge::numpy=2",))
    assert cache.problem(conda) is None and cache.ensure(conda) is None


def test_a_plain_version_of_the_base_python_is_checked_without_scanning_the_base(root, monkeypatch):
    # A registration's check of python_version must not read every distribution's metadata (~50 ms): a server's
    # first registration paid that on the kernel's wait.
    from lancefn_jupyter.environments import resolve

    def scanned(*args, **kwargs):
        raise AssertionError("describe_base ran for a version with no packages")

    monkeypatch.setattr(resolve, "describe_base", scanned)
    cache = EnvironmentCache(root)
    plain = EnvironmentRequest(python_version=BASE_PYTHON)
    assert cache.problem(plain) is None and not cache.needs_build(plain)
    with pytest.raises(AssertionError, match="describe_base ran"):
        cache.key(plain)  # the cache key does need the base's packages: the stub was in force


def test_same_packages_share_one_environment_and_four_threads_build_once(root, monkeypatch):
    (name,) = _need(1)
    builds = []
    real_build = build_module.build

    def counting(*args, **kwargs):
        builds.append(args[1])
        return real_build(*args, **kwargs)

    monkeypatch.setattr(build_module, "build", counting)
    cache = EnvironmentCache(root)
    requests = [_pip(name, "packaging", digest=str(i)) for i in range(2)] + [_pip("packaging", name)] * 2
    assert len({cache.key(r) for r in requests}) == 1
    barrier = threading.Barrier(4)
    results: list[object] = []

    def worker(request):
        barrier.wait()
        results.append(cache.ensure(request, log=lambda _lines: None))

    threads = [threading.Thread(target=worker, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(builds) == 1
    assert len(results) == 4 and len(set(results)) == 1
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == [builds[0]]


def test_two_processes_build_once(root):
    (name,) = _need(1)
    script = (
        "import sys, json\n"
        "from lancefn_jupyter.environments.cache import EnvironmentCache\n"
        "from lancefn_jupyter.environments.request import EnvironmentRequest\n"
        "lines = []\n"
        f"env = EnvironmentCache(sys.argv[1]).ensure(EnvironmentRequest(packages=({name!r},)), log=lines.extend)\n"
        "print(json.dumps([env.key, any('Creating virtual environment' in line for line in lines)]))\n"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=90)[0]) for p in procs]
    assert outs[0][0] == outs[1][0]
    assert sorted(built for _, built in outs) == [False, True]  # the second waited on the lock and used it


def test_a_build_waits_for_another_process_building_the_same_key(root):
    (name,) = _need(1)
    cache = EnvironmentCache(root)
    request = _pip(name)
    (root / ".locks").mkdir(parents=True)
    holder = subprocess.Popen(  # another process "building" it: holds the key's build lock until told
        [
            sys.executable,
            "-c",
            "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print(1, flush=True); input()",
            str(root / ".locks" / f"{cache.key(request)}.build"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(cache.ensure(request)))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not list(root.glob(".build-*"))  # waiting, not building
    finally:
        holder.communicate("\n", timeout=10)
    waiter.join(60)
    assert results and results[0] is not None


def test_a_package_that_does_not_exist_fails_naming_it_and_is_tried_again(root, monkeypatch):
    builds, waiting = [], [0]
    real_build = build_module.build

    def build_once_all_wait(*args, **kwargs):
        # The build starts once every caller of the attempt waits on it: this failing build is quick, and on a loaded
        # machine a caller that reached ensure() after it ended would rightly start a build of its own.
        builds.append(1)
        flight = next(iter(cache._flights.values()))  # the build in flight, whose callers wait
        wait_until(lambda: len(flight._logs) >= waiting[0], "every caller waiting on the build", 60)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(build_module, "build", build_once_all_wait)
    cache = EnvironmentCache(root)
    request = _pip("lancefn-nonexistent-xyz")
    for attempt, callers in ((1, 3), (2, 1)):  # three at once share one failed build; the next builds again
        barrier = threading.Barrier(callers)
        failures: list[EnvironmentFailure] = []
        waiting[0] = callers

        def caller(barrier, failures):
            barrier.wait()
            try:
                cache.ensure(request, log=lambda lines: None)  # a log: each caller waiting is counted
            except EnvironmentFailure as exc:
                failures.append(exc)

        threads = [threading.Thread(target=caller, args=(barrier, failures)) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(builds) == attempt and len(failures) == callers
        assert len({str(failure) for failure in failures}) == 1
        failure = failures[0]
        assert str(failure).startswith("uv could not build the environment (1 package): ")
        assert "lancefn-nonexistent-xyz" in str(failure)
        assert not failure.refused and failure.lines
    assert [p.name for p in root.iterdir()] == [".locks"]  # no half-built directory left
    assert cache.lookup(request) is None


def test_offline_build_from_find_links(root, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels, "lancefn-tiny-probe", "0.1")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    cache = EnvironmentCache(root, env=env)
    assert "--no-index" in cache.uv_args() and str(wheels) in cache.uv_args()
    built = cache.ensure(_pip("lancefn-tiny-probe==0.1"))
    assert built is not None and built.installed == ("lancefn-tiny-probe==0.1",)
    done = _run(built.python, "import lancefn_tiny_probe; print(lancefn_tiny_probe.VALUE)")
    assert done.stdout.strip() == "42", done.stderr
    assert cache.key(_pip("lancefn-tiny-probe==0.1")) != EnvironmentCache(root).key(_pip("lancefn-tiny-probe==0.1"))


def test_eviction_removes_the_least_recently_used_but_never_a_leased_one(root):
    names = _need(3)
    cache = EnvironmentCache(root)
    a, b, c = (cache.ensure(_pip(name)) for name in names)
    assert a is not None and b is not None and c is not None
    for when, env in enumerate((b, c, a)):  # last uses: b oldest, then c, then a
        os.utime(env.lock_path, (1_000_000 + when, 1_000_000 + when))
    lease = cache.lease(c)
    assert lease is not None
    try:
        cache.max_bytes = a.size_bytes + c.size_bytes
        assert cache.evict() == [b.key]
        cache.max_bytes = 0
        assert cache.evict() == [a.key]  # c is leased
        assert c.path.exists() and not a.path.exists()
        assert cache.lookup(_pip(names[0])) is None
        assert cache.lease(a) is None  # evicted: build it again
    finally:
        os.close(lease)
    assert cache.evict() == [c.key]
    # after a build the cache fits again, sparing the environment just built
    fresh = cache.ensure(_pip(names[1]))
    assert fresh is not None and fresh.path.exists()


def test_a_lease_handed_to_a_worker_keeps_the_environment_until_the_worker_exits(root):
    (name,) = _need(1)
    cache = EnvironmentCache(root, max_bytes=0)
    env = cache.ensure(_pip(name))
    assert env is not None
    lease = cache.lease(env)
    assert lease is not None
    worker = subprocess.Popen(
        [env.python, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=[lease]
    )
    os.close(lease)  # the worker's inherited descriptor holds the lock now
    try:
        assert cache.evict() == [] and env.path.exists()
    finally:
        worker.communicate(timeout=30)
    assert cache.evict() == [env.key] and not env.path.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="builds as another uid need root")
def test_an_environment_built_as_another_user_is_the_servers_kept_apart_and_evicted():
    (name,) = _need(1)
    let_workers_reach_this_python()
    root = Path(tempfile.mkdtemp(prefix="lancefn-builder-", dir="/tmp")) / "envs"  # reachable by the builder
    root.parent.chmod(0o755)
    builder = BuildUser(61091, 61091)
    try:
        cache = EnvironmentCache(root, shared=True, max_bytes=0)
        env = cache.ensure(_pip(name), builder=builder)
        assert env is not None and env.path == root / "uid-61091" / env.key == cache.directory(builder) / env.key
        assert env.key != cache.key(_pip(name))  # never the server's own build of the same packages
        home = (root / "uid-61091").stat()
        assert (home.st_uid, home.st_gid, home.st_mode & 0o777) == (0, 61091, 0o750)
        uv_cache = (root / "uid-61091" / ".uv-cache").stat()
        assert (uv_cache.st_uid, uv_cache.st_mode & 0o777) == (61091, 0o700)
        assert {os.lstat(os.path.join(parent, entry)).st_uid for parent, dirs, files in os.walk(env.path)
                for entry in (*dirs, *files)} == {0}  # fmt: skip
        assert cache.lookup(_pip(name), builder=builder) == env and cache.lookup(_pip(name)) is None
        assert cache.evict() == [env.key] and not env.path.exists()  # in uid-*/ as at the root
    finally:
        remove_tree(root.parent)


def test_a_base_that_cannot_run_a_worker_fails_the_check(root, tmp_path):
    (name,) = _need(1)
    bare = tmp_path / "bare"  # a Python with nothing installed: no packaging, which every worker needs
    subprocess.run([find_uv_bin(), "venv", "--python", sys.executable, str(bare)], check=True, capture_output=True)
    cache = EnvironmentCache(root, base_python=str(bare / "bin" / "python"))
    with pytest.raises(EnvironmentFailure) as caught:
        cache.ensure(_pip(name))
    assert str(caught.value).startswith("uv could not build the environment (1 package): its Python cannot start")
    assert "ModuleNotFoundError" in str(caught.value) and not caught.value.refused
    assert [p.name for p in root.iterdir()] == [".locks"]


def test_stale_half_built_directories_are_swept(root):
    (name,) = _need(1)
    cache = EnvironmentCache(root)
    assert cache.ensure(_pip(name)) is not None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = root / f".build-{'0' * 64}-{dead.stdout.strip()}-0"
    young = root / f".build-{'1' * 64}-{dead.stdout.strip()}-0"
    for path in (stale, young):
        (path / "bin").mkdir(parents=True)
        (path / "bin").chmod(0o555)
    os.utime(stale, (0, 0))
    cache.evict()
    assert not stale.exists() and young.exists()


def test_a_built_environment_is_read_only_and_usable_by_another_user():
    (name,) = _need(1)
    root = Path(tempfile.mkdtemp(prefix="lancefn-ro-", dir="/tmp")) / "envs"  # traversable by nobody
    root.parent.chmod(0o755)
    umask = os.umask(0o077)  # a strict umask must not make a shared cache unreadable
    try:
        env = EnvironmentCache(root, shared=True).ensure(_pip(name))
    finally:
        os.umask(umask)
    try:
        assert env is not None
        assert root.stat().st_mode & 0o777 == 0o755
        for parent, dirs, _files in os.walk(env.path):
            for entry in [parent, *(os.path.join(parent, d) for d in dirs)]:
                if not os.path.islink(entry):
                    assert os.stat(entry).st_mode & 0o777 == 0o555, entry
        site = next(env.path.glob("lib/python*/site-packages"))
        assert (site / "_lancefn_base.pth").stat().st_mode & 0o777 == 0o644
        attempt = (
            f"import os, sys, {name}, numpy, lancefn_jupyter.worker.main\n"  # it can use the environment ...
            "try:\n    open(os.path.join(sys.argv[1], 'evil.pth'), 'w')\n"
            "except PermissionError:\n    print('refused')\n"
        )
        # root bypasses modes: try as the unprivileged user a root server's workers run as
        as_user = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
            let_workers_reach_this_python()
            base = _run(sys.executable, "import numpy, lancefn_jupyter.worker.main", cwd="/", **as_user)
            if base.returncode != 0:
                pytest.skip(f"nobody cannot use this Python or checkout at all: {base.stderr.strip()[-200:]}")
        done = subprocess.run(
            [env.python, "-c", attempt, str(site)], capture_output=True, text=True, timeout=60, cwd="/", **as_user
        )
        assert done.stdout.strip() == "refused", done.stderr  # ... and cannot add to it
        assert not (site / "evil.pth").exists()
    finally:
        remove_tree(root.parent)


def test_refusals_name_the_reason(root):
    cache = EnvironmentCache(root)
    wanted = cache.problem(EnvironmentRequest(python_version="3.99"))
    assert wanted is not None and wanted.startswith("wants Python 3.99; this machine has ")
    assert f"{BASE_PYTHON} (" in wanted
    assert "3.11 or newer" in (cache.problem(EnvironmentRequest(python_version="3.10")) or "")
    image = cache.problem(EnvironmentRequest(image="nvcr.io/x:1"))
    assert image is not None and "runs no containers" in image and "--executor ray" in image and "image_uri" in image
    conda = cache.problem(EnvironmentRequest(kind="conda", packages=("numpy", "conda-forge::lancefn-nope=1")))
    assert conda is not None and "lancefn-nope" in conda and "numpy" not in conda and "pip=" in conda
    usable = [v for v in interpreters.available(base=sys.executable) if v != BASE_PYTHON and int(v.split(".")[1]) >= 11]
    if other := next(iter(usable), None):
        conda_other = EnvironmentRequest(kind="conda", packages=("numpy",), python_version=other)
        assert "conda packages are honoured only" in (cache.problem(conda_other) or "")
    for request in (EnvironmentRequest(python_version="3.99"), EnvironmentRequest(image="x", packages=("six",))):
        with pytest.raises(EnvironmentFailure) as caught:
            cache.ensure(request)
        assert caught.value.refused
        assert cache.lookup(request) is None
    assert not root.exists()  # nothing built, nothing created


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LANCEFN_ENV_CACHE", str(tmp_path))
    assert default_cache_dir(True) == tmp_path
    monkeypatch.delenv("LANCEFN_ENV_CACHE")
    assert default_cache_dir(True) == Path("/var/cache/lancefn/envs")
    assert default_cache_dir(False) == Path.home() / ".cache" / "lancefn" / "envs"


def test_another_python_gets_its_own_environment(root):
    base = BASE_PYTHON
    other = next((v for v in ("3.12", "3.13", "3.11") if v != base and interpreters.find(v, base=sys.executable)), None)
    if other is None:
        pytest.skip(f"no Python 3.11+ other than the base's {base} on this machine")
    cache = EnvironmentCache(root)
    request = EnvironmentRequest(python_version=other)
    assert cache.problem(request) is None and cache.needs_build(request)
    env = cache.ensure(request)
    assert env is not None
    assert {pin.split("==")[0] for pin in env.installed} >= {"numpy", "pyarrow", "packaging"}
    code = "import sys, lancefn_jupyter.worker.main, numpy, pyarrow; print('%d.%d' % sys.version_info[:2])"
    done = _run(env.python, code)
    assert done.stdout.strip() == other, done.stderr
    assert not list(env.path.glob("lib/python*/site-packages/_lancefn_base.pth"))
    # that environment as a base (asked through a subprocess, not this process): one package layered over it
    (name,) = _need(1)
    layered = EnvironmentCache(root, base_python=env.python)
    assert not layered.needs_build(_pip("numpy")) and layered.needs_build(_pip(name))
    over = layered.ensure(_pip(name))
    assert over is not None and [pin.split("==")[0] for pin in over.installed] == [name]
    done = _run(over.python, f"import sys, {name}, numpy, lancefn_jupyter.worker.main; print(sys.version_info[1])")
    assert done.stdout.strip() == other.split(".")[1], done.stderr
