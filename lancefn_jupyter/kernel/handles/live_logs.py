"""A job's prints under the cell that waits for it, as they happen (docs/ARCHITECTURE.md, "Live output"): in order,
stdout to the cell's stdout and stderr to its stderr, at most ``LIVE_LINES_SHOWN`` lines per job, then one line
saying how many more there are and where they are (``job.logs()`` keeps every one)."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["LIVE_LINES_SHOWN", "LiveLog"]

LIVE_LINES_SHOWN = 200  # lines of one job shown under the cell; the rest are counted and said once

# (job_id, offset) → (lines, streams, next_offset): the client's ``jobs.log_entries``.
Fetch = Callable[[str, int], tuple[list[str], list[str], int]]


class LiveLog:
    """Follows one job's stored log from offset 0: each :meth:`pull` prints what came since the last one."""

    def __init__(self, job_id: str, fetch: Fetch, *, shown: int = LIVE_LINES_SHOWN) -> None:
        self.job_id, self._fetch, self._shown = job_id, fetch, shown
        self._offset = self._printed = self._held = 0

    def pull(self) -> None:
        """Print the lines logged since the last pull (every page of them), within the display's limit."""
        while True:
            lines, streams, next_offset = self._fetch(self.job_id, self._offset)
            for line, stream in zip(lines, streams, strict=False):
                if self._printed < self._shown:
                    print(line, file=sys.stderr if stream == "stderr" else sys.stdout)
                    self._printed += 1
                else:
                    self._held += 1
            if not lines or next_offset == self._offset:
                return
            self._offset = next_offset

    def close(self) -> None:
        """The job ended: its last lines, and how many were not shown."""
        self.pull()
        if self._held:
            print(f"[lancefn] {self._held} lines more — job.logs()", file=sys.stdout)
        sys.stdout.flush()
