"""Job bookkeeping of the control plane over real HTTP with the real local executor:
re-queue on restart (and its limit), FIFO order across restarts, the SSE event stream
(resume, usage events), long-poll wait, list filters/paging, CPU jobs, logs offsets.

Functions that must keep running wait for a file the test creates, so nothing depends on
timing; waits poll with a generous deadline and never assert on elapsed time.
"""

from __future__ import annotations

import json
import threading

import httpx
from conftest import register, registration_body
from helpers import DEADLINE_S, describe, hold_version, submit, wait_done, wait_state

from lancefn_jupyter.wire.models import Job


def read_events(
    cp, *, last_event_id: str | None = None, via_query: bool = False, until
) -> list[tuple[str, str | None, dict]]:
    """Read SSE ``(event, id, data)`` until ``until(events)`` is true (bounded by DEADLINE_S)."""
    headers = dict(cp.client_headers)
    params = {}
    if last_event_id is not None:
        if via_query:
            params["last_event_id"] = last_event_id
        else:
            headers["Last-Event-ID"] = last_event_id
    events: list[tuple[str, str | None, dict]] = []
    with httpx.stream("GET", cp.url + "/v1/jobs/events", headers=headers, params=params, timeout=DEADLINE_S) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        kind, event_id, data = None, None, None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
            elif line == "" and kind is not None:
                events.append((kind, event_id, data))
                kind, event_id, data = None, None, None
                if until(events):
                    return events
    raise AssertionError("event stream ended early")


# --------------------------------------------------------------------- restarts


