"""Secrets of the connected key's namespace from a notebook (docs/ARCHITECTURE.md, "Secrets"): `%gpu_secret NAME`
asks for the value with `getpass`, so it is never in the notebook; a function binds it by name
(`%%gpu_function secret=HF_TOKEN`, `gpu_function(secrets=["hf:HF_TOKEN"])`) and its jobs get it as an environment
variable. Values go to the control plane and never come back."""

from __future__ import annotations

import builtins

from lancefn_jupyter.kernel.client import ApiError
from lancefn_jupyter.kernel.session import current_client

__all__ = ["alter", "create", "describe", "drop", "list", "prompt", "set"]


def create(name: str, value: str) -> None:
    """A new secret; an error if one of that name exists (change it with :func:`alter` or :func:`set`)."""
    current_client().secrets.create(name, value)


def alter(name: str, value: str) -> None:
    """A new value for an existing secret: no function version changes; the next job gets it."""
    current_client().secrets.alter(name, value)


def set(name: str, value: str) -> str:
    """Create the secret, or alter it when it exists; returns ``"created"`` or ``"altered"``."""
    client = current_client()
    try:
        client.secrets.create(name, value)
        return "created"
    except ApiError as error:
        if error.status != 409:
            raise
    client.secrets.alter(name, value)
    return "altered"


def prompt(name: str) -> str:
    """Ask for the value without echoing it (`getpass`) and :func:`set` it (what `%gpu_secret NAME` does)."""
    import getpass

    value = getpass.getpass(f"value of secret {name} (not shown): ")
    if not value:
        raise ValueError(f"no value given; secret {name!r} is unchanged")
    return set(name, value)


def describe(name: str) -> dict:
    """``{name, created_at_millis, updated_at_millis}``: never the value."""
    return current_client().secrets.describe(name)


def list() -> builtins.list[str]:
    """The names of the namespace's secrets."""
    return current_client().secrets.list()


def drop(name: str) -> None:
    """Remove the secret: jobs of versions that bind it fail (phase ``environment``) until it is created again."""
    current_client().secrets.drop(name)
