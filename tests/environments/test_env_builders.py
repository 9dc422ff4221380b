"""The build's rules apart from uv (docs/ARCHITECTURE.md, "Environments"): which pip entries are requirements, what
a build's processes see, what the cache key covers, and how a built tree is sealed."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from lancefn_jupyter.environments.build import remove
from lancefn_jupyter.environments.builders import BuildUser, build_environment, uv_variables
from lancefn_jupyter.environments.cache import EnvironmentCache
from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.environments.requirements import pip_entry_problem, pip_problem
from lancefn_jupyter.environments.seal import SealError, seal

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a tree of another uid needs root")
BUILDER = BuildUser(61090, 61090)


@pytest.mark.unit
@pytest.mark.parametrize(
    "entry", ["numpy", "numpy>=1,<2", "pkg[a,b]==1.0", "numpy==1.*", 'six ; python_version > "3"', " tabulate "]
)
def test_a_requirement_is_accepted(entry):
    assert pip_entry_problem(entry, direct_references=False) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("-r /root/.lancefn/api_key", ["'-r /root/.lancefn/api_key' is a pip option", "numpy>=1.26"]),
        ("-c /etc/shadow", ["'-c /etc/shadow' is a pip option"]),
        ("--index-url=https://evil.example/simple", ["is a pip option", "-r, -c, -e and --index-url"]),
        ("-e .", ["is a pip option"]),
        ("numpy\n-r /etc/shadow", ["holds a line break", "one requirement per entry"]),
        ("numpy --index-url x", ["is not a PEP 508 requirement", "numpy>=1.26"]),
        ("./mypkg", ["is not a PEP 508 requirement", "'NAME @ URL'"]),
        ("https://example.com/x-1.0-py3-none-any.whl", ["'NAME @ URL'"]),
        ("git+https://github.com/a/b", ["'NAME @ URL'"]),
    ],
)
def test_option_lines_and_what_is_no_requirement_are_refused_naming_the_entry(entry, words):
    for direct_references in (True, False):
        problem = pip_entry_problem(entry, direct_references=direct_references)
        assert problem is not None and problem.startswith(f"pip entry {entry!r} ")
        assert all(word in problem for word in words), problem


@pytest.mark.unit
@pytest.mark.parametrize(
    "entry", ["evil @ file:///tmp/evil", "evil @ git+https://github.com/a/b", "x @ https://h/x.whl", "x @ ./rel"]
)
def test_a_direct_reference_is_refused_only_where_not_allowed(entry):
    assert pip_entry_problem(entry) is None
    problem = pip_entry_problem(entry, direct_references=False)
    assert problem is not None and "is a direct reference" in problem and "--allow-direct-references" in problem
    assert pip_problem(["numpy", entry], direct_references=False) == problem
    assert pip_problem(["numpy", "six"], direct_references=False) is None


@pytest.mark.unit
def test_another_users_build_gets_no_secret_and_no_configuration_file():
    server = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
        "LANCEFN_API_KEY": "secret-admin-key",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "HOME": "/root",
        "UV_INDEX_URL": "https://mirror/simple",
        "UV_CONFIG_FILE": "/srv/uv.toml",
        "UV_CACHE_DIR": "/root/.cache/uv",
        "PIP_FIND_LINKS": "/opt/wheels",
    }
    env = build_environment(server, {"SSL_CERT_FILE": "/etc/ca.pem"}, BUILDER, "/cache/uid-61090/.uv-cache")
    assert env == {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "HTTPS_PROXY": "http://proxy:3128",
        "UV_INDEX_URL": "https://mirror/simple",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "UV_NO_CONFIG": "1",
        "PYTHONSAFEPATH": "1",
        "UV_CACHE_DIR": "/cache/uid-61090/.uv-cache",
        "UV_LINK_MODE": "copy",
    }
    own = build_environment(server, {}, None, None)  # the server's own user: its environment, no config file
    assert own["LANCEFN_API_KEY"] == "secret-admin-key" and own["UV_NO_CONFIG"] == "1" and "UV_CONFIG_FILE" not in own
    assert own["UV_CACHE_DIR"] == "/root/.cache/uv"


@pytest.mark.unit
def test_the_uv_variables_that_choose_packages_are_keyed_the_others_not():
    env = {
        "UV_INDEX_URL": "x",
        "UV_EXCLUDE_NEWER": "2024-01-01",
        "UV_CACHE_DIR": "/c",
        "UV_HTTP_TIMEOUT": "9",
        "A": "1",
    }
    assert uv_variables(env) == [("UV_EXCLUDE_NEWER", "2024-01-01"), ("UV_INDEX_URL", "x")]


def test_the_key_covers_the_builder_and_uvs_configuration(tmp_path):
    request = EnvironmentRequest(packages=("lancefn-absent-pkg",))
    plain = EnvironmentCache(tmp_path, env={"PATH": os.environ.get("PATH", "")})
    key = plain.key(request)
    assert plain.key(request) == key and plain.key(request, builder=None) == key
    assert plain.key(request, builder=BUILDER) != key
    assert plain.key(request, builder=BUILDER) != plain.key(request, builder=BuildUser(61091, 61091))
    indexed = EnvironmentCache(tmp_path, env={"PATH": os.environ.get("PATH", ""), "UV_INDEX_URL": "https://other"})
    assert indexed.key(request) != key  # another index: never the environment built from the first
    cached = EnvironmentCache(tmp_path, env={"PATH": os.environ.get("PATH", ""), "UV_CACHE_DIR": "/elsewhere"})
    assert cached.key(request) == key
    assert plain.directory() == tmp_path and plain.directory(BUILDER) == tmp_path / "uid-61090"
    refused = plain.problem(EnvironmentRequest(packages=("-r /etc/shadow",)))
    assert refused is not None and "is a pip option" in refused


def _tree(top: Path, uid: int) -> None:
    """A build's tree as another user leaves it: a 0666 ``.lock``, a setuid script, a 0600 file, links."""
    (top / "lib" / "site").mkdir(parents=True)
    (top / ".lock").write_text("")
    (top / ".lock").chmod(0o666)
    (top / "bin").mkdir()
    (top / "bin" / "tool").write_text("#!/bin/sh\n")
    (top / "bin" / "tool").chmod(0o4777)
    (top / "lib" / "site" / "mod.py").write_text("x = 1\n")
    (top / "lib" / "site" / "private.py").write_text("y = 2\n")
    (top / "lib" / "site" / "private.py").chmod(0o600)
    (top / "lib64").symlink_to("lib")
    (top / "bin" / "python").symlink_to(sys.executable)
    for parent, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(parent, name), uid, uid)
    os.chown(top, uid, uid)


