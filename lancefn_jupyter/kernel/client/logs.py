"""The kernel's logger (runs in the kernel), and where the package's one logger scheme is written down.

One logger per runtime, named ``lancefn.<runtime>``, so a user filters a whole process with one name:
``lancefn.kernel`` (the notebook kernel: magics, handles, widgets, the client and its event listener),
``lancefn.server`` (the control plane) and ``lancefn.worker`` (the worker process).
"""

from __future__ import annotations

import logging

__all__ = ["KERNEL_LOGGER", "log"]

KERNEL_LOGGER = "lancefn.kernel"

log = logging.getLogger(KERNEL_LOGGER)
