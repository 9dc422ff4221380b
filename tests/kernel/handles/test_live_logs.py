"""A job's prints under the cell that waits for it, as they happen (docs/ARCHITECTURE.md, "Live output")."""

from __future__ import annotations

import contextlib
import time

from lancefn_jupyter.kernel.display import live_logs
from lancefn_jupyter.kernel.handles.job import Job
from lancefn_jupyter.kernel.session import current_client

TALK = """
import os
import time

def talk(n: int) -> int:
    for i in range(n):
        print(f"line {i}", flush=True)
        if i == 1:
            os.write(2, f"warn {i}\\n".encode())
        time.sleep(0.3)
    return n
"""


class Recorder:
    """A stream that keeps each write with when it came."""

    def __init__(self) -> None:
        self.writes: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        if text.strip():
            self.writes.append((time.time() * 1000, text.strip()))
        return len(text)

    def flush(self) -> None:
        pass


def test_prints_arrive_in_order_while_the_job_runs_with_stderr_apart_and_a_flood_is_cut_short(ip):
    ip.run_cell_magic("gpu_function", "num_gpus=1", TALK)
    talk = ip.user_ns["talk"]
    out, err = Recorder(), Recorder()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        job = talk.submit(6)
        assert job.result() == 6
    finished = job.snapshot.finished_ms
    assert [text for _, text in out.writes] == [f"line {i}" for i in range(6)]
    assert [text for _, text in err.writes] == ["warn 1"]
    assert out.writes[0][0] < finished  # shown while the job ran, not after it ended
    stored = job.logs().splitlines()  # each stream in order (two pipes: their lines may interleave either way)
    assert [line for line in stored if line.startswith("line")] == [f"line {i}" for i in range(6)]
    assert len(stored) == 7 and "warn 1" in stored

    out = Recorder()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(Recorder()):
        follower = live_logs.LiveLog(job.job_id, current_client().jobs.log_entries, shown=3)
        follower.close()
    assert [text for _, text in out.writes] == ["line 0", "line 1", "[lancefn] 4 lines more — job.logs()"]


SHOUT = """
import time

def shout(x: int) -> int:
    for i in range(3):
        print(f"row {x} line {i}", flush=True)
        time.sleep(0.3)
    return x
"""


def test_a_batch_shows_each_running_chunk_s_prints_as_the_chunk_runs(ip):
    ip.run_cell_magic("gpu_function", "num_gpus=1", SHOUT)
    shout = ip.user_ns["shout"]
    out = Recorder()
    with contextlib.redirect_stdout(out):
        batch = shout.map([0, 1, 2, 3], parallel=2, chunk_size=2)
        assert batch.result() == [0, 1, 2, 3]
    chunks = batch.refresh().chunks or ()
    assert len(chunks) == 2
    for chunk in chunks:
        shown = [(when, text) for when, text in out.writes if text.startswith(f"[chunk {chunk.index}] ")]
        rows = range(chunk.row_start, chunk.row_end)
        assert [text for _, text in shown] == [
            f"[chunk {chunk.index}] row {x} line {i}" for x in rows for i in range(3)
        ]
        assert chunk.job_id is not None
        assert shown[0][0] < Job.attach(chunk.job_id).snapshot.finished_ms  # while the chunk ran


NOISY = """
def noisy(x: int) -> int:
    print(f"row {x} a")
    print(f"row {x} b", flush=True)
    return x
"""


def test_each_row_s_prints_are_tagged_with_its_row_in_a_map_and_a_batch(ip):
    ip.run_cell_magic("gpu_function", "num_gpus=1", NOISY)
    noisy = ip.user_ns["noisy"]
    job = noisy.map([10, 11, 12, 13])
    assert job.result() == [10, 11, 12, 13]
    assert job.logs(row=2) == "row 12 a\nrow 12 b"
    assert job.logs(row=7) == ""  # no such row: nothing
    assert job.logs().splitlines() == [f"row {x} {part}" for x in range(10, 14) for part in "ab"]  # nothing lost
    assert noisy.submit(5).wait().logs(row=0) == "row 5 a\nrow 5 b"

    batch = noisy.map(list(range(20, 26)), parallel=2, chunk_size=3)
    assert batch.result() == list(range(20, 26))
    assert batch.logs(row=4) == "row 24 a\nrow 24 b"  # row 1 of the second chunk
    assert batch.logs().splitlines() == [f"row {x} {part}" for x in range(20, 26) for part in "ab"]
