"""Jupyter server extension: authenticated handlers under `<base_url>/lancefn/` that proxy the
JupyterLab "GPU Functions" panel to the control plane (see `handlers.py`), plus the extension
points JupyterLab and jupyter_server look up (re-exported by `lancefn_jupyter/__init__.py`).

Enabled on install by `jupyter-config/server-config/lancefn_jupyter.json`
(`etc/jupyter/jupyter_server_config.d/`); by hand: `jupyter server extension enable lancefn_jupyter`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "_jupyter_labextension_paths",
    "_jupyter_server_extension_points",
    "_load_jupyter_server_extension",
    "load_jupyter_server_extension",
]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    # `src` is relative to the package that exposes this (lancefn_jupyter): the prebuilt assets
    # live in lancefn_jupyter/labextension (built by `npm run build:prod` in labextension/).
    return [{"src": "labextension", "dest": "lancefn-jupyter"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "lancefn_jupyter"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    from lancefn_jupyter.jupyter.handlers import setup_handlers

    patterns = setup_handlers(server_app.web_app)
    server_app.log.info("lancefn_jupyter: GPU Functions proxy registered at %s", ", ".join(patterns))


# The older public name, which `lancefn_jupyter._load_jupyter_server_extension` calls.
load_jupyter_server_extension = _load_jupyter_server_extension
