"""Every connection counted (docs/ARCHITECTURE.md, "REST details", the limits), on a real server with two teams:
one client, or one key, holding hundreds of idle keep-alive connections, slow bodies, event streams or long polls meets
its own caps (its oldest idle connections closed, 429s naming the flag) while the other team's requests and /v1/health are
answered; local clients of other users are other peers; and a burst of large artifacts from one key neither holds
the threads the other key's requests need nor makes its registration wait behind the whole burst."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import psutil
import pytest
from conftest import registration_body
from helpers import (
    api_keys_toml,
    hold_version,
    http_head,
    let_workers_reach_this_python,
    raw_socket,
    read_reply,
    read_response,
    submit,
    wait_until,
)

ALICE, ALICE_TOO, BOB = "alice-key-000000001", "alice-key-000000002", "bob-key-00000000003"
ALL = ["functions", "jobs", "system_usage"]
KEYS = api_keys_toml(
    {"name": "alice", "key": ALICE, "namespace": "team-a", "privileges": ALL},
    {"name": "alice-too", "key": ALICE_TOO, "namespace": "team-a", "privileges": ALL},
    {"name": "bob", "key": BOB, "namespace": "team-b", "privileges": ALL},
)
FLOOD = 300
LIMIT = ["--limit-concurrency", "32"]  # a flood of 300 fills it ten times over


def bob_is_served(cp) -> None:
    """Team B's requests all succeed, and so does /v1/health."""
    with cp.http(BOB) as http:
        codes = [http.post("/v1/jobs/list", json={}).status_code for _ in range(4)]
        codes += [http.get("/v1/gpu/usage").status_code for _ in range(4)]
        codes.append(http.get("/v1/health").status_code)
    assert codes == [200] * 9, codes


def refusal(reply: tuple[int, bytes]) -> str:
    status, body = reply
    assert status == 429, (status, body)
    error = json.loads(body)["error"]
    assert error["code"] == "too_many_requests", error
    return error["message"]


@pytest.fixture
def sockets() -> Iterator[list]:
    held: list = []
    yield held
    for sock in held:
        sock.close()


def test_idle_keep_alive_connections_take_no_slot_and_the_peers_oldest_go(control_plane_factory, sockets):
    cp = control_plane_factory(api_keys=KEYS, args=[*LIMIT, "--max-idle-per-peer", "8"])
    for _ in range(FLOOD):  # no key: keep-alive health checks, each left open once answered
        sockets.append(raw_socket(cp.url, http_head("GET", "/v1/health")))
        assert read_response(sockets[-1])[0] == 200  # old code: 503 from the 32nd on
    bob_is_served(cp)  # old code: 503, every slot held by an idle connection
    # The peer's oldest idle connections were closed by the server; its newest are still kept alive.
    assert read_reply(sockets[0]) == b"" and read_reply(sockets[FLOOD - 10]) == b""
    sockets[-1].sendall(http_head("GET", "/v1/health"))
    assert read_response(sockets[-1])[0] == 200


def test_slow_bodies_are_capped_per_key(control_plane_factory, sockets):
    cp = control_plane_factory(api_keys=KEYS, args=[*LIMIT, "--max-bodies-per-key", "4", "--body-timeout-s", "60"])
    refused = []
    for index in range(FLOOD):  # "{" of a 2-byte body, the "}" never sent (yet)
        sockets.append(raw_socket(cp.url, http_head("POST", "/v1/jobs/list", ALICE, body_bytes=2) + b"{"))
        if index >= 4:
            refused.append(refusal(read_response(sockets[-1])))  # old code: held, like the first four
    assert all("--max-bodies-per-key" in message and "this API key" in message for message in refused), refused[0]
    bob_is_served(cp)  # old code: 503
    for sock in sockets[:4]:  # the four held bodies complete and are answered
        sock.sendall(b"}")
        assert read_response(sock)[0] == 200


def test_bodies_are_capped_per_peer_and_another_local_user_is_another_peer(control_plane_factory, sockets):
    cp = control_plane_factory(
        api_keys=KEYS,
        args=[*LIMIT, "--max-bodies-per-key", "4", "--max-bodies-per-peer", "6", "--body-timeout-s", "60"],
    )
    slow = http_head("POST", "/v1/jobs/list", ALICE, body_bytes=2) + b"{"
    sockets += [raw_socket(cp.url, slow) for _ in range(4)]
    sockets += [raw_socket(cp.url, slow.replace(ALICE.encode(), ALICE_TOO.encode())) for _ in range(2)]
    seventh = raw_socket(cp.url, slow.replace(ALICE.encode(), BOB.encode()))
    message = refusal(read_response(seventh))
    assert "--max-bodies-per-peer" in message and "127.0.0.1" in message, message
    if os.geteuid() == 0:  # the same key from another user on this machine is another peer
        answer = as_other_user(SLOW_BODY, str(port_of(cp)), BOB)
        assert answer.startswith("HTTP/1.1 200"), answer


