"""Cells as people write them (issue 11), through the real magic in a notebook executed by nbclient
against a real control plane (local executor): IPython's builtins, a config dict from an earlier
cell, default arguments, and a refused cell's handle.

Each job-running case prints ``<tag> <local()> <submit() result> <version>`` so `.local()` and the
job are compared, and re-running a cell unchanged must give the same version.
"""

from __future__ import annotations

import os

import nbformat
import pytest
from helpers import outputs_text
from nbclient import NotebookClient

MAGIC = "%%gpu_function num_gpus=1\n"

BUILTIN_CELLS = {
    "open": "def reads(path: str) -> int:\n    with open(path) as f:\n        return len(f.read())\n",
    "display": "def shows(path: str) -> int:\n    display(path)\n    return len(path)\n",
    "get_ipython": "def asks(path: str) -> int:\n    return 1 if get_ipython() is None else 2\n",
    "exit": "def leaves(path: str) -> int:\n    if not path:\n        exit(1)\n    return 3\n",
    "quit": "def stops(path: str) -> int:\n    if not path:\n        quit(1)\n    return 4\n",
}


def run_notebook(cp, tmp_path, cells: list[str]) -> list[str]:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in cells])
    env = dict(os.environ, LANCEFN_API_KEY=cp.api_key, LANCEFN_HOME=str(tmp_path / "unused-home"))
    env.pop("LANCEFN_URL", None)
    client = NotebookClient(
        nb, timeout=180, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env=env)
    return [outputs_text(cell) for cell in nb.cells]


def line(texts: list[str], tag: str) -> list[str]:
    found = [row for text in texts for row in text.splitlines() if row.startswith(tag + " ")]
    assert found, f"no line starting with {tag!r} in:\n" + "\n---\n".join(texts)
    return found[-1].split()[1:]


