"""Runs from many clients at once, queued on the event loop or by a core thread's round and saved several per
commit (docs/ARCHITECTURE.md, "REST details"): every id a client was answered is on disk, so a SIGKILL right
after the last reply loses none of them, and each runs once with its own rows after the restart."""

from __future__ import annotations

import json
import threading

from conftest import register, registration_body
from helpers import DEADLINE_S, describe, hold_version, submit, wait_done, wait_state

CLIENTS = 8
RUNS_EACH = 25


def test_every_answered_run_survives_a_sigkill_right_after_the_replies(control_plane, tmp_path):
    gate = tmp_path / "gate"
    with control_plane.http() as http:
        double = register(http, registration_body())["version"]
        holding = submit(http, "hold", hold_version(http, num_gpus=2), [{"path": str(gate)}])
        wait_state(http, holding, "IN_PROGRESS")  # both GPUs held: every run below stays queued
    answered: dict[str, int] = {}
    errors: list[str] = []

    def client(index: int) -> None:
        with control_plane.http() as own:
            for x in range(index * RUNS_EACH, (index + 1) * RUNS_EACH):
                reply = own.post("/v1/functions/run", json={"name": "double", "version": double, "rows": [{"x": x}]})
                if reply.status_code != 202:
                    errors.append(reply.text)
                    continue
                answered[reply.json()["job_id"]] = x

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert errors == [] and len(answered) == CLIENTS * RUNS_EACH
    control_plane.kill()  # SIGKILL: no shutdown, nothing flushed
    control_plane.start()
    gate.touch()
    with control_plane.http() as http:
        assert wait_done(http, holding)["job_state"] == "DONE"
        for job_id, x in answered.items():
            job = wait_done(http, job_id)
            assert job["job_state"] == "DONE" and job["result"] == [2 * x], job
        assert describe(http, holding)["result"] == [str(gate)]


LENGTH_SOURCE = "from __future__ import annotations\n\n\ndef length(s: str) -> int:\n    return len(s)\n"


def test_a_bad_run_among_good_ones_gets_its_own_error(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body())["version"]
        length = register(
            http, registration_body("length", source=LENGTH_SOURCE, entrypoint="length", inputs=(("s", "utf8", False),))
        )["version"]
        outcomes: dict[str, tuple[int, str]] = {}

        def post(label: str, rows: object, name_version: tuple[str, str] = ("double", version)) -> None:
            with control_plane.http() as own:
                reply = own.post(
                    "/v1/functions/run", json={"name": name_version[0], "version": name_version[1], "rows": rows}
                )
                outcomes[label] = (reply.status_code, reply.text)

        runs = {
            "good": ([{"x": 3}],),
            "bad_rows": ([{"y": 3}],),
            "unknown": ([{"x": 3}], ("double", "0" * 16)),
            "long": ([{"x": i} for i in range(200)],),  # longer than the loop checks: a core thread's round
            "big": ([{"s": "s" * 40_000}], ("length", length)),  # one row, but a body the loop does not parse
        }
        threads = [threading.Thread(target=post, args=(label, *args)) for label, args in runs.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE_S)
        assert outcomes["bad_rows"][0] == 400 and "x" in outcomes["bad_rows"][1]
        assert outcomes["unknown"][0] == 404 and "not found" in outcomes["unknown"][1]
        for label, expected in (("good", [6]), ("long", [2 * i for i in range(200)]), ("big", [40_000])):
            status, text = outcomes[label]
            assert status == 202, text
            job_id = json.loads(text)["job_id"]
            assert wait_done(http, job_id)["result"] == expected
