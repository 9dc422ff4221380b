"""lancefn-jupyter: register notebook cells as GPU function versions, watch their jobs live,
and develop them locally on a GPU or numba's CUDA simulator.

`%load_ext lancefn_jupyter` registers the magics and nothing else: the API below (pydantic models,
the HTTP client, widgets, numba) is imported on first use so loading the extension stays fast.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from lancefn_jupyter._version import __version__

if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Backfill",
    "Batch",
    "BatchError",
    "GpuFunction",
    "Job",
    "LancefnEnvironmentWarning",
    "RemoteFunctionError",
    "__version__",
    "connect",
    "connection_info",
    "current_client",
    "diff_versions",
    "gpu_function",
    "gpu_profile",
    "list_gpu_classes",
    "list_jobs",
    "list_versions",
    "load_ipython_extension",
    "lookup",
    "unload_ipython_extension",
    "version_history",
]

_API_NAMES = frozenset(__all__) - {"__version__", "load_ipython_extension", "unload_ipython_extension"}


def __getattr__(name: str) -> Any:
    if name == "secrets":  # the module (lancefn_jupyter.secrets.create(...)), imported on first use
        import importlib

        return importlib.import_module("lancefn_jupyter.secrets")
    if name in _API_NAMES:
        from lancefn_jupyter.kernel import api

        return getattr(api, name)
    raise AttributeError(f"module 'lancefn_jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    from lancefn_jupyter.kernel.magics import GpuMagics

    ipython.register_magics(GpuMagics)


def unload_ipython_extension(ipython: Any) -> None:
    # Magics stay registered (IPython has no unregister); the event listener is stopped (the
    # session owns it: a session never imported has none).
    session = sys.modules.get("lancefn_jupyter.kernel.session")
    if session is not None:
        session.stop_listener()


# Jupyter server and JupyterLab extension points (implemented in lancefn_jupyter.jupyter).
def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "lancefn-jupyter"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "lancefn_jupyter"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from lancefn_jupyter.jupyter import load_jupyter_server_extension

    load_jupyter_server_extension(server_app)
