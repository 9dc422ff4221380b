"""The intake's lane choice (``control/intake.py``, ``choose_lane``; docs/ARCHITECTURE.md, "Starting a job"): which
lane a request's job takes, from the request alone. Pure. The lanes themselves run against a real plane in
test_run_now.py, test_inline_wait.py, test_environment_stage.py and over HTTP in tests/server/http/."""

from __future__ import annotations

from pathlib import Path

import pytest

from lancefn_jupyter.server.control.intake import BatchChunk, JobRequest, Lane, choose_lane

pytestmark = pytest.mark.unit

ROWS = [{"x": 1}]
CHUNK = BatchChunk("b1", 0, 0)
SLICE = {"uri": "/t.lance", "ranges": [[0, 0, 8]]}


def request(**fields) -> JobRequest:
    return JobRequest("f", "v1", {"home": "team"}, **fields)


@pytest.mark.parametrize(
    ("fields", "lane"),
    [
        # A small JSON body waiting for its job: the loop queues it and runs a warm one itself.
        ({"rows": ROWS, "wait_s": 0.02, "small": True}, Lane.LOOP_WAITING),
        # Too large to check on the loop, or Arrow rows: a core thread queues it and runs a warm one for a while.
        ({"rows": ROWS, "wait_s": 0.02}, Lane.CORE_WAITING),
        ({"arrow_rows": Path("rows/x.arrow"), "wait_s": 5.0, "small": True}, Lane.CORE_WAITING),
        # No wait (``wait_s`` 0 answers the job as it stands at once): JSON rows are saved with other requests'.
        ({"rows": ROWS, "small": True}, Lane.GROUPED),
        ({"rows": ROWS}, Lane.GROUPED),
        ({"rows": ROWS, "wait_s": 0.0, "small": True}, Lane.GROUPED),
        ({"arrow_rows": Path("rows/x.arrow")}, Lane.CORE),
        # A batch's or backfill's chunk: its batch's thread and transaction, whatever else it says.
        ({"rows": ROWS, "chunk": CHUNK}, Lane.CHUNK),
        ({"arrow_rows": Path("rows/x.arrow"), "chunk": CHUNK}, Lane.CHUNK),
        ({"table_slice": SLICE, "chunk": BatchChunk("b1", 3, 24, "skip")}, Lane.CHUNK),
        ({"rows": ROWS, "wait_s": 1.0, "small": True, "chunk": CHUNK}, Lane.CHUNK),
    ],
)
def test_each_request_takes_its_lane(fields, lane):
    assert choose_lane(request(**fields)) is lane


def test_a_request_with_no_rows_still_has_a_lane_whose_check_answers_it():
    """Missing rows are JSON rows (a 400 from the check names the fix), never a lane of their own."""
    assert choose_lane(request()) is Lane.GROUPED
    assert choose_lane(request(wait_s=1.0, small=True)) is Lane.LOOP_WAITING