def test_restart_requeues_running_jobs_and_keeps_fifo_order(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        wide = hold_version(http, "wide", num_gpus=2)
        narrow = hold_version(http, "narrow", num_gpus=1)
        big = submit(http, "wide", wide, [{"path": str(tmp_path / "big")}])
        wait_state(http, big, "IN_PROGRESS")
        small = [submit(http, "narrow", narrow, [{"path": str(tmp_path / f"s{i}")}]) for i in range(3)]
        positions = [describe(http, job)["placement"]["queue_position"] for job in small]
        assert positions == [1, 2, 3]
    cp.kill()
    cp.start()
    with cp.http() as http:
        # The running job was re-queued first, so it starts again; the others keep their order.
        job = wait_state(http, big, "IN_PROGRESS")
        assert job["placement"]["devices"] == ["sim0", "sim1"]
        for i, job_id in enumerate(small, start=1):
            placement = describe(http, job_id)["placement"]
            assert placement["waiting_on_capacity"] is True and placement["queue_position"] == i
        log = http.post("/v1/jobs/logs", json={"job_id": big}).json()["lines"]
        assert any("re-queued (restart 1)" in line for line in log)
        (tmp_path / "big").touch()
        assert wait_done(http, big)["result"] == [str(tmp_path / "big")]
        for i in range(3):
            (tmp_path / f"s{i}").touch()
        assert [wait_done(http, job)["job_state"] for job in small] == ["DONE"] * 3


def test_a_job_requeued_more_than_three_times_fails_retryably(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        job_id = submit(http, "hold", hold_version(http), [{"path": str(tmp_path / "never")}])
    for _restart in range(1, 5):
        with cp.http() as http:
            wait_state(http, job_id, "IN_PROGRESS")
        cp.kill()
        cp.start()
    with cp.http() as http:
        job = describe(http, job_id)
        assert job["job_state"] == "FAILED"
        assert job["failure"]["phase"] == "server_restart" and job["failure"]["retryable"] is True
        assert "restarted 4 times" in job["failure"]["message"]
        usage = http.get("/v1/gpu/usage").json()["classes"][0]
        assert usage["gpus_busy"] == 0 and usage["jobs_pending"] == 0


def test_pending_jobs_of_a_removed_class_fail_on_restart(control_plane_factory, tmp_path):
    two = "[[gpu_classes]]\nname = 'default'\nsimulated = 1\n[[gpu_classes]]\nname = 'extra'\nsimulated = 1\n"
    cp = control_plane_factory(two)
    with cp.http() as http:
        version = hold_version(http, gpu_class="extra")
        first = submit(http, "hold", version, [{"path": str(tmp_path / "a")}])
        second = submit(http, "hold", version, [{"path": str(tmp_path / "b")}])
        wait_state(http, first, "IN_PROGRESS")
    config = cp.args[cp.args.index("--gpu-classes") + 1]
    with open(config, "w") as f:
        f.write("[[gpu_classes]]\nname = 'default'\nsimulated = 1\n")
    cp.kill()
    cp.start()
    with cp.http() as http:
        for job_id in (first, second):
            job = describe(http, job_id)
            assert job["job_state"] == "FAILED"
            assert job["failure"]["phase"] == "validation" and "'extra'" in job["failure"]["message"]
        assert (
            http.post(
                "/v1/functions/run", json={"name": "hold", "version": version, "rows": [{"path": "x"}]}
            ).status_code
            == 400
        )


# ------------------------------------------------------------------------ events


def test_event_stream_shows_the_lifecycle_and_resumes_from_last_event_id(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        version = hold_version(http)
        gate = tmp_path / "go"
        job_id = submit(http, "hold", version, [{"path": str(gate)}])
        wait_state(http, job_id, "IN_PROGRESS")
        gate.touch()
        wait_done(http, job_id)

    def finished(events):
        return any(
            kind == "job" and data["job_id"] == job_id and data["job_state"] == "DONE" for kind, _, data in events
        )

    events = read_events(cp, last_event_id="0", until=finished)
    assert events[0][0] == "usage"  # a snapshot first, so dashboards are right at once
    job_events = [(int(event_id), data) for kind, event_id, data in events if kind == "job"]
    ids = [event_id for event_id, _ in job_events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for _, data in job_events:
        Job.from_wire(data)
    states = [data["job_state"] for _, data in job_events if data["job_id"] == job_id]
    assert states[0] == "PENDING" and states[-1] == "DONE" and "IN_PROGRESS" in states
    assert job_events[0][1]["job_type"] == "create_function"  # the registration's job came first

    # Resuming after the first job event replays exactly the later ones (header or query).
    first_id = ids[0]
    for via_query in (False, True):
        resumed = read_events(cp, last_event_id=str(first_id), via_query=via_query, until=finished)
        assert [int(event_id) for kind, event_id, _ in resumed if kind == "job"] == ids[1:]


def test_live_events_and_usage_events_arrive_while_streaming(control_plane, tmp_path):
    cp = control_plane
    with cp.http() as http:
        version = hold_version(http)
    seen: list = []
    ready = threading.Event()

    def listen():
        def until(events):
            seen[:] = events
            ready.set()
            done = [i for i, (kind, _, data) in enumerate(events) if kind == "job" and data["job_state"] == "DONE"]
            # Stop at the usage event that follows the job's end (its GPU freed).
            return bool(done) and any(kind == "usage" for kind, _, _ in events[done[0] :])

        read_events(cp, until=until)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert ready.wait(DEADLINE_S)  # the initial usage snapshot arrived: we are subscribed
    with cp.http() as http:
        gate = tmp_path / "go"
        job_id = submit(http, "hold", version, [{"path": str(gate)}])
        wait_state(http, job_id, "IN_PROGRESS")
        gate.touch()
        wait_done(http, job_id)
    listener.join(DEADLINE_S)
    assert not listener.is_alive()
    kinds = [kind for kind, _, _ in seen]
    # Without Last-Event-ID only changes after subscribing are sent: no registration event.
    assert all(data["job_id"] == job_id for kind, _, data in seen if kind == "job")
    busy = [data["classes"][0]["gpus_busy"] for kind, _, data in seen if kind == "usage"]
    assert 1 in busy and busy[-1] == 0 and kinds.count("usage") >= 3


def test_sigterm_ends_open_streams_and_exits_cleanly(control_plane):
    cp = control_plane
    opened = threading.Event()
    outcome: list = []

    def listen():
        try:
            read_events(cp, until=lambda events: opened.set() or False)
        except (AssertionError, httpx.HTTPError) as error:
            outcome.append(type(error).__name__)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert opened.wait(DEADLINE_S)
    assert cp.stop() == 0  # not SIGKILLed after the stop timeout
    listener.join(DEADLINE_S)
    assert outcome  # the stream ended


# ------------------------------------------------------------------ wait, list, logs


def test_wait_returns_at_completion_or_the_current_state_at_timeout(control_plane, tmp_path):
    with control_plane.http() as http:
        version = hold_version(http)
        gate = tmp_path / "go"
        job_id = submit(http, "hold", version, [{"path": str(gate)}])
        early = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 0.2}).json()
        assert early["job_state"] in ("PENDING", "IN_PROGRESS")
        result: list = []
        waiter = threading.Thread(target=lambda: result.append(wait_done(http, job_id)), daemon=True)
        waiter.start()
        wait_state(http, job_id, "IN_PROGRESS")
        gate.touch()
        waiter.join(DEADLINE_S)
        assert result and result[0]["job_state"] == "DONE" and result[0]["result"] == [str(gate)]
        assert result[0]["started_ms"] <= result[0]["finished_ms"]
        assert result[0]["progress"] == {"rows_done": 1, "rows_total": 1}


def test_cpu_jobs_run_without_gpus_even_when_all_gpus_are_busy(control_plane, tmp_path):
    with control_plane.http() as http:
        gpu = hold_version(http, "gpu_hold", num_gpus=2)
        blocker = submit(http, "gpu_hold", gpu, [{"path": str(tmp_path / "release")}])
        wait_state(http, blocker, "IN_PROGRESS")
        cpu = register(http, registration_body("cpu_double", num_gpus=None))["version"]
        job = wait_done(http, submit(http, "cpu_double", cpu, [{"x": 1}, {"x": 2}, {"x": 3}]))
        assert job["job_state"] == "DONE" and job["result"] == [2, 4, 6]
        assert job["placement"] == {
            "gpu_class": None,
            "num_gpus": 0,
            "devices": [],
            "waiting_on_capacity": False,
            "queue_position": None,
            "expected_start_ms": None,
            "expected_start_uncertain": False,
        }
        assert job["progress"] == {"rows_done": 3, "rows_total": 3}
        assert job["spec"] == {"name": "cpu_double", "version": cpu, "rows_total": 3}
        (tmp_path / "release").touch()
        assert wait_done(http, blocker)["job_state"] == "DONE"


def test_jobs_list_filters_and_pages_newest_first(control_plane):
    with control_plane.http() as http:
        version = register(http, registration_body("double", num_gpus=None))["version"]
        runs = [submit(http, "double", version, [{"x": i}]) for i in range(5)]
        for job_id in runs:
            wait_done(http, job_id)
        listed = http.post("/v1/jobs/list", json={"job_type": "run_function", "limit": 2}).json()
        collected, pages = [j["job_id"] for j in listed["jobs"]], 1
        while "page_token" in listed:
            listed = http.post(
                "/v1/jobs/list", json={"job_type": "run_function", "limit": 2, "page_token": listed["page_token"]}
            ).json()
            collected += [j["job_id"] for j in listed["jobs"]]
            pages += 1
        assert collected == runs[::-1] and pages == 3
        assert len(http.post("/v1/jobs/list", json={"job_type": "create_function"}).json()["jobs"]) == 1
        assert len(http.post("/v1/jobs/list", json={"state": "DONE", "name": "double"}).json()["jobs"]) == 6
        assert http.post("/v1/jobs/list", json={"state": "PENDING"}).json()["jobs"] == []
        assert http.post("/v1/jobs/list", json={"name": "other"}).json()["jobs"] == []
        # Cancelling a finished job changes nothing.
        assert http.post("/v1/jobs/cancel", json={"job_id": runs[0]}).json() == {"job_id": runs[0], "cancelled": False}


def test_logs_are_read_by_offset(control_plane):
    source = "def chatty(n: int) -> int:\n    for i in range(n):\n        print('line', i)\n    return n\n"
    with control_plane.http() as http:
        body = registration_body(
            "chatty", source=source, entrypoint="chatty", inputs=(("n", "int64", False),), num_gpus=None
        )
        version = register(http, body)["version"]
        job_id = submit(http, "chatty", version, [{"n": 5}])
        assert wait_done(http, job_id)["result"] == [5]
        everything = http.post("/v1/jobs/logs", json={"job_id": job_id}).json()
        printed = [line for line in everything["lines"] if line.startswith("line ")]
        assert printed == [f"line {i}" for i in range(5)]
        assert everything["next_offset"] == len(everything["lines"])
        first = http.post("/v1/jobs/logs", json={"job_id": job_id, "limit": 2}).json()
        rest = http.post("/v1/jobs/logs", json={"job_id": job_id, "offset": first["next_offset"]}).json()
        assert first["next_offset"] == 2 and first["lines"] + rest["lines"] == everything["lines"]
        beyond = http.post("/v1/jobs/logs", json={"job_id": job_id, "offset": 1000}).json()
        assert beyond == {"lines": [], "streams": [], "rows": [], "next_offset": 1000}


def test_unencodable_worker_output_fails_the_job_readably_and_keeps_the_server_healthy(control_plane):
    source = "def bad(x: int) -> str:\n    print('before', flush=True)\n    return chr(0xD800) * x\n"
    with control_plane.http() as http:
        body = registration_body(
            "bad", source=source, entrypoint="bad", inputs=(("x", "int64", False),), output_type="utf8", num_gpus=None
        )
        version = register(http, body)["version"]
        job = wait_done(http, submit(http, "bad", version, [{"x": 1}]))
        # A lone surrogate can't be stored or sent as UTF-8: caught by the worker or the server.
        assert job["job_state"] == "FAILED" and job["failure"]["phase"] in ("result", "run"), job
        assert "Traceback" not in job["failure"]["message"]
        lines = http.post("/v1/jobs/logs", json={"job_id": job["job_id"]}).json()["lines"]
        assert "before" in lines
        assert http.post("/v1/jobs/list", json={}).status_code == 200
        assert wait_done(http, submit(http, "bad", version, [{"x": 0}]))["result"] == [""]


def test_progress_held_back_by_coalescing_is_still_published(control_plane, tmp_path):
    """Rows 1-2 of 3 finish at once (row 2 inside the coalescing interval), row 3 blocks: the event
    stream must still carry rows_done=2 while row 3 runs."""
    from lancefn_jupyter.kernel.client import Client

    client = Client(control_plane.url, control_plane.api_key)
    with control_plane.http() as http:
        version = hold_version(http)
        gate = tmp_path / "gate"
        ready = tmp_path / "ready"
        ready.touch()
        events = client.events(read_timeout=DEADLINE_S)
        next(events)  # the opening usage event: the stream is live
        job_id = submit(http, "hold", version, [{"path": str(ready)}, {"path": str(ready)}, {"path": str(gate)}])
        seen = []
        for event in events:
            if event.event == "job" and event.data["job_id"] == job_id:
                seen.append((event.data["job_state"], event.data["progress"]["rows_done"]))
                if seen[-1] == ("IN_PROGRESS", 2) or (seen[-1][0] != "IN_PROGRESS" and seen[-1][0] != "PENDING"):
                    break
        gate.touch()
        assert ("IN_PROGRESS", 2) in seen
        assert wait_done(http, job_id)["result"] == [str(ready), str(ready), str(gate)]
    client.close()


def test_queue_events_renumber_pending_jobs_when_the_queue_moves(control_plane, tmp_path):
    """Jobs behind a cancelled one move up without job events of their own; `queue` events say so."""
    from lancefn_jupyter.kernel.client import Client

    client = Client(control_plane.url, control_plane.api_key)
    with control_plane.http() as http:
        version = hold_version(http, num_gpus=2)  # the class has exactly 2 GPUs: one job at a time
        gate = str(tmp_path / "gate")
        events = client.events(read_timeout=DEADLINE_S)
        first = next(events)
        assert first.event == "usage" and first.id is not None  # the opening event carries the resume id
        assert next(events).event == "queue"
        running = submit(http, "hold", version, [{"path": gate}])
        wait_state(http, running, "IN_PROGRESS")
        second = submit(http, "hold", version, [{"path": gate}])
        third = submit(http, "hold", version, [{"path": gate}])
        heads = []
        for event in events:
            if event.event == "queue":
                heads.append(event.data["classes"]["default"])
                if heads[-1] == [second, third]:
                    break
        http.post("/v1/jobs/cancel", json={"job_id": second}).raise_for_status()
        for event in events:
            if event.event == "queue":
                heads.append(event.data["classes"]["default"])
                if heads[-1] == [third]:
                    break
        assert heads[-1] == [third] and describe(http, third)["placement"]["queue_position"] == 1
        (tmp_path / "gate").touch()
        assert wait_done(http, third)["job_state"] == "DONE"
    client.close()


def test_a_job_that_can_start_at_once_is_never_shown_waiting_for_capacity(control_plane, tmp_path):
    from lancefn_jupyter.kernel.client import Client

    client = Client(control_plane.url, control_plane.api_key)
    with control_plane.http() as http:
        version = hold_version(http)
        ready = tmp_path / "ready"
        ready.touch()
        events = client.events(read_timeout=DEADLINE_S)
        next(events)  # opening usage event
        job_id = submit(http, "hold", version, [{"path": str(ready)}])
        first = next(e for e in events if e.event == "job" and e.data["job_id"] == job_id)
        assert first.data["placement"]["waiting_on_capacity"] is False
        assert first.data["placement"]["devices"] and first.data["placement"]["queue_position"] is None
        assert wait_done(http, job_id)["job_state"] == "DONE"
    client.close()


def test_a_100_mb_failure_message_is_stored_cut_to_64_kib_and_says_so(control_plane):
    # Issue 27, finding 6: a failure's message and traceback are capped where they are stored.
    source = "def huge(x: int) -> int:\n    raise ValueError('start' + 'y' * (x * 1000 * 1000))\n"
    with control_plane.http() as http:
        body = registration_body("huge", source=source, entrypoint="huge", num_gpus=None)
        version = register(http, body)["version"]
        job_id = submit(http, "huge", version, [{"x": 100}])
        job = wait_done(http, job_id, timeout=DEADLINE_S * 2)
        assert job["job_state"] == "FAILED", job
        reply = http.post("/v1/jobs/describe", json={"job_id": job_id})
        assert len(reply.content) < 4 * 64 * 1024
        failure = reply.json()["failure"]
        message, traceback = failure["message"], failure.get("traceback") or ""
        assert "start" + "y" * 100 in message and message.endswith(" MB]") and "… [cut " in message
        assert len(message) < 64 * 1024 + 100 and len(traceback) < 64 * 1024 + 100
        assert http.get("/v1/health").status_code == 200