@as_root
def test_sealing_makes_a_builders_tree_the_servers_read_only_and_writable_by_none(tmp_path):
    top = tmp_path / "env"
    top.mkdir()
    _tree(top, BUILDER.uid)
    seal(top, BUILDER.uid)
    for parent, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            found = os.lstat(os.path.join(parent, name))
            assert (found.st_uid, found.st_gid) == (0, 0), os.path.join(parent, name)
            if stat.S_ISDIR(found.st_mode):
                assert stat.S_IMODE(found.st_mode) == 0o555
            elif not stat.S_ISLNK(found.st_mode):
                assert not found.st_mode & 0o022 and found.st_mode & 0o444 == 0o444
    assert stat.S_IMODE((top / ".lock").stat().st_mode) == 0o644
    assert stat.S_IMODE((top / "bin" / "tool").stat().st_mode) == 0o755  # no setuid, no one else writes it
    assert os.readlink(top / "bin" / "python") == sys.executable  # links are kept, never followed


@as_root
def test_sealing_never_follows_a_planted_link_and_refuses_what_an_environment_cannot_hold(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("the server's\n")
    outside.chmod(0o600)
    for plant, message in [
        (lambda top: (top / "lib").symlink_to(tmp_path), None),  # a link to a directory: kept, not entered
        (lambda top: os.mkfifo(top / "lib" / "fifo"), "a FIFO at lib/fifo"),
        (lambda top: os.link(outside, top / "lib" / "stolen"), "lib/stolen is a hard link to a file of the server's"),
        (lambda top: os.chown(top / "lib" / "mod.py", 61091, 61091), "lib/mod.py belongs to uid 61091"),
    ]:
        top = tmp_path / "env"
        top.mkdir()
        if message is not None:
            (top / "lib").mkdir()
            (top / "lib" / "mod.py").write_text("")
        for parent, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(parent, name), BUILDER.uid, BUILDER.gid)
        plant(top)
        if message is None:
            seal(top, BUILDER.uid)
            assert (top / "lib").is_symlink() and stat.S_IMODE(tmp_path.stat().st_mode) != 0o555
        else:
            with pytest.raises(SealError, match=message):
                seal(top, BUILDER.uid)
        assert stat.S_IMODE(outside.stat().st_mode) == 0o600 and outside.stat().st_uid == 0
        remove(top)
