"""Namespaces and ownership on a real server: two teams, three keys (two share a namespace), the admin.

A non-admin key acts on its own namespace only; anything else answers 404 exactly as an id that
does not exist; the event stream carries only its namespace's job events; capacity (usage, queue
positions) stays global; the admin sees everything and replies name each item's namespace.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from conftest import register, registration_body
from helpers import ONE_GPU, api_keys_toml, submit, wait_done

ALICE, BOB, CAROL = "alice-key-000000001", "bob-key-00000000002", "carol-key-000000003"
ALL = ["functions", "jobs", "system_usage"]
KEYS = api_keys_toml(
    {"name": "alice", "key": ALICE, "namespace": "team-a", "privileges": ALL},
    {"name": "bob", "key": BOB, "namespace": "team-a", "privileges": ALL},
    {"name": "carol", "key": CAROL, "privileges": ALL},  # no namespace: her own name
)
SLOW = "import time\n\n\ndef slow(x: int) -> int:\n    time.sleep(x / 10)\n    return x\n"
MISSING_JOB = "0" * 32
MISSING_VERSION = "0" * 16


def client(cp, key: str) -> httpx.Client:
    return cp.http(key, timeout=60.0)


def wait(http: httpx.Client, job_id: str) -> dict:
    reply = http.post("/v1/jobs/wait", json={"job_id": job_id, "timeout_s": 60})
    assert reply.status_code == 200, reply.text
    assert reply.json()["job_state"] == "DONE", reply.json()
    return reply.json()


@pytest.fixture
def teams(control_plane_factory):
    cp = control_plane_factory(api_keys=KEYS)
    with client(cp, ALICE) as alice:
        version = register(alice, registration_body("embed"))
        job = submit(alice, "embed", version["version"], [{"x": 1}])
        wait(alice, job)
    return cp, version["version"], job


def _reply(http: httpx.Client, path: str, body: dict) -> tuple[int, dict]:
    reply = http.post(path, json=body)
    return reply.status_code, reply.json()


def test_every_route_for_own_same_team_other_team_and_admin(teams):
    cp, vid, job = teams
    fn = {"name": "embed", "version": vid}
    missing_fn = {"name": "embed", "version": MISSING_VERSION}
    routes = [
        ("/v1/functions/describe", fn, missing_fn),
        ("/v1/functions/artifact", fn, missing_fn),
        ("/v1/functions/history", {"name": "embed"}, {"name": "embed"}),
        (
            "/v1/functions/diff",
            {"name": "embed", "old": vid, "new": vid},
            {"name": "embed", "old": MISSING_VERSION, "new": MISSING_VERSION},
        ),
        ("/v1/functions/run", {**fn, "rows": [{"x": 2}]}, {**missing_fn, "rows": [{"x": 2}]}),
        ("/v1/jobs/describe", {"job_id": job}, {"job_id": MISSING_JOB}),
        ("/v1/jobs/logs", {"job_id": job}, {"job_id": MISSING_JOB}),
        ("/v1/jobs/wait", {"job_id": job, "timeout_s": 0}, {"job_id": MISSING_JOB, "timeout_s": 0}),
        ("/v1/jobs/cancel", {"job_id": job}, {"job_id": MISSING_JOB}),
    ]
    keys = {"own": ALICE, "same team": BOB, "other team": CAROL, "admin": cp.api_key}
    for who, key in keys.items():
        with client(cp, key) as http:
            for path, body, missing in routes:
                status, reply = _reply(http, path, body)
                if who == "other team":
                    # Exactly the reply for an id that does not exist (only the id differs).
                    m_status, m_reply = _reply(
                        http, path, missing if path != "/v1/functions/history" else {"name": "no-such-fn"}
                    )
                    if path == "/v1/functions/history":
                        m_reply["error"]["message"] = m_reply["error"]["message"].replace("no-such-fn", "embed")
                    assert status == m_status == 404, (path, reply)
                    same = reply["error"]["message"].replace(vid, MISSING_VERSION).replace(job, MISSING_JOB)
                    assert same == m_reply["error"]["message"] and reply["error"]["code"] == m_reply["error"]["code"]
                else:
                    assert status in (200, 202), (who, path, reply)
            listed = http.post("/v1/functions/list", json={}).json()["functions"]
            jobs = http.post("/v1/jobs/list", json={}).json()["jobs"]
            if who == "other team":
                assert (
                    listed == []
                    and all(j["namespace"] == "carol" for j in jobs)
                    and job not in {j["job_id"] for j in jobs}
                )
            else:
                assert {(f["name"], f["version"], f["namespace"]) for f in listed} == {("embed", vid, "team-a")}
                assert job in {j["job_id"] for j in jobs} and {j["namespace"] for j in jobs} == {"team-a"}
    # Drop: the other team cannot, the same team can.
    with client(cp, CAROL) as carol, client(cp, BOB) as bob:
        assert _reply(carol, "/v1/functions/drop", fn)[0] == 404
        assert bob.post("/v1/functions/describe", json=fn).status_code == 200
        assert _reply(bob, "/v1/functions/drop", fn) == (200, {"dropped": True})
        assert bob.post("/v1/functions/describe", json=fn).status_code == 404


def test_functions_describe_names_the_versions_namespace_for_the_admin_too(teams):
    cp, vid, _ = teams
    fn = {"name": "embed", "version": vid}
    with client(cp, ALICE) as alice, cp.http() as admin:
        assert alice.post("/v1/functions/describe", json=fn).json()["namespace"] == "team-a"
        assert admin.post("/v1/functions/describe", json={**fn, "namespace": "team-a"}).json()["namespace"] == "team-a"
        assert admin.post("/v1/functions/describe", json=fn).json()["namespace"] == "team-a"  # found in any namespace


def test_function_names_are_per_namespace_and_the_admin_picks_one(teams):
    cp, vid, _ = teams
    with client(cp, CAROL) as carol, client(cp, ALICE) as alice, cp.http() as admin:
        mine = register(carol, registration_body("embed"))  # the same name and content, another team
        assert mine["version"] == vid
        assert [(f["name"], f["namespace"]) for f in carol.post("/v1/functions/list", json={}).json()["functions"]] == [
            ("embed", "carol")
        ]
        assert carol.post("/v1/functions/drop", json={"name": "embed", "version": vid}).json() == {"dropped": True}
        assert (
            alice.post("/v1/functions/describe", json={"name": "embed", "version": vid}).status_code == 200
        )  # theirs stays
        # A key may not name another namespace: the same 404 as a missing version.
        assert (
            alice.post(
                "/v1/functions/describe", json={"name": "embed", "version": vid, "namespace": "carol"}
            ).status_code
            == 404
        )
        listed = admin.post("/v1/functions/list", json={}).json()["functions"]
        assert {(f["name"], f["namespace"]) for f in listed} == {("embed", "team-a")}
        job = admin.post(
            "/v1/functions/run", json={"name": "embed", "version": vid, "rows": [{"x": 3}], "namespace": "team-a"}
        ).json()["job_id"]
        assert wait(admin, job)["namespace"] == "team-a"  # the job belongs to the function's team
        assert alice.post("/v1/jobs/describe", json={"job_id": job}).status_code == 200


def _collect(cp, key: str, last_event_id: str | None, until: str, into: list[dict]) -> None:
    headers = {"x-api-key": key, **({"Last-Event-ID": last_event_id} if last_event_id is not None else {})}
    with httpx.stream("GET", cp.url + "/v1/jobs/events", headers=headers, timeout=60) as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                into.append({"kind": kind, **json.loads(line[6:])})
                if kind == "job" and into[-1].get("job_id") == until and into[-1].get("job_state") == "DONE":
                    return


def test_event_stream_of_each_key_carries_exactly_its_namespace(teams):
    cp, vid, first = teams
    with client(cp, CAROL) as carol:
        cvid = register(carol, registration_body("embed"))["version"]
    results: dict[str, list[dict]] = {"alice": [], "carol": [], "admin": []}
    keys = {"alice": ALICE, "carol": CAROL, "admin": cp.api_key}
    with client(cp, CAROL) as carol, client(cp, ALICE) as alice:
        c1 = submit(carol, "embed", cvid, [{"x": 1}])
        wait(carol, c1)
        a1 = submit(alice, "embed", vid, [{"x": 1}])
        wait(alice, a1)
        c2 = submit(carol, "embed", cvid, [{"x": 2}])
        wait(carol, c2)
    # Replay from the beginning (the durable backlog), each key until its namespace's last job.
    finals = {"alice": a1, "carol": c2, "admin": c2}
    threads = [
        threading.Thread(target=_collect, args=(cp, keys[name], "0", finals[name], results[name]), daemon=True)
        for name in results
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    team_a = {first, a1}
    team_b = {c1, c2}
    seen = {name: {e["job_id"] for e in items if e["kind"] == "job"} for name, items in results.items()}
    assert team_a <= seen["alice"] and not (seen["alice"] & team_b)
    assert team_b <= seen["carol"] and not (seen["carol"] & team_a)
    assert (team_a | team_b) <= seen["admin"]
    assert {e["namespace"] for e in results["admin"] if e["kind"] == "job"} == {"team-a", "carol"}
    assert all(e["namespace"] == "carol" for e in results["carol"] if e["kind"] == "job")


def test_live_event_stream_is_filtered_per_namespace(teams):
    cp, vid, _ = teams
    with client(cp, CAROL) as carol:
        cvid = register(carol, registration_body("embed"))["version"]
    alice_items: list[dict] = []
    with client(cp, CAROL) as carol, client(cp, ALICE) as alice:  # noqa: SIM117 (the stream opens after both clients)
        # Alice's stream starts "now"; carol's job runs while it is open, then alice's.
        with httpx.stream("GET", cp.url + "/v1/jobs/events", headers={"x-api-key": ALICE}, timeout=60) as stream:
            lines = stream.iter_lines()
            next(lines)  # the stream is open (its first usage event): everything after is live
            c1 = submit(carol, "embed", cvid, [{"x": 5}])
            wait(carol, c1)
            a1 = submit(alice, "embed", vid, [{"x": 7}])
            kind = None
            for line in lines:
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "job":
                    alice_items.append({"kind": kind, **json.loads(line[6:])})
                    if alice_items[-1]["job_id"] == a1 and alice_items[-1]["job_state"] == "DONE":
                        break
    ids = {e.get("job_id") for e in alice_items if e["kind"] == "job"}
    assert a1 in ids and c1 not in ids


def test_queue_positions_and_usage_count_every_namespace(control_plane_factory):
    cp = control_plane_factory(ONE_GPU, api_keys=KEYS)
    with client(cp, CAROL) as carol, client(cp, ALICE) as alice:
        cv = register(carol, registration_body("slow", source=SLOW, entrypoint="slow"))["version"]
        av = register(alice, registration_body("slow", source=SLOW, entrypoint="slow"))["version"]
        running = submit(carol, "slow", cv, [{"x": 100}])  # holds the one GPU ~10 s
        queued = submit(carol, "slow", cv, [{"x": 1}])
        mine = submit(alice, "slow", av, [{"x": 1}])
        placement = alice.post("/v1/jobs/describe", json={"job_id": mine}).json()["placement"]
        # Fair capacity: carol holds the GPU, so alice's team is next, ahead of carol's earlier queued job.
        assert placement["waiting_on_capacity"] and placement["queue_position"] == 1
        assert carol.post("/v1/jobs/describe", json={"job_id": queued}).json()["placement"]["queue_position"] == 2
        usage = alice.get("/v1/gpu/usage").json()["classes"][0]
        assert (usage["gpus_total"], usage["gpus_busy"], usage["jobs_running"], usage["jobs_pending"]) == (1, 1, 1, 2)
        # The queue event: positions count carol's job, but alice does not see its id.
        items: list[dict] = []
        with httpx.stream("GET", cp.url + "/v1/jobs/events", headers={"x-api-key": ALICE}, timeout=30) as stream:
            kind = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "queue":
                    items.append(json.loads(line[6:]))
                    break
        assert items[0]["classes"]["default"] == [mine, None]
        assert set(items[0]["expected_start_ms"]) == {mine}  # per-job maps keep only alice's jobs
        with cp.http() as admin:
            for job_id in (running, queued, mine):
                admin.post("/v1/jobs/cancel", json={"job_id": job_id})


# ---------------------------------------------------------------------------------- upgrade

FIXTURE_HOME = Path(__file__).parent / "data" / "home-before-namespaces"


def _python_312(body: dict) -> dict:
    """The fixture's version was registered from a Python 3.12 kernel."""
    body["runtime"]["python_version"] = "3.12"
    return body


