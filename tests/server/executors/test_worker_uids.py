"""A uid per namespace (``--worker-uids``, or by default when the keys name several namespaces; docs/ARCHITECTURE.md
"Isolation"): a root server runs each namespace's workers as a uid of its own, recorded in the home, so one team's job
cannot signal another team's workers, and a fork bomb stops at that uid's ``--worker-max-procs``.  An explicit
``--worker-user`` keeps one shared user, with a warning.  The range parsing, the default range's choice and the
refusals are pure and tested directly."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess

import pytest
from conftest import register, registration_body
from helpers import ONE_GPU, act_body, let_workers_reach_this_python, submit, two_teams

from lancefn_jupyter.server.executors.isolation import WorkerUserError
from lancefn_jupyter.server.executors.uids import (
    DEFAULT_UID_BLOCKS,
    UidRange,
    UidsExhausted,
    WorkerUids,
    default_worker_uids,
    parse_uid_range,
    pick_uid,
    resolve_worker_uids,
)
from lancefn_jupyter.server.storage.store import Store

A_KEY, B_KEY = "uids-team-a-key-0001", "uids-team-b-key-0002"
KEYS = two_teams(A_KEY, B_KEY)
RANGE = "61000-61009"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs a root server (workers as other uids)")

BOMB = """
import os
import time


def bomb(x: int) -> str:
    children = []
    try:
        for _ in range(400):
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
        outcome = "unlimited"
    except BlockingIOError:
        outcome = "limited"
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return f"{outcome} {len(children)}"
"""


def _run(http, name, version, rows):
    job = submit(http, name, version, rows)
    reply = http.post("/v1/jobs/wait", json={"job_id": job, "timeout_s": 60}).json()
    assert reply["job_state"] == "DONE", reply.get("failure") or reply
    return reply["result"]


@pytest.fixture
def uid_server(control_plane_factory):
    let_workers_reach_this_python()
    return control_plane_factory(ONE_GPU, api_keys=KEYS, env={"LANCEFN_WORKER_USER": ""}, args=["--worker-uids", RANGE])


@as_root
def test_each_namespace_runs_as_its_own_uid_which_another_cannot_signal_and_which_survives_a_restart(uid_server):
    cp = uid_server
    with cp.http(A_KEY, timeout=60.0) as a, cp.http(B_KEY, timeout=60.0) as b:
        va, vb = register(a, act_body())["version"], register(b, act_body())["version"]
        (mine,) = _run(a, "act", va, [{"target": ""}])
        (theirs,) = _run(b, "act", vb, [{"target": ""}])
    uid_a, gid_a, pid_a, umask_a = mine.split()
    uid_b, _gid_b, pid_b, _ = theirs.split()
    assert uid_a != uid_b and {int(uid_a), int(uid_b)} <= set(range(61000, 61010))
    assert gid_a == uid_a and umask_a == "0o77"  # no shared group; what a job writes is its uid's alone
    with cp.http(A_KEY, timeout=60.0) as a, cp.http(B_KEY, timeout=60.0) as b:
        assert _run(b, "act", vb, [{"target": f"pause:{pid_a}"}]) == ["denied"]  # b's job cannot stop a's idle worker
        assert _run(a, "act", va, [{"target": f"pause:{pid_b}"}]) == ["denied"]
        (again,) = _run(a, "act", va, [{"target": ""}])
    assert again.split()[2] == pid_a  # a's worker was untouched and is reused
    cp.restart()
    with cp.http(A_KEY, timeout=60.0) as a, cp.http(B_KEY, timeout=60.0) as b:
        # b asks first this time: a recorded uid is kept, not handed out by order of arrival
        assert _run(b, "act", vb, [{"target": ""}])[0].split()[0] == uid_b
        assert _run(a, "act", va, [{"target": ""}])[0].split()[0] == uid_a


WHERE = "import os\n\n\ndef where():\n    st = os.stat(os.path.dirname(__file__))\n    return f'{st.st_uid} {oct(st.st_mode & 0o777)} {os.getuid()}'\n"


@as_root
def test_a_bundles_modules_are_written_by_and_for_its_namespaces_uid_alone(uid_server):
    """LanceDB's ``code=[module]`` ("LanceDB 0.40 dialect"): the worker writes the bundle's modules itself, as the
    namespace's uid, into a directory only that uid can read."""
    entry = "import lfb_where\n\n\ndef f(x: int) -> str:\n    return lfb_where.where()\n"
    body = registration_body("where", source=entry, entrypoint="f", output_type="utf8", bundle={"lfb_where.py": WHERE})
    with uid_server.http(A_KEY, timeout=60.0) as a:
        (seen,) = _run(a, "where", register(a, body)["version"], [{"x": 1}])
    owner, mode, uid = seen.split()
    assert owner == uid and int(uid) in range(61000, 61010) and mode == "0o700"


