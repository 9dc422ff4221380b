"""Finding a Python X.Y on the machine without downloading one (docs/ARCHITECTURE.md, "Environments")."""

from __future__ import annotations

import sys

from lancefn_jupyter.environments import interpreters

BASE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def _fake_python(path, prints):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{prints}\n")
    path.chmod(0o755)
    return path


def test_path_and_pyenv_versions_are_found_but_not_pyenv_shims(tmp_path):
    on_path = _fake_python(tmp_path / "bin" / "python3.42", "echo 3.42")
    pyenv = tmp_path / "pyenv"
    version_dir = _fake_python(pyenv / "versions" / "3.43.1" / "bin" / "python3.43", "echo 3.43")
    _fake_python(pyenv / "shims" / "python3.44", "echo 'pyenv: python3.44: command not found' >&2; exit 127")
    broken = _fake_python(tmp_path / "bin" / "python3.45", "exit 1")
    env = {"PATH": f"{pyenv / 'shims'}:{tmp_path / 'bin'}", "PYENV_ROOT": str(pyenv), "HOME": str(tmp_path)}
    found = interpreters.available(base=sys.executable, env=env)
    assert found["3.42"] == str(on_path) and found["3.43"] == str(version_dir)
    assert found[BASE] == sys.executable
    assert "3.44" not in found and interpreters.version_of(str(broken)) is None
    assert list(found) == sorted(found, key=lambda v: tuple(map(int, v.split("."))))
    assert interpreters.find("3.43", base=sys.executable, env=env) == str(version_dir)
    assert interpreters.find(BASE, base=sys.executable, env=env) == sys.executable
    assert interpreters.find("3.99", base=sys.executable, env=env) is None


def test_uvs_managed_pythons_are_found_in_its_directory(tmp_path):
    managed = _fake_python(tmp_path / "uv" / "cpython-3.46.0-linux-x86_64-gnu" / "bin" / "python3.46", "echo 3.46")
    env = {"PATH": "", "HOME": str(tmp_path), "UV_PYTHON_INSTALL_DIR": str(tmp_path / "uv")}
    assert interpreters.find("3.46", base=sys.executable, env=env) == str(managed)
