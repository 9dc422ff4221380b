"""A worker's protocol is bounded and checked (docs/ARCHITECTURE.md, "Worker protocol"): a job that writes straight
to its worker's protocol channel can neither make the control plane buffer an endless line, nor store an oversized
result, nor end its job with an event the protocol does not have, nor outlive its ``timeout_s``. A real server,
real workers; the jobs find the channel as any job could (the worker's ``Protocol`` object)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import register, registration_body
from helpers import let_workers_reach_this_python, submit, text_body, wait_done

from lancefn_jupyter.wire.frames import FRAMES_MAX, LOCALS_MAX, NAME_MAX, REPR_MAX
from lancefn_jupyter.worker.protocol import JSON_RESULT_MAX_BYTES, LINE_MAX_BYTES

pytestmark = pytest.mark.timeout(180)

#: ``path`` is a Python expression of (bytes or text to write to the worker's protocol fd, then what: "hold" sleeps
#: ``HOLD_S`` (far longer than any wait here, so only the server can end it), "exit" ends the worker, "return"
#: returns); empty: return at once.
FORGE = """
import gc
import os
import time

HOLD_S = 120


def forge(path: str) -> str:
    data, then = eval(path) if path else (b"", "return")
    proto = next(o for o in gc.get_objects() if type(o).__name__ == "Protocol" and hasattr(o, "_fd"))
    view = memoryview(data.encode() if isinstance(data, str) else data)
    while view:
        view = view[os.write(proto._fd, view) :]
    if then == "exit":
        os._exit(0)
    if then == "hold":
        time.sleep(HOLD_S)
    return "forged"
