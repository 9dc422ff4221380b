"""Job states as the control plane compares them, taken from the one state table in
``wire/models.py`` (``JobState``), and the clock state changes are stamped with.  Runs in the
control plane; pure."""

from __future__ import annotations

import time

from lancefn_jupyter.wire.models import TERMINAL_STATES, JobState

PENDING, IN_PROGRESS = JobState.PENDING.value, JobState.IN_PROGRESS.value
DONE, FAILED = JobState.DONE.value, JobState.FAILED.value
CANCELLED, TIMED_OUT = JobState.CANCELLED.value, JobState.TIMED_OUT.value
TERMINAL = frozenset(state.value for state in TERMINAL_STATES)
ACTIVE = (PENDING, IN_PROGRESS)


def now_ms() -> int:
    """Epoch milliseconds: creation, start and finish times of jobs and batches."""
    return int(time.time() * 1000)
