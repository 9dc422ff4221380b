"""The import paths users write stay (docs/ARCHITECTURE.md, "Package layout"): the kernel side lives in
``lancefn_jupyter.kernel``, and each old path users import from is a re-export of it, never a copy, so
``lancefn_jupyter.client.Client is lancefn_jupyter.kernel.client.Client``. Names stored in artifacts keep
their path: the prelude's ``lancefn_jupyter.local_modules`` and the packaging names' ``__module__``."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "lancefn_jupyter"

# public path -> the kernel module it re-exports
REEXPORTS = {
    "lancefn_jupyter.client": "lancefn_jupyter.kernel.client",
    "lancefn_jupyter.packaging": "lancefn_jupyter.kernel.packaging",
    "lancefn_jupyter.dashboards": "lancefn_jupyter.kernel.dashboards",
    "lancefn_jupyter.handles.local_run": "lancefn_jupyter.kernel.handles.local_run",
}


@pytest.mark.parametrize(("public", "kernel"), sorted(REEXPORTS.items()))
def test_a_public_path_gives_the_kernel_modules_very_names(public, kernel):
    shim, owner = importlib.import_module(public), importlib.import_module(kernel)
    assert shim.__all__ == owner.__all__ and shim.__all__
    for name in owner.__all__:
        assert getattr(shim, name) is getattr(owner, name), name


@pytest.mark.parametrize("public", sorted(REEXPORTS))
def test_a_public_path_holds_a_docstring_and_imports_only(public):
    path = PACKAGE.parent.joinpath(*public.split("."))
    path = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"
    body = ast.parse(path.read_text()).body
    assert ast.get_docstring(ast.Module(body=body, type_ignores=[])), path
    assert all(isinstance(node, ast.ImportFrom) for node in body[1:]), path


def test_the_names_users_import_from_the_root_are_served_by_the_kernel_package():
    import lancefn_jupyter
    from lancefn_jupyter import Job, connect, gpu_function, lookup
    from lancefn_jupyter.embedded import stop_server
    from lancefn_jupyter.handles.local_run import gpu_available

    assert gpu_function.__module__ == "lancefn_jupyter.kernel.handles.function"
    assert {Job.__module__, connect.__module__, lookup.__module__} == {
        "lancefn_jupyter.kernel.handles.job",
        "lancefn_jupyter.kernel.session",
        "lancefn_jupyter.kernel.handles.lookup",
    }
    assert callable(stop_server) and callable(gpu_available)
    assert set(lancefn_jupyter.__all__) - {"__version__"} <= set(dir(lancefn_jupyter.kernel.api)) | {
        "load_ipython_extension",
        "unload_ipython_extension",
    }


def test_packaging_names_keep_the_module_path_artifacts_import_them_from():
    from lancefn_jupyter.kernel import packaging

    for name in packaging.__all__:
        assert getattr(packaging, name).__module__ == "lancefn_jupyter.packaging", name


def test_the_artifact_prelude_imports_the_worker_half_of_local_modules_alone(tmp_path):
    """The prelude names ``lancefn_jupyter.local_modules``; in a fresh interpreter (as a worker) it installs the
    shipped modules without loading any kernel module."""
    from lancefn_jupyter.kernel.local_modules import prelude_line

    prelude = prelude_line({"shipped_mod_45": ("shipped_mod_45.py", b"VALUE = 45\n")})
    code = (
        "import sys\n"
        f"{prelude}\n"
        "import shipped_mod_45\n"
        "print(shipped_mod_45.VALUE, sorted(m for m in sys.modules if m.startswith('lancefn_jupyter.kernel')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.split(None, 1) == ["45", "[]\n"]