def _each_namespaces_identity(cp) -> tuple[list[str], list[str], str, str]:
    """a's and b's ``uid gid pid umask`` (one job each), then what a's job did to b's idle worker and b's to a's."""
    with cp.http(A_KEY, timeout=60.0) as a, cp.http(B_KEY, timeout=60.0) as b:
        va, vb = register(a, act_body())["version"], register(b, act_body())["version"]
        (mine,) = _run(a, "act", va, [{"target": ""}])
        (theirs,) = _run(b, "act", vb, [{"target": ""}])
        (a_to_b,) = _run(a, "act", va, [{"target": f"pause:{theirs.split()[2]}"}])
        (b_to_a,) = _run(b, "act", vb, [{"target": f"pause:{mine.split()[2]}"}])
    return mine.split(), theirs.split(), a_to_b, b_to_a


@as_root
def test_without_a_flag_each_namespace_of_a_root_server_runs_as_its_own_uid_from_the_default_range(
    control_plane_factory,
):
    let_workers_reach_this_python()
    cp = control_plane_factory(ONE_GPU, api_keys=KEYS, env={"LANCEFN_WORKER_USER": "", "LANCEFN_WORKER_UIDS": ""})
    mine, theirs, a_to_b, b_to_a = _each_namespaces_identity(cp)
    default = DEFAULT_UID_BLOCKS[0]  # this machine's passwd and groups hold none of it (checked below)
    assert default_worker_uids(system_ids()) == default
    assert mine[0] != theirs[0] and {int(mine[0]), int(theirs[0])} <= set(range(default.first, default.last + 1))
    assert mine[1] == mine[0] and mine[3] == "0o77"
    assert (a_to_b, b_to_a) == ("denied", "denied")  # neither team's job can stop the other's worker


@as_root
def test_an_explicit_worker_user_keeps_one_shared_user_and_warns_at_start(control_plane_factory):
    let_workers_reach_this_python()
    cp = control_plane_factory(ONE_GPU, api_keys=KEYS, env={"LANCEFN_WORKER_USER": "nobody"})
    mine, theirs, a_to_b, _ = _each_namespaces_identity(cp)
    assert mine[0] == theirs[0] == str(pwd.getpwnam("nobody").pw_uid)
    assert a_to_b == "stopped"  # what a uid per namespace prevents: the operator chose it, and was told
    assert "--worker-user nobody: every namespace's workers run as that one user" in cp.log_text()


def system_ids() -> list[tuple[str, int]]:
    return [(e.pw_name, e.pw_uid) for e in pwd.getpwall()] + [(f"group {e.gr_name}", e.gr_gid) for e in grp.getgrall()]


def test_the_default_range_is_the_first_block_no_user_or_group_holds_else_the_start_is_refused():
    first, second = DEFAULT_UID_BLOCKS
    assert default_worker_uids([("root", 0), ("nobody", 65534)]) == first
    assert default_worker_uids([("ann", first.first + 5)]) == second
    assert default_worker_uids([("group gpu", first.last)]) == second  # a worker's gid is its uid
    with pytest.raises(
        WorkerUserError, match=r"hold users or groups \(ann \(60700\), group gpu \(60900\)\); pass --worker-uids"
    ):
        default_worker_uids([("ann", 60700), ("group gpu", 60900)])


def test_the_default_range_applies_to_a_root_server_of_several_namespaces_with_no_worker_user():
    kwargs = {"executor": "local", "euid": 0, "passwd": [("ann", 1000)], "groups": [("group ann", 1000)]}
    assert resolve_worker_uids(None, worker_user=None, shared=True, **kwargs) == DEFAULT_UID_BLOCKS[0]
    assert resolve_worker_uids("", worker_user="", shared=True, **kwargs) == DEFAULT_UID_BLOCKS[0]
    assert resolve_worker_uids(None, worker_user=None, shared=False, **kwargs) is None  # one team: `nobody`
    assert resolve_worker_uids(None, worker_user="nobody", shared=True, **kwargs) is None  # the operator's choice
    assert resolve_worker_uids(None, worker_user=None, shared=True, **{**kwargs, "euid": 1000}) is None
    assert resolve_worker_uids(None, worker_user=None, shared=True, **{**kwargs, "executor": "ray"}) is None
    assert resolve_worker_uids("100-199", worker_user=None, shared=True, **kwargs) == UidRange(100, 199)


