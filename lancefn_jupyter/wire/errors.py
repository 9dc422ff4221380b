"""The base error every part of the package raises about the control plane, `LancefnError`.

It lives in the wire layer because it crosses runtimes: the kernel's client errors and the wire's
version lookups (``wire/versions.py``) both derive from it, and the server raises the latter too.
"""

from __future__ import annotations

__all__ = ["LancefnError"]


class LancefnError(Exception):
    """Base class of every error this package raises about the control plane."""
