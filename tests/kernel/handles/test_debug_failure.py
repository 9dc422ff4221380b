"""Debugging a remote failure here (docs/ARCHITECTURE.md, "Debugging a failure"): the failing row and the remote
frames' locals kept with the failure, `job.failure.frames`, and `job.debug()` / `%gpu_debug JOB_ID` stepping into the
failing row with IPython's post-mortem debugger, driven by scripted commands."""

from __future__ import annotations

import contextlib
import io
import os

import pytest

from lancefn_jupyter.kernel.handles.job import Job, RemoteFunctionError
from lancefn_jupyter.kernel.session import current_client
from lancefn_jupyter.wire.frames import REPR_MAX

SECRET = "hunter2-model-key"

BOOM = """
import os

def boom(x: int) -> int:
    label = "using " + os.environ["MODEL_KEY"]
    api_token = "a value shown nowhere"
    scale = x * 10
    big = list(range(100000))
    if x == 3:
        raise ValueError(f"bad row {x}")
    return scale
"""


def _failed_job(ip) -> tuple[object, Job]:
    """boom over rows 1, 3, 4 as one job: it fails at its second row."""
    ip.run_cell_magic("gpu_function", f"env=MODEL_KEY={SECRET}", BOOM)
    boom = ip.user_ns["boom"]
    record = current_client().functions.run_job("boom", boom.version.version, [{"x": 1}, {"x": 3}, {"x": 4}])
    job = Job(record.job_id, function=boom)
    with pytest.raises(RemoteFunctionError) as raised:
        job.result()
    return raised.value, job


def test_a_failed_job_keeps_its_failing_row_and_the_remote_locals_bounded_and_redacted(ip):
    error, job = _failed_job(ip)
    failure = job.failure
    assert (failure.failing_rows, failure.rows) == ((1, 2), [{"x": 3}])
    frame = failure.frames[-1]
    lines = ip.user_ns["boom"].artifact_source.splitlines()
    raise_line = next(n for n, line in enumerate(lines, 1) if "raise ValueError" in line)
    assert frame.function == "boom" and frame.line == raise_line  # in the artifact
    assert frame.locals["x"] == "3" and frame.locals["scale"] == "30"
    assert frame.locals["label"] == "'using <redacted>'"  # the env value, whatever the local's name
    assert frame.locals["api_token"] == "<redacted>"  # a secret's name: never shown
    assert frame.locals["big"].startswith("[0, 1, 2") and len(frame.locals["big"]) <= REPR_MAX
    described = current_client().jobs.describe(job.job_id).failure  # what any other client reads
    assert described == failure and SECRET not in str(described)
    # The error a waiting call raises shows them at the cell's lines, with the way in.
    assert "Remote locals (job.debug() steps into the failing row here)" in str(error)
    assert "scale = 30" in str(error) and "x = 3" in str(error) and "boom (cell line 11)" in str(error)


def test_job_debug_reruns_the_failing_row_and_stops_at_the_failing_line_with_its_locals(ip):
    _, job = _failed_job(ip)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        job.debug(commands=["p scale * 2", "p label", "q"])
    text = out.getvalue()
    assert "its locals there:\nboom (cell line 11):\n    x = 3\n" in text and "scale = 30" in text  # remote, first
    assert "the row fails here too" in text  # .local(): the same artifact reproduced it
    assert "raise ValueError" in text  # the debugger's current line: the failing one
    assert "60" in text and f"'using {SECRET}'" in text  # the live frame's locals, the env set as in the worker
    assert "MODEL_KEY" not in os.environ  # and taken out of the kernel's environment afterwards


def test_gpu_debug_magic_steps_into_a_job_known_by_id(ip, monkeypatch):
    _, job = _failed_job(ip)
    monkeypatch.setattr("sys.stdin", io.StringIO("p x + 100\nq\n"))  # typed at the debugger's prompt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ip.run_line_magic("gpu_debug", job.job_id)
    assert "103" in out.getvalue()


def test_a_job_that_did_not_fail_cannot_be_debugged(ip):
    ip.run_cell_magic("gpu_function", f"env=MODEL_KEY={SECRET}", BOOM)
    job = ip.user_ns["boom"].submit(1)
    assert job.result() == 10 and job.failure is None
    with pytest.raises(Exception, match="only a failed job can be debugged"):
        job.debug()


LOADER = """
class Loader:
    def setup(self):
        shards = ["a.bin", "b.bin"]
        missing = shards[1]
        raise FileNotFoundError(missing)

    def __call__(self, x: int) -> int:
        return x
"""


def test_a_failed_setup_keeps_its_locals_and_job_debug_stops_in_setup(ip):
    ip.run_cell_magic("gpu_function", "", LOADER)
    loader = ip.user_ns["Loader"]
    job = loader.submit(7)
    with pytest.raises(RemoteFunctionError, match="phase setup"):
        job.result()
    failure = job.failure
    assert failure.failing_rows == (0, 1) and failure.rows == [{"x": 7}]
    assert failure.frames[-1].function == "setup" and failure.frames[-1].locals["missing"] == "'b.bin'"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        job.debug(commands=["p missing.upper()", "q"])
    assert "'B.BIN'" in out.getvalue() and "raise FileNotFoundError" in out.getvalue()


def test_batch_debug_steps_into_the_failed_chunks_failing_row(ip):
    ip.run_cell_magic("gpu_function", f"env=MODEL_KEY={SECRET}", BOOM)
    batch = ip.user_ns["boom"].map([1, 2, 3, 4], chunk_size=2)
    with pytest.raises(Exception, match="bad row 3"):
        batch.result()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        batch.debug(commands=["p x * 1000", "q"])
    assert "3000" in out.getvalue() and "scale = 30" in out.getvalue()