def test_ipython_builtins_in_a_cell_run_locally_and_as_jobs(control_plane, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("hello")
    cells = ["%load_ext lancefn_jupyter", f"%lancefn connect {control_plane.url}", f"P = {str(data)!r}"]
    for name, body in BUILTIN_CELLS.items():
        entry = body.split("(")[0][4:]
        cells.append(MAGIC + body)
        cells.append(f"print({name!r}, {entry}.local(P), {entry}.submit(P).result(), {entry}.version.version)")
    texts = run_notebook(control_plane, tmp_path, cells)
    expected = {"open": "5", "display": str(len(str(data))), "get_ipython": "1", "exit": "3", "quit": "4"}
    for name, value in expected.items():
        local, remote, version = line(texts, name)
        assert (local, remote) == (value, value), name
        assert len(version) == 16
    assert "UsageError" not in "".join(texts) and "Error" not in "".join(texts)


def test_a_config_dict_defaults_and_a_refused_cell(control_plane, tmp_path):
    scaled = MAGIC + "def scaled(x: int) -> int:\n    return x * CONFIG['scale'] + len(CONFIG['tags'])\n"
    report = "print(TAG, scaled.local(3), scaled.submit(3).result(), scaled.version.version)"
    cells = [
        "%load_ext lancefn_jupyter",
        f"%lancefn connect {control_plane.url}",
        # 2: a literal config from an earlier cell, registered twice unchanged, then edited
        "CONFIG = {'scale': 2, 'tags': ['a', 'b'], 'ids': {3, 1, 2}}",
        scaled,
        "TAG = 'first'\n" + report,
        scaled,
        "TAG = 'again'\n" + report,
        "CONFIG = {'scale': 5, 'tags': ['a', 'b'], 'ids': {3, 1, 2}}",
        scaled,
        "TAG = 'edited'\n" + report,
        # 3: literal defaults and keyword-only parameters may be omitted by every caller
        MAGIC + "from typing import Optional\n\ndef kw(x: int, *, scale: int = 2) -> int:\n    return x * scale\n",
        "print('kw', kw.local(3), kw.submit(3).result(), kw.remote(3, scale=4),"
        " '/'.join(map(str, kw.map([{'x': 1}, {'x': 1, 'scale': 3}]).result())))",
        MAGIC + "from typing import Optional\n\n"
        "def opt(x: Optional[int] = None) -> int:\n    return -1 if x is None else x\n",
        "print('opt', opt.local(), opt.remote(), opt.remote(7),"
        " [(p.name, p.nullable, p.default) for p in opt.version.signature.inputs] == [('x', True, 'None')])",
        # 5: a refused cell leaves a handle that says so, not a plain function
        "TABLE = bytearray(b'ab')",
        MAGIC + "def bad(x: int) -> int:\n    return x + len(TABLE)\n",
        "try:\n    bad.submit(1)\nexcept Exception as error:\n    print('refused', type(error).__name__, error)\n"
        "print('still callable', bad(1))",
    ]
    texts = run_notebook(control_plane, tmp_path, cells)

    first, again, edited = line(texts, "first"), line(texts, "again"), line(texts, "edited")
    assert first[:2] == ["8", "8"] and again == first
    assert edited[:2] == ["17", "17"] and edited[2] != first[2]

    assert line(texts, "kw") == ["6", "6", "12", "2/3"]
    assert line(texts, "opt") == ["-1", "-1", "7", "True"]

    refusal = texts[-2]
    assert "UsageError" in refusal and "'TABLE' (line 2)" in refusal and "a bytearray" in refusal
    refused = "\n".join(row for row in texts[-1].splitlines() if row.startswith(("refused", "bad", "Fix")))
    assert refused.startswith("refused NotRegisteredError bad is not registered: the function uses 'TABLE'")
    assert "Fix the cell and run it again." in texts[-1]
    assert line(texts, "still") == ["callable", "3"]


def test_the_notebooks_own_modules_travel_with_the_version(control_plane, tmp_path):
    (tmp_path / "mylib.py").write_text("from mydep import FACTOR\n\ndef helper(x):\n    return x * FACTOR\n")
    (tmp_path / "mydep.py").write_text("FACTOR = 3\n")
    (tmp_path / "extras").mkdir()
    (tmp_path / "extras" / "__init__.py").write_text("SCALE = 5\n")
    (tmp_path / "fast.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (tmp_path.parent / "outside.py").write_text("X = 1\n")
    tripled = MAGIC + "from mylib import helper\n\ndef tripled(x: int) -> int:\n    return helper(x)\n"
    report = "print(TAG, tripled.local(2), tripled.submit(2).result(), tripled.version.version)"
    cells = [
        "%load_ext lancefn_jupyter",
        f"%lancefn connect {control_plane.url}",
        tripled,
        "TAG = 'first'\n" + report,
        tripled,
        "TAG = 'again'\n" + report,
        # editing the shipped module (here its dependency) makes a new version
        "with open('mydep.py', 'w') as f:\n    f.write('FACTOR = 4\\n')",
        tripled,
        "TAG = 'edited'\n" + report,
        "print('card', repr(tripled).splitlines()[5])",
        # include= ships what the cell does not import by name
        "%%gpu_function num_gpus=1 include=extras\ndef scaled(x: int) -> int:\n"
        "    import extras\n    return x * extras.SCALE\n",
        "print('included', scaled.local(2), scaled.remote(2), 'extras/__init__.py' in scaled.artifact_source)",
        "%%gpu_function num_gpus=1 include=../outside.py\ndef out(x: int) -> int:\n    return x\n",
        "%%gpu_function num_gpus=1 include=fast.cpython-312-x86_64-linux-gnu.so\ndef comp(x: int) -> int:\n    return x\n",
        # a local file created after registration was not shipped: the message says so
        MAGIC + "def late(x: int) -> int:\n    import later\n    return later.Y\n",
        "with open('later.py', 'w') as f:\n    f.write('Y = 1\\n')",
        "try:\n    late.remote(1)\nexcept Exception as error:\n    print('late', error)",
        MAGIC + "def pkg(x: int) -> int:\n    import not_a_local_module_xyz\n    return x\n",
        "try:\n    pkg.remote(1)\nexcept Exception as error:\n    print('pkg', error)",
    ]
    texts = run_notebook(control_plane, tmp_path, cells)

    first, again, edited = line(texts, "first"), line(texts, "again"), line(texts, "edited")
    assert first[:2] == ["6", "6"] and again == first
    assert edited[:2] == ["8", "8"] and edited[2] != first[2]
    assert line(texts, "card")[-3:] == ["modules:", "mydep,", "mylib"]
    assert line(texts, "included") == ["10", "10", "True"]

    outside, compiled = texts[12], texts[13]
    assert (
        "UsageError" in outside and "include=../outside.py" in outside and "outside the notebook's directory" in outside
    )
    assert "UsageError" in compiled and "fast.cpython-312-x86_64-linux-gnu.so, a compiled extension module" in compiled

    late = "\n".join(row for row in texts[16].splitlines())
    assert "No module named 'later'" in late
    assert "'later' is a local module (later.py next to the notebook) that was not shipped" in late
    assert "include=later.py" in late
    assert "'not_a_local_module_xyz' is not a file next to the notebook, so it is a package to declare" in texts[18]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_on_the_ray_executor(ray_cp, tmp_path):
    """One notebook using all of it, its jobs run by Ray: a local module, a config dict, a default, `open`."""
    (tmp_path / "mylib.py").write_text("def helper(x):\n    return x + 100\n")
    (tmp_path / "data.txt").write_text("hello")
    cells = [
        "%load_ext lancefn_jupyter",
        f"%lancefn connect {ray_cp.url}",
        "CONFIG = {'scale': 2, 'names': ('a', 'b')}",
        "%%gpu_function num_gpus=1 gpu_class=small\nfrom mylib import helper\n\n"
        "def every(path: str, *, extra: int = 1) -> int:\n"
        "    with open(path) as f:\n"
        "        return helper(len(f.read()) * CONFIG['scale'] + extra)\n",
        f"P = {str(tmp_path / 'data.txt')!r}\n"
        "print('ray', every.local(P), every.submit(P).result(), every.remote(P, extra=0))",
    ]
    texts = run_notebook(ray_cp, tmp_path, cells)
    assert line(texts, "ray") == ["111", "111", "110"]
