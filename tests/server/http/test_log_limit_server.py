"""`--log-max-bytes` on a real server: a later job's output pushes an earlier job's log out, and reading that log
says its lines were removed and why, instead of an empty or silently shortened log."""

from __future__ import annotations

from conftest import register, registration_body
from helpers import submit, wait_done

CHATTY = "def chatty(x: int) -> int:\n    for i in range(20):\n        print('line', i, 'x' * 100)\n    return x\n"


def test_an_older_jobs_log_goes_first_and_its_reader_is_told(control_plane_factory):
    cp = control_plane_factory(args=["--log-max-bytes", "3000"])
    with cp.http() as http:
        version = register(http, registration_body("chatty", source=CHATTY, entrypoint="chatty"))["version"]
        first = submit(http, "chatty", version, [{"x": 1}])
        assert wait_done(http, first)["job_state"] == "DONE"
        before = http.post("/v1/jobs/logs", json={"job_id": first}).json()
        assert len(before["lines"]) == 20 and before["lines"][0].startswith("line 0 ")
        second = submit(http, "chatty", version, [{"x": 2}])  # 20 × ~110 bytes more: over 3,000 together
        assert wait_done(http, second)["job_state"] == "DONE"
        after = http.post("/v1/jobs/logs", json={"job_id": first}).json()
        assert after["lines"] == [
            "[lancefn] lines 0-19 of this log were removed: the server keeps at most --log-max-bytes of job logs, "
            "the oldest jobs' first"
        ]
        assert after["next_offset"] == 20
        latest = http.post("/v1/jobs/logs", json={"job_id": second}).json()
        assert len(latest["lines"]) == 20
