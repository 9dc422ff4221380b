"""``lancefn-dashboard``: serve the team dashboard (`gpu.ipynb`) with Voilà on 127.0.0.1.

    lancefn-dashboard [--port 8866] [--open]

The dashboard's kernel connects as any kernel does (docs/ARCHITECTURE.md, "Front ends"): ``LANCEFN_URL``
and ``LANCEFN_API_KEY`` when set, else the embedded control plane in ``$LANCEFN_HOME`` (started if needed).
Voilà comes with the ``dashboard`` extra (``pip install 'lancefn-jupyter[dashboard]'``); this module is
the only one that runs it, and it is never imported by a kernel.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["NOTEBOOK", "main", "voila_argv"]

NOTEBOOK = Path(__file__).resolve().parent / "gpu.ipynb"
DEFAULT_PORT = 8866  # Voilà's own default
MISSING_VOILA = "lancefn-dashboard needs Voilà: pip install 'lancefn-jupyter[dashboard]'"


def voila_argv(port: int, *, open_browser: bool = False, python: str = sys.executable) -> list[str]:
    """The command that serves the dashboard notebook on 127.0.0.1:``port``."""
    argv = [python, "-m", "voila", str(NOTEBOOK), f"--port={port}", "--Voila.ip=127.0.0.1"]
    if not open_browser:
        argv.append("--no-browser")
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lancefn-dashboard",
        description="Serve the team dashboard (GPU classes, queues, jobs and batches, live) with Voilà on 127.0.0.1. "
        "It uses LANCEFN_URL/LANCEFN_API_KEY when set, else the embedded control plane.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    parser.add_argument("--open", action="store_true", help="open it in a browser")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not 0 < args.port < 65536:
        _parser().error(f"--port must be 1-65535, got {args.port}")
    if importlib.util.find_spec("voila") is None:
        sys.exit(MISSING_VOILA)
    command = voila_argv(args.port, open_browser=args.open)
    os.execv(command[0], command)  # Voilà in this process: Ctrl-C and signals reach it directly


if __name__ == "__main__":
    main()
