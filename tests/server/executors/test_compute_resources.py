"""cpu= and memory= per version on the local executor (docs/ARCHITECTURE.md, "Compute resources"): part of the
version, refused at registration past what a worker of the class can have, a worker held to them, a job past its
memory failing in phase ``resources`` with the next one on a fresh worker. One server for the module."""

from __future__ import annotations

import os
import re

import pytest
from conftest import register, registration_body
from helpers import HOLD_SOURCE, describe, kernel_shell, submit, text_body, wait_done, wait_state, wait_until

from lancefn_jupyter.kernel import session as kernel_session
from lancefn_jupyter.worker import limits

CLASSES = """
[[gpu_classes]]
name = "default"
simulated = 2
cpu_per_gpu = 1
memory_per_gpu = "2Gi"
"""

GROW = """
def grow(mb: int, hold_s: float) -> str:
    import os, time
    block = b"\\x01" * (mb * 2**20)  # written, so resident
    time.sleep(hold_s)
    del block
    return f"{os.getpid()} {len(os.sched_getaffinity(0))}"
"""


@pytest.fixture(scope="module")
def cp(module_control_plane_factory):
    return module_control_plane_factory(CLASSES)


@pytest.fixture(scope="module")
def watched_cp(module_control_plane_factory):
    """A server whose workers' memory is only watched (no v1 memory cgroup; a host whose v2 cgroups offer the memory
    controller still holds them by ``memory.max``)."""
    return module_control_plane_factory(CLASSES, env={"LANCEFN_CGROUP_V1": "0"})


def _body(name: str, **resources: str) -> dict:
    body = registration_body(
        name,
        source=GROW,
        entrypoint="grow",
        inputs=(("mb", "int64", False), ("hold_s", "float64", False)),
        output_type="utf8",
    )
    body["runtime"]["resources"].update(resources)
    return body


def _run(http, version: dict, mb: int, hold_s: float = 0.0) -> dict:
    return wait_done(http, submit(http, version["name"], version["version"], [{"mb": mb, "hold_s": hold_s}]))


def test_cpu_and_memory_are_part_of_the_version_and_shown_with_the_class(cp):
    with cp.http() as http:
        plain = register(http, _body("plain"))
        asked = register(http, _body("plain", cpu="500m", memory="1Gi"))
        classes = http.get("/v1/gpu/classes").json()
    assert "cpu" not in plain["runtime"]["resources"]  # nothing asked: the version reads as before
    assert asked["runtime"]["resources"] == {"num_gpus": 1, "cpu": "500m", "memory": "1Gi"}
    assert asked["version"] != plain["version"]
    (default,) = [c for c in classes["classes"] if c["name"] == "default"] if "classes" in classes else classes
    assert default["cpu_per_gpu"] == 1 and default["memory_bytes_per_gpu"] == 2 * 2**30


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"memory": "5Gi"}, ["memory=5Gi", "4 GiB", "memory_per_gpu", "max_gpu_count_per_worker 2"]),
        ({"cpu": "3"}, ["cpu=3", "2 CPUs", "cpu_per_gpu"]),
        ({"memory": "16GB"}, ["memory='16GB' is not a memory quantity", "16Gi"]),
    ],
)
def test_a_request_no_worker_of_the_class_can_have_is_refused_at_registration(cp, resources, words):
    with cp.http() as http:
        reply = http.post("/v1/functions/create", json=_body("too_big", **resources))
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert all(word in message for word in words), message


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning to 1 CPU needs 2")
def test_a_worker_is_held_to_its_cpu(cp):
    with cp.http() as http:
        version = register(http, _body("one_cpu", cpu="1"))
        job = _run(http, version, 1)
    assert job["job_state"] == "DONE", job
    assert job["result"][0].split()[1] == "1"  # its threads run on one CPU


@pytest.mark.parametrize("server", ["cp", "watched_cp"])
@pytest.mark.parametrize("hold_s", [0.0, 30.0], ids=["between-looks", "watched"])
def test_a_job_past_its_memory_fails_in_phase_resources_and_the_next_runs_on_a_fresh_worker(request, server, hold_s):
    with request.getfixturevalue(server).http() as http:
        version = register(http, _body(f"greedy{int(hold_s)}", memory="400Mi"))
        first = _run(http, version, 1)
        over = _run(http, version, 600, hold_s)
        after = _run(http, version, 1)
    assert first["job_state"] == "DONE", first
    assert over["job_state"] == "FAILED", over
    failure = over["failure"]
    assert failure["phase"] == "resources", failure
    assert re.fullmatch(
        r"used [0-9.]+ [MG]iB of memory=400Mi; raise memory= or process less per call", failure["message"]
    )
    assert after["job_state"] == "DONE", after
    assert after["result"][0].split()[0] != first["result"][0].split()[0]  # a fresh worker


def test_the_magics_take_and_show_cpu_and_memory(cp):
    for shell in kernel_shell(cp):
        shell.run_cell_magic(
            "gpu_function", "cpu=1 memory=1Gi name=magic_sized", "def magic_sized(x: int) -> int:\n    return x\n"
        )
        fn = shell.user_ns["magic_sized"]
        assert fn.version.runtime.resources.cpu == "1"
        assert fn.version.runtime.resources.memory == "1Gi"
        assert "1 GPU of class default, cpu=1, memory=1Gi" in fn.card()[0]
        assert "1 CPU + 2 GiB per GPU" in repr(shell.run_line_magic("gpu_classes", ""))
        shell.run_line_magic("gpu_profile", "small cpu=500m memory=256Mi")
        assert kernel_session.profiles()["small"].memory == "256Mi"


def test_the_fallback_reads_a_workers_memory():
    assert limits.memory_used(os.getpid(), None) > 0
    assert limits.peak_rss(os.getpid()) >= limits.memory_used(os.getpid(), None)


def test_a_job_waits_for_the_cpu_its_version_asks_for_saying_so(cp, tmp_path):
    gate = tmp_path / "go"
    with cp.http() as http:
        body = text_body("hog", HOLD_SOURCE, entrypoint="hold")
        body["runtime"]["resources"]["cpu"] = "2"  # the class's two GPUs' worth of CPU: all of it
        hog = register(http, body)
        holding = submit(http, "hog", hog["version"], [{"path": str(gate)}])
        wait_state(http, holding, "IN_PROGRESS")
        small = register(http, _body("small"))  # asks for nothing: its GPU's share, cpu=1
        waiting = submit(http, "small", small["version"], [{"mb": 1, "hold_s": 0.0}])
        placement = wait_until(
            lambda: describe(http, waiting)["placement"].get("pending_reason") and describe(http, waiting)["placement"],
            "the job to wait for CPU",
        )
        usage = http.get("/v1/gpu/usage").json()
        gate.touch()
        done = wait_done(http, waiting)
    assert placement["waiting_on_capacity"] is True
    assert placement["pending_reason"] == "waiting for CPU: it needs 1 CPU, 0 of the class's 2 are free"
    assert "waiting for CPU" in str(usage)
    assert done["job_state"] == "DONE", done
