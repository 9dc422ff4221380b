"""The base error every part of the package raises about the control plane, `LancefnError`, and the one
wording of a wire model's refusal, `format_validation_error`.

They live in the wire layer because they cross runtimes: the kernel's client errors and the wire's
version lookups (``wire/versions.py``) both derive from `LancefnError`, and the server raises the latter
too; a wire model refused in the kernel (a backfill's options) and in the server (a request body) reads alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic stays unimported until a model is refused (``%load_ext`` stays fast)
    from pydantic import ValidationError

__all__ = ["LancefnError", "format_validation_error"]


class LancefnError(Exception):
    """Base class of every error this package raises about the control plane."""


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """Readable pydantic errors naming each field; never echoes input values (they may be secrets)."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in (prefix, *item["loc"]) if part != "")
        message = item["msg"].removeprefix("Value error, ")
        parts.append(f"{loc or 'body'}: {message}" if loc else message)
    return "; ".join(parts[:10]) + (f"; and {len(parts) - 10} more" if len(parts) > 10 else "")
