"""What the kernel handles share (runs in the kernel; docs/ARCHITECTURE.md, "Client and API (kernel side)"):
`FunctionRef`, the part of a function that `Job`, `Batch` and the table map use (so they take any
function handle, not `GpuFunction`); `RecordHandle`, the record as last seen, read on first use and
again on `refresh()`; and waits that Ctrl-C stops without stopping the work."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from lancefn_jupyter.wire.models import FunctionRegistrationRequest, FunctionSignature, FunctionVersion

__all__ = ["FunctionRef", "RecordHandle", "waiting"]


class FunctionRef(Protocol):
    """What a job, a batch or a table map needs from the function it runs (`GpuFunction` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def timeout_s(self) -> float | None: ...

    @property
    def root(self) -> str | None:
        """The notebook's directory (for the missing-local-module hint), if known."""
        ...

    @property
    def version(self) -> FunctionVersion | None:
        """The registered version; None for a `register=no` function not registered yet."""
        ...

    @property
    def registration_request(self) -> FunctionRegistrationRequest: ...

    @property
    def signature(self) -> FunctionSignature: ...

    def item_row(self, item: Any) -> dict[str, Any]:
        """A map item as a row of the signature."""
        ...

    def parameter_defaults(self) -> dict[str, Any]: ...

    def map_traceback(self, text: str) -> str:
        """Remote error text at the user's lines."""
        ...

    def map_failure(self, message: str, traceback: str) -> tuple[str, str]:
        """(message, traceback) of a failure at the user's lines."""
        ...

    def debug_row(self, row: dict[str, Any], commands: Sequence[str] = ()) -> Any:
        """A failed job's row run again here, stopping in the post-mortem debugger where it fails
        (docs/ARCHITECTURE.md, "Debugging a failure")."""
        ...


R = TypeVar("R")


class RecordHandle(Generic[R]):
    """A handle on one record of the control plane (a job, a batch); subclasses say how to read it."""

    _snapshot: R | None

    def _describe(self) -> R:
        raise NotImplementedError

    @property
    def snapshot(self) -> R:
        """The record as last seen (fetched if never seen)."""
        if self._snapshot is None:
            self.refresh()
        assert self._snapshot is not None
        return self._snapshot

    def refresh(self) -> R:
        self._snapshot = self._describe()
        return self._snapshot


@contextmanager
def waiting(stopped: str) -> Iterator[None]:
    """Ctrl-C during the block stops waiting, not the remote work: print `stopped` (how to cancel it)."""
    try:
        yield
    except KeyboardInterrupt:
        print(stopped, file=sys.stderr)
        raise