"""


def forge(http, version: str, data: str, then: str = "hold", timeout_s: float | None = None) -> dict:
    """Runs one forging job to its end: ``data``, a Python expression of what it writes."""
    job = submit(http, "forge", version, [{"path": f"({data}, {then!r})"}], timeout_s=timeout_s)
    return wait_done(http, job, timeout=60)


def next_job_runs(http, version: str) -> None:
    job = wait_done(http, submit(http, "forge", version, [{"path": ""}]))
    assert job["job_state"] == "DONE" and job["result"] == ["forged"], job


@pytest.fixture(scope="module")
def forging(shared_control_plane):
    with shared_control_plane.http() as http:
        version = register(http, text_body("forge", FORGE, num_gpus=None))["version"]
        yield shared_control_plane, http, version


def no_traceback(cp) -> None:
    log = cp.log_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


def test_a_line_over_the_limit_fails_the_job_in_phase_worker_and_the_next_job_runs(forging):
    cp, http, version = forging
    job = forge(http, version, f'b\'{{"event":"log","stream":"stdout","lines":["\' + b\'x\' * {LINE_MAX_BYTES}')
    assert job["job_state"] == "FAILED", job
    failure = job["failure"]
    assert failure["phase"] == "worker", failure
    assert "longer than 2 MiB" in failure["message"] and "Arrow files" in failure["message"], failure
    next_job_runs(http, version)
    no_traceback(cp)


def test_a_forged_oversized_json_result_is_refused_in_phase_result_and_never_stored(forging):
    cp, http, version = forging
    size = JSON_RESULT_MAX_BYTES + 1024
    line = f'\'{{"event":"result","results":["\' + \'x\' * {size} + \'"]}}\\n\''
    job = forge(http, version, line, then="exit")
    assert job["job_state"] == "FAILED" and "result" not in job, {k: v for k, v in job.items() if k != "result"}
    failure = job["failure"]
    assert failure["phase"] == "result" and "over the limit of 1 MiB" in failure["message"], failure
    assert len(http.post("/v1/jobs/describe", json={"job_id": job["job_id"]}).content) < 8 * 1024
    assert len(http.post("/v1/jobs/list", json={}).content) < 64 * 1024
    next_job_runs(http, version)
    no_traceback(cp)


@pytest.mark.parametrize(
    ("event", "invalid"),
    [
        ('{"event":"failed","phase":"bogus","message":"forged"}', "failed event: its phase is 'bogus'"),
        ('{"event":"failed","phase":"timeout","message":"forged"}', "failed event: its phase is 'timeout'"),
        ('{"event":"bogus"}', "bogus event: no such event"),
        ('{"event":"progress","rows_done":"many"}', "progress event: rows_done"),
        ('{"event":"log","stream":"stdout","lines":7}', "log event: its lines"),
        ('{"event":"log","stream":"stdout","lines":["a","b"],"rows":[1]}', "log event: its rows"),
        ('{"event":"log","stream":"stdout","lines":["a"],"rows":[-1]}', "log event: its rows"),
        ('{"event":"result","results":"not a list"}', "result event: results is not a list"),
        ('{"event":"result","results":["forged"],"task_id":"another"}', "result event: it is for another task"),
        ('{"event":"result","results":["a"]}\n{"event":"result","results":["b"]}', "result event: a second outcome"),
        ('{"event":"failed","phase":"run","message":"m","frames":"x"}', "failed event: its frames are not a list"),
        ('{"event":"failed","phase":"run","message":"m","failing_rows":[3,1]}', "failed event: its failing_rows"),
        ("[1, 2]", "protocol line: a line that is not a JSON object"),
        ("not json", "protocol line: a line that is not JSON"),
    ],
)
def test_a_forged_event_ends_the_job_cleanly_in_phase_worker_and_the_next_job_runs(forging, event, invalid):
    cp, http, version = forging
    job = forge(http, version, repr(event + "\n"), timeout_s=60)
    assert job["job_state"] == "FAILED", job
    failure = job["failure"]
    assert failure["phase"] == "worker", failure
    assert f"the worker sent an invalid {invalid}" in failure["message"], failure
    next_job_runs(http, version)
    no_traceback(cp)


def test_forged_failure_frames_are_kept_within_the_bounds_and_a_row_span_outside_the_rows_is_dropped(forging):
    """Debugging a failure: what a worker claims of its frames and failing rows is bounded on the control plane."""
    cp, http, version = forging
    frames = [{"function": "f" * 500, "line": 7, "locals": {f"v{i}": "x" * 300 for i in range(100)}}] * 40
    frames.append({"function": 7, "line": "no", "locals": []})  # malformed: left out
    frames.append({"function": "g", "line": 9, "locals": {"odd": "\ud800"}})  # a lone surrogate: stored as "?"
    event = {"event": "failed", "phase": "run", "message": "forged", "frames": frames, "failing_rows": [0, 5]}
    job = forge(http, version, f"__import__('json').dumps({event!r}) + '\\n'", then="exit")
    failure = job["failure"]
    assert failure["message"] == "forged" and "failing_rows" not in failure and "rows" not in failure, failure.keys()
    assert len(failure["frames"]) == FRAMES_MAX and failure["frames"][-1] == {
        "function": "g",
        "line": 9,
        "locals": {"odd": "?"},
    }
    for frame in failure["frames"][:-1]:
        assert len(frame["function"]) == NAME_MAX and len(frame["locals"]) == LOCALS_MAX
        assert all(len(text) == REPR_MAX and text.endswith("…") for text in frame["locals"].values())
    assert len(http.post("/v1/jobs/describe", json={"job_id": job["job_id"]}).content) < 64 * 1024
    next_job_runs(http, version)
    no_traceback(cp)


def test_a_job_that_forges_an_outcome_and_sleeps_past_its_timeout_is_never_left_running(forging):
    """Before: a forged ``failed`` of an unknown phase left the job IN_PROGRESS long past its ``timeout_s``."""
    cp, http, version = forging
    job = forge(http, version, repr('{"event":"failed","phase":"bogus","message":"forged"}\n'), timeout_s=1)
    assert job["job_state"] == "FAILED" and job["failure"]["phase"] == "worker", job  # long before its sleep ends
    no_traceback(cp)


def test_a_job_that_forges_events_and_sleeps_past_its_timeout_is_timed_out(forging):
    cp, http, version = forging
    events = '{"event":"progress","rows_done":5}\n{"event":"log","stream":"stdout","lines":["forged"]}\n'
    job = forge(http, version, repr(events), timeout_s=1)
    assert job["job_state"] == "TIMED_OUT", job  # long before its sleep ends
    assert job["failure"]["phase"] == "timeout", job
    logs = http.post("/v1/jobs/logs", json={"job_id": job["job_id"]}).json()
    assert "forged" in str(logs), logs
    no_traceback(cp)


#: Writes ``size`` bytes as its job's Arrow result file (the path its task names), then sends a ``result`` event for
#: it claiming 1 byte and a summary of unknown and oversized fields, and ends its worker.
FILE_RESULT = """
import gc
import json
import os


