"""A job's prints under the cell that waits for it, as they happen (docs/ARCHITECTURE.md, "Live output"): in order,
stdout to the cell's stdout and stderr to its stderr, at most ``LIVE_LINES_SHOWN`` lines per job, then one line
saying how many more there are and where they are (``job.logs()`` keeps every one). The job widget and a batch's
chunks follow the same way, into their own sink."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["LIVE_LINES_SHOWN", "LiveLog", "print_line"]

LIVE_LINES_SHOWN = 200  # lines of one job shown under the cell; the rest are counted and said once

# (job_id, offset) → (lines, streams, next_offset): the client's ``jobs.log_entries``.
Fetch = Callable[[str, int], tuple[list[str], list[str], int]]
# (line, stream) → shown somewhere: the cell's streams, a widget's output area.
Emit = Callable[[str, str], None]


def print_line(line: str, stream: str) -> None:
    """Show a line under the running cell: stderr lines on its stderr, every other on its stdout."""
    print(line, file=sys.stderr if stream == "stderr" else sys.stdout)


class LiveLog:
    """Follows one job's stored log from offset 0: each :meth:`pull` shows what came since the last one.

    ``prefix`` starts every shown line (a batch's ``[chunk 3] ``); ``more`` is where the lines not shown are."""

    def __init__(
        self,
        job_id: str,
        fetch: Fetch,
        *,
        shown: int = LIVE_LINES_SHOWN,
        emit: Emit = print_line,
        prefix: str = "",
        more: str = "job.logs()",
    ) -> None:
        self.job_id, self._fetch, self._shown, self._emit = job_id, fetch, shown, emit
        self._prefix, self._more = prefix, more
        self._offset = self._printed = self._held = 0
        self.closed = False

    def pull(self) -> None:
        """Show the lines logged since the last pull (every page of them), within the display's limit."""
        while True:
            lines, streams, next_offset = self._fetch(self.job_id, self._offset)
            for line, stream in zip(lines, streams, strict=False):
                if self._printed < self._shown:
                    self._emit(self._prefix + line, stream)
                    self._printed += 1
                else:
                    self._held += 1
            if not lines or next_offset == self._offset:
                return
            self._offset = next_offset

    def close(self) -> None:
        """The job ended: its last lines, and how many were not shown (once)."""
        if self.closed:
            return
        self.closed = True
        self.pull()
        if self._held:
            self._emit(f"{self._prefix}[lancefn] {self._held} lines more — {self._more}", "stdout")
        sys.stdout.flush()
