"""What a function version asks of its Python environment, read from its runtime (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EnvironmentRequest"]


@dataclass(frozen=True)
class EnvironmentRequest:
    """A version's ``runtime.environment`` plus its ``python_version``: what its workers need.

    ``packages`` are PEP 508 requirements for ``kind="pip"``, conda specs for ``kind="conda"``; ``digest`` is the
    version's ``environment_digest`` ("" when the runtime names no environment)."""

    kind: str = "pip"
    packages: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    image: str | None = None
    python_version: str | None = None  # "3.12"; None: whatever the base Python is
    digest: str = ""

    @classmethod
    def from_runtime(cls, runtime: Mapping[str, Any], digest: str = "") -> EnvironmentRequest:
        """From a stored definition's ``runtime`` mapping (its wire form)."""
        env = runtime.get("environment") or {}
        return cls(
            kind=env.get("kind") or "pip",
            packages=tuple(env.get("packages") or ()),
            channels=tuple(env.get("channels") or ()),
            image=env.get("image"),
            python_version=runtime.get("python_version"),
            digest=digest,
        )

    @property
    def pip(self) -> tuple[str, ...]:
        """The pip requirements (none for a conda environment)."""
        return self.packages if self.kind == "pip" else ()

    @property
    def conda(self) -> tuple[str, ...]:
        return self.packages if self.kind == "conda" else ()

    def describe(self) -> str:
        """'3 packages' / '1 package' / 'Python 3.12': for pending reasons and logs."""
        count = len(self.packages)
        if count:
            return f"{count} package{'s' if count != 1 else ''}"
        return f"Python {self.python_version}" if self.python_version else "no packages"