def file_result(size: int, pid_file: str) -> str:
    with open(pid_file, "w") as out:
        out.write(str(os.getpid()))
    task = next(o for o in gc.get_objects() if type(o) is dict and "result_file" in o and "task_id" in o)
    os.makedirs(os.path.dirname(task["result_file"]), exist_ok=True)
    with open(task["result_file"], "wb") as out:
        out.write(b"x" * size)
    summary = {"type": "t" * 100_000, "shape": [1] * 1000, "junk": ["j"] * 10_000, "nbytes": 1}
    line = json.dumps({"event": "result", "result_file": task["result_file"], "nbytes": 1, "summary": summary})
    proto = next(o for o in gc.get_objects() if type(o).__name__ == "Protocol" and hasattr(o, "_fd"))
    view = memoryview(line.encode() + b"\\n")
    while view:  # a ~150 KB line: one write may take part of it (as forge's loop above knows)
        view = view[os.write(proto._fd, view) :]
    os._exit(0)
"""


def _wait_exited(pid: int, timeout: float = 60.0) -> None:
    """Until ``pid`` is gone or a zombie (the server's ``usable`` check then sees it exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"the forging worker {pid} did not exit in {timeout} s")


def test_an_arrow_result_is_checked_on_the_server_whatever_the_worker_says(control_plane_factory):
    cp = control_plane_factory(args=["--max-arrow-result-bytes", "4096"])
    body = registration_body(
        "file_result",
        source=FILE_RESULT,
        entrypoint="file_result",
        inputs=(("size", "int64", False), ("pid_file", "string", False)),
        num_gpus=None,
    )
    pid_file = cp.home / "forger.pid"
    with cp.http() as http:
        version = register(http, body)["version"]
        over = wait_done(http, submit(http, "file_result", version, [{"size": 4097, "pid_file": str(pid_file)}]))
        assert over["job_state"] == "FAILED", over
        assert over["failure"]["phase"] == "result", over["failure"]
        assert "4097 bytes" in over["failure"]["message"] and "--max-arrow-result-bytes" in over["failure"]["message"]
        assert not (cp.home / "data" / "results" / f"{over['job_id']}.arrow").exists()
        # The forger exits after its result, as no real worker does: the server may pool it before it has gone, and the
        # next job, handed a worker that exits, would fail ("exited with code 0 while running").
        _wait_exited(int(pid_file.read_text()))
        under = wait_done(http, submit(http, "file_result", version, [{"size": 4096, "pid_file": str(pid_file)}]))
        assert under["job_state"] == "DONE", under.get("failure")
        summary = under["result_summary"]
        assert set(summary) == {"type", "nbytes"} and len(summary["type"]) == 1024, summary  # known fields, capped
        assert len(http.post("/v1/jobs/describe", json={"job_id": under["job_id"]}).content) < 8 * 1024
        reply = http.get("/v1/jobs/result", params={"job_id": under["job_id"]})
        assert reply.status_code == 200 and len(reply.content) == 4096  # its real size, not the 1 byte it claimed
    no_traceback(cp)


def test_a_result_frame_over_the_limit_is_refused_unread_from_a_worker_of_another_user(control_plane_factory):
    """A worker run as another user sends its Arrow result as a frame after its event: the announced size is checked
    before one byte of it is read (before: the server copied whatever size was announced to disk)."""
    if os.geteuid() != 0:
        pytest.skip("workers of another user need a root server")
    let_workers_reach_this_python()
    cp = control_plane_factory(env={"LANCEFN_WORKER_USER": ""}, args=["--max-arrow-result-bytes", "4096"])
    with cp.http() as http:
        version = register(http, text_body("forge", FORGE, num_gpus=None))["version"]
        job = forge(http, version, repr('{"event":"result","nbytes":1,"summary":{},"ipc_len":1000000000}\n'))
        assert job["job_state"] == "FAILED", job
        assert job["failure"]["phase"] == "result" and "--max-arrow-result-bytes" in job["failure"]["message"], job
        next_job_runs(http, version)
    no_traceback(cp)