def test_event_streams_are_capped_per_key(control_plane_factory, sockets):
    cp = control_plane_factory(api_keys=KEYS, args=[*LIMIT, "--max-streams-per-key", "4"])
    refused = []
    for index in range(FLOOD):
        sockets.append(raw_socket(cp.url, http_head("GET", "/v1/jobs/events", ALICE)))
        status_or_refusal = read_response(sockets[-1])
        if index < 4:
            assert status_or_refusal[0] == 200
        else:
            refused.append(refusal(status_or_refusal))  # old code: 200 up to the limit, then 503
    assert all("--max-streams-per-key" in message for message in refused), refused[0]
    bob_is_served(cp)  # old code: 503, /v1/health too
    with raw_socket(cp.url, http_head("GET", "/v1/jobs/events", BOB)) as stream:
        assert read_response(stream)[0] == 200


def test_long_polls_are_capped_per_key(control_plane_factory, sockets, tmp_path):
    cp = control_plane_factory(api_keys=KEYS, args=[*LIMIT, "--max-requests-per-key", "4"])
    with cp.http(ALICE) as alice:
        job = submit(alice, "hold", hold_version(alice), [{"path": str(tmp_path / "go")}])  # runs until "go" exists
    body = json.dumps({"job_id": job, "timeout_s": 60}).encode()
    wait = http_head("POST", "/v1/jobs/wait", ALICE, body_bytes=len(body)) + body
    refused = []
    for index in range(FLOOD):
        sockets.append(raw_socket(cp.url, wait))
        if index >= 4:
            refused.append(refusal(read_response(sockets[-1])))  # old code: held until the limit, then 503
    assert all("--max-requests-per-key" in message for message in refused), refused[0]
    bob_is_served(cp)  # old code: 503
    (tmp_path / "go").touch()
    for sock in sockets[:4]:  # the four long polls answer with the job's end
        status, reply = read_response(sock)
        assert status == 200 and json.loads(reply)["job_state"] == "DONE", reply


# The pending share per peer, seen from a local client of another user (uid 65534): it pushes out only its own.
HALF_OPEN = """
import socket, sys
port, count, share = map(int, sys.argv[1:4])
held = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(count)]
for sock in held:
    sock.sendall(b"GET /v1/health HTTP/1.1\\r\\nHost: x\\r\\n")


def closed(sock):  # by the server: an end of file, or a reset when it closed with our half head unread
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


print(sum(closed(sock) for sock in held[: count - share]), flush=True)
"""
SLOW_BODY = """
import socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
head = f"POST /v1/jobs/list HTTP/1.1\\r\\nHost: x\\r\\nx-api-key: {sys.argv[2]}\\r\\ncontent-length: 2\\r\\n\\r\\n{{"
sock.sendall(head.encode())
sock.sendall(b"}")
print(sock.recv(65536).decode("latin-1"), flush=True)
"""


def port_of(cp) -> int:
    return int(cp.url.rsplit(":", 1)[1])


def as_other_user(script: str, *args: str) -> str:
    """What ``script`` prints, run as uid 65534 (a local client that is not the server's user)."""
    let_workers_reach_this_python()
    done = subprocess.run(
        [os.path.realpath(sys.executable), "-c", script, *args],
        user=65534,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_another_local_users_half_sent_requests_push_out_only_its_own(control_plane_factory):
    cp = control_plane_factory(args=["--limit-concurrency", "64", "--header-timeout-s", "60"])  # share: 8
    with raw_socket(cp.url, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n") as mine:  # the address's oldest
        pushed_out = as_other_user(HALF_OPEN, str(port_of(cp)), "40", "8")
        assert pushed_out == "32"  # its own oldest, past its share
        mine.sendall(b"\r\n")
        assert read_response(mine)[0] == 200  # old code: closed, the same address's oldest


# ~1 MiB of list literal: seconds of parsing in a checker child.
HEAVY = "def double(x: int) -> int:\n    return 2 * x\n\nX = [" + "0," * (500 << 10) + "0]\n"
BURST = 48  # more than the 40 core threads


def checker_children(cp) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(cp.proc.pid).children(recursive=True):
        try:
            if "artifact_check" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def test_a_burst_of_large_artifacts_holds_no_thread_and_other_keys_take_turns(control_plane_factory, sockets):
    cp = control_plane_factory(api_keys=KEYS, args=["--max-bodies-per-key", "64"])
    body = json.dumps(registration_body(source=HEAVY)).encode()
    request = http_head("POST", "/v1/functions/create", ALICE, body_bytes=len(body)) + body
    answered: list[int] = []  # A's registrations answered so far, in order

    def register_as_alice(sock) -> None:
        try:
            answered.append(read_response(sock)[0])
        except OSError:  # the server stopped at the test's end
            pass

    for _ in range(BURST):
        sockets.append(raw_socket(cp.url, request))
    readers = [threading.Thread(target=register_as_alice, args=(sock,), daemon=True) for sock in sockets]
    for reader in readers:
        reader.start()
    wait_until(lambda: checker_children(cp), "A's first artifact checks to start")
    with cp.http(BOB) as bob:
        assert bob.post("/v1/jobs/list", json={}).status_code == 200
        # B answered while A's checks were queued (old code: B waited for a core thread, behind the whole burst).
        assert len(answered) <= 2, answered
        bob_version = bob.post("/v1/functions/create", json=registration_body("bobs", source=HEAVY))
    assert bob_version.status_code == 202, bob_version.text
    # B's large artifact took its turn beside A's: most of A's burst was still waiting (old code: B waited behind it).
    assert len(answered) <= 8, answered
    assert set(answered) <= {202}, answered