@as_root
def test_a_fork_bomb_stops_at_its_uids_process_limit_and_another_namespace_still_runs(control_plane_factory):
    let_workers_reach_this_python()
    cp = control_plane_factory(
        ONE_GPU,
        api_keys=KEYS,
        env={"LANCEFN_WORKER_USER": ""},
        args=["--worker-uids", RANGE, "--worker-max-procs", "64"],
    )
    bomb = registration_body("bomb", source=BOMB, entrypoint="bomb", output_type="utf8")
    with cp.http(A_KEY, timeout=60.0) as a, cp.http(B_KEY, timeout=60.0) as b:
        (outcome,) = _run(a, "bomb", register(a, bomb)["version"], [{"x": 1}])
        verdict, forked = outcome.split()
        assert verdict == "limited" and int(forked) < 64
        (other,) = _run(b, "act", register(b, act_body())["version"], [{"target": ""}])
        assert other.split()[0].isdigit()


@as_root
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--worker-uids", "0-10"], {}, "includes uid 0 (root)"),
        (["--worker-uids", "61000"], {}, "is not a range of uids; write --worker-uids as FIRST-LAST"),
        (["--worker-uids", "65534-65534"], {}, "includes uids /etc/passwd names: nobody (65534)"),
        (["--worker-uids", RANGE], {"LANCEFN_WORKER_USER": "nobody"}, "both say whom workers run as; give one"),
        (["--worker-uids", RANGE, "--executor", "ray"], {}, "applies to the local executor only"),
        (["--worker-uids", RANGE, "--worker-max-procs", "0"], {}, "--worker-max-procs must be a whole number >= 1"),
        (["--worker-max-procs", "10"], {"LANCEFN_WORKER_USER": "0"}, "this server runs them as itself"),
    ],
)
def test_bad_worker_uid_settings_refuse_to_start_saying_what_to_change(control_plane_factory, args, env, message):
    cp = control_plane_factory(ONE_GPU, env={"LANCEFN_WORKER_USER": "", **env}, args=args, start=False)
    done = subprocess.run(cp.command, env=cp.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_the_range_parses_and_says_how_to_write_it():
    assert parse_uid_range(" 61000 - 61999 ") == UidRange(61000, 61999)
    assert UidRange(5, 7).size == 3 and 6 in UidRange(5, 7) and 8 not in UidRange(5, 7)
    for text, why in [("a-b", "not a range"), ("9-3", "9 is above 3"), ("1-4294967295", "uids go up to")]:
        with pytest.raises(WorkerUserError, match=why):
            parse_uid_range(text)


def test_the_lowest_free_uid_is_picked_and_none_when_all_are_held():
    uids = UidRange(10, 12)
    assert pick_uid(uids, []) == 10
    assert pick_uid(uids, [10, 12, 99]) == 11
    assert pick_uid(uids, [10, 11, 12]) is None


def test_refusals_name_what_conflicts():
    kwargs = {"worker_user": None, "executor": "local", "euid": 0}
    assert resolve_worker_uids(None, **kwargs) is None
    assert resolve_worker_uids("100-199", **kwargs, passwd=[("ann", 99), ("ben", 200)]) == UidRange(100, 199)
    with pytest.raises(WorkerUserError, match=r"ann \(150\)"):
        resolve_worker_uids("100-199", **kwargs, passwd=[("ann", 150)])
    with pytest.raises(WorkerUserError, match="needs the server to run as root"):
        resolve_worker_uids("100-199", worker_user=None, executor="local", euid=1000)


def test_uids_are_recorded_kept_across_stores_and_exhausted_with_a_message(tmp_path):
    store = Store(tmp_path / "state.sqlite3")
    uids = WorkerUids(UidRange(500, 501))
    uids.attach(store)
    assert (uids.uid_for("a"), uids.uid_for("b"), uids.uid_for("a")) == (500, 501, 500)
    with pytest.raises(UidsExhausted, match="restart the server with a wider --worker-uids range"):
        uids.uid_for("c")
    store.close()
    again = WorkerUids(UidRange(500, 501))
    again.attach(Store(tmp_path / "state.sqlite3"))
    assert (again.uid_for("b"), again.uid_for("a")) == (501, 500)
    wider = WorkerUids(UidRange(501, 510))  # a narrowed range: a uid outside it is replaced, never shared
    wider.attach(Store(tmp_path / "state.sqlite3"))
    assert wider.uid_for("b") == 501 and wider.uid_for("a") == 502
