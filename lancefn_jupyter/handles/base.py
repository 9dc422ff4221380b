"""What the job and batch handles share (`jobs.Job`, `batch.Batch`): the record as last seen, read
on first use and again on `refresh()`, and waits that Ctrl-C stops without stopping the work."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

__all__ = ["RecordHandle", "waiting"]

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