def test_upgrade_of_a_home_from_the_release_before_namespaces(control_plane_factory, tmp_path):
    """The fixture home was made by the release before namespaces (one function, one finished run);
    a new server keeps everything, in the admin's default namespace, and adds teams beside it."""
    meta = json.loads((FIXTURE_HOME / "expected.json").read_text())
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    shutil.copy(FIXTURE_HOME / "lancefn.sqlite3", home / "lancefn.sqlite3")
    cp = control_plane_factory(home=home, api_keys=KEYS)
    with cp.http() as admin, client(cp, ALICE) as alice:
        listed = admin.post("/v1/functions/list", json={}).json()["functions"]
        assert listed == [{"name": meta["name"], "version": meta["version"], "namespace": "default"}]
        job = admin.post("/v1/jobs/describe", json={"job_id": meta["job_id"]}).json()
        assert job["job_state"] == "DONE" and job["result"] == meta["result"] and job["namespace"] == "default"
        assert admin.post("/v1/jobs/logs", json={"job_id": meta["job_id"]}).json()["lines"] == meta["logs"]
        # It still runs, and other teams do not see it. It asks for Python 3.12 (docs/ARCHITECTURE.md, "Environments"):
        # it runs in an environment of it where the machine has that Python, else fails saying so.
        again = wait_done(admin, submit(admin, meta["name"], meta["version"], meta["rows"]), timeout=300)
        if again["job_state"] == "FAILED":
            assert again["failure"]["phase"] == "environment" and "3.12" in again["failure"]["message"], again
        else:
            assert again["result"] == meta["result"], again
        assert alice.post("/v1/jobs/describe", json={"job_id": meta["job_id"]}).status_code == 404
        assert alice.post("/v1/functions/list", json={}).json()["functions"] == []
        # A team may now register the same name beside it.
        assert (
            register(
                alice, _python_312(registration_body(meta["name"], source=meta["source"], entrypoint=meta["name"]))
            )["version"]
            == meta["version"]
        )
        events = []
        with httpx.stream(
            "GET", cp.url + "/v1/jobs/events", headers={"x-api-key": cp.api_key, "Last-Event-ID": "0"}, timeout=30
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and meta["job_id"] in line:
                    events.append(json.loads(line[6:]))
                    if events[-1]["job_state"] == "DONE":
                        break
        # Old events replay as they were saved (before jobs named their namespace), to the admin.
        assert events[-1]["job_state"] == "DONE" and "namespace" not in events[-1]


def test_jobs_dashboard_shows_a_namespace_column_only_when_several_are_visible(teams):
    from lancefn_jupyter.kernel.widgets import JobsDashboard
    from lancefn_jupyter.wire.models import Job

    cp, _vid, first = teams
    with client(cp, CAROL) as carol:
        cvid = register(carol, registration_body("embed"))["version"]
        wait(carol, theirs := submit(carol, "embed", cvid, [{"x": 4}]))

    def jobs(key: str) -> list:
        with client(cp, key) as http:
            return [
                Job.from_wire(j) for j in http.post("/v1/jobs/list", json={"job_type": "run_function"}).json()["jobs"]
            ]

    admin_view = JobsDashboard(jobs=jobs(cp.api_key), client=object(), start=False)
    assert "<b>namespace</b>" in [getattr(c, "value", "") for c in admin_view.grid.children][:3]
    assert len(admin_view.grid.children) == 8 * 3  # header + 2 rows of 8 cells
    assert (
        "carol" in admin_view.rows[theirs].namespace_cell.value
        and "team-a" in admin_view.rows[first].namespace_cell.value
    )
    own_view = JobsDashboard(jobs=jobs(ALICE), client=object(), start=False)
    assert len(own_view.grid.children) == 7 * 2 and "<b>namespace</b>" not in [
        getattr(c, "value", "") for c in own_view.grid.children
    ]
    for view in (admin_view, own_view):
        view.close()
