"""A version's environment as a notebook user meets it (docs/ARCHITECTURE.md, "Environments"): ``%%gpu_function
pip=<a package the kernel lacks>`` cells executed by nbclient against a real control plane, whose jobs and
``.local()`` calls import it; ``python_version=3.99`` shows the server's warning under the cell."""

from __future__ import annotations

from helpers import absent_packages
from test_warm_state_notebooks import report, run_notebook


def test_a_declared_package_is_there_for_jobs_and_local_and_another_python_warns_under_the_cell(
    control_plane, tmp_path
):
    (package,) = absent_packages(1)
    out = run_notebook(
        control_plane,
        tmp_path,
        [
            f"%%gpu_function num_gpus=1 pip={package}\n"
            f"def which(x: int) -> str:\n    import {package}\n    return {package}.__name__ + str(x)\n",
            report("job", "which.remote(1)"),
            report("local", "which.local(2)"),
            "%%gpu_function num_gpus=1 python_version=3.99\ndef later(x: int) -> int:\n    return x\n",
        ],
    )
    texts = out["_texts"]
    assert out["job"] == f"{package}1", texts
    assert out.get("local") == f"{package}2", texts[-2]
    warned = texts[-1]
    assert "[lancefn] warning: later: " in warned and "3.99" in warned, warned
