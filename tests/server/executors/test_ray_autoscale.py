"""Scaling with the queue on a cluster with an autoscaler (Ray's fake multi-node provider: each node it adds is a
raylet on this machine): a class at zero nodes grows with its queue up to its maximum, says so in pending reasons and
the usage reply, and goes back to zero once the queue drains; a cancelled batch withdraws its demand at once; a job
larger than the class's nodes is refused at once.

One cluster (max 2 one-GPU nodes) and one control plane for the module; every wait is bounded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ControlPlaneProcess, register
from helpers import autoscaler_request, describe, fake_autoscaling_cluster, ray_server, submit, text_body, wait_until

pytest.importorskip("ray")

# The Ray tests' marker (run one at a time, before the others: scripts/test.sh). Ray's fake provider starts each node's
# raylet on this machine; its config must disable Ray's node updaters (helpers.fake_autoscaling_cluster), which would
# otherwise terminate every node they cannot ssh into as "launch failed", killing its jobs.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

SLOW = 300.0  # nodes start in ~10 s each on a quiet machine, minutes on a loaded one (Ray retries a failed start)
CLASSES = """
[[gpu_classes]]
name = "t4"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 1
max_nodes = 2
"""
NAP = """
import time

import ray


def nap(seconds: str) -> str:
    time.sleep(float(seconds))
    return ray.get_runtime_context().get_node_id()
"""
T4 = "lancefn_gpu_class:t4"


@pytest.fixture(scope="module")
def cp(tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    # ACTOR_IDLE_S: an idle warm actor holds its node's GPU, so the node idles only once its actors retired
    env = {"LANCEFN_RAY_ACTOR_IDLE_S": "2", "LANCEFN_RAY_LOST_AFTER_S": "60"}
    with (
        fake_autoscaling_cluster("t4", max_nodes=2, idle_timeout_s=8.0) as address,
        ray_server(tmp_path_factory, CLASSES, "--ray-address", address, **env) as server,
    ):
        server.ray_address = address
        yield server


def _usage(http) -> dict:
    reply = http.get("/v1/gpu/usage")
    assert reply.status_code == 200, reply.text
    return next(row for row in reply.json()["classes"] if row["name"] == "t4")


def _nap_version(http) -> str:
    return register(http, text_body("nap", NAP, arg="seconds", gpu_class="t4"))["version"]


def _t4_bundles(address: str) -> list[dict]:
    return [bundle for bundle in autoscaler_request(address) if T4 in bundle]


def test_four_queued_jobs_bring_up_two_nodes_say_so_and_the_class_goes_back_to_zero(cp):
    with cp.http() as http:
        usage = _usage(http)
        assert (usage["nodes_up"], usage["nodes_starting"], usage["nodes_max"], usage["gpus_total"]) == (0, 0, 2, 0)
        version = _nap_version(http)
        # long enough that the second node joins while the first still has work (a loaded machine starts nodes slowly)
        jobs = [submit(http, "nap", version, [{"seconds": "12"}]) for _ in range(4)]
        reasons, peak = set(), 0

        def finished() -> bool:
            nonlocal peak
            peak = max(peak, _usage(http)["nodes_up"])
            described = [describe(http, job) for job in jobs]
            reasons.update(d["placement"].get("pending_reason") or "" for d in described if d["job_state"] == "PENDING")
            return all(d["job_state"] in ("DONE", "FAILED", "CANCELLED") for d in described)

        wait_until(finished, "the four jobs finished", SLOW, interval=0.5)
        described = [describe(http, job) for job in jobs]
        assert all(d["job_state"] == "DONE" for d in described), [d.get("failure") for d in described]
        assert peak == 2 and len({d["result"][0] for d in described}) == 2  # two nodes came and ran them
        assert any(reason.startswith("scaling up: ") and "starting" in reason for reason in reasons), reasons
        # The queue drained: the request is lowered, the idle nodes go on the autoscaler's idle timeout.
        wait_until(lambda: _t4_bundles(cp.ray_address) == [], "the demand lowered to nothing", 30)
        usage = wait_until(lambda: (u := _usage(http))["nodes_up"] == 0 and u, "the class back at zero nodes", SLOW)
        assert usage["nodes_starting"] == 0 and usage["gpus_total"] == 0


def test_a_cancelled_batch_withdraws_its_demand_at_once(cp):
    with cp.http() as http:
        version = _nap_version(http)
        reply = http.post(
            "/v1/batches/create", json={"name": "nap", "version": version, "chunks": [[{"seconds": "30"}]] * 3}
        )
        assert reply.status_code == 202, reply.text
        batch_id = reply.json()["batch_id"]
        # Three one-GPU jobs on one-GPU nodes, at most 2: the autoscaler is asked for two nodes of the class.
        wait_until(lambda: len(_t4_bundles(cp.ray_address)) == 2, "two t4 nodes asked of the autoscaler", SLOW)
        assert _t4_bundles(cp.ray_address) == [{"GPU": 1, T4: 1}] * 2
        cancelled = http.post("/v1/batches/cancel", json={"batch_id": batch_id}).json()
        assert cancelled["cancelled"] is True
        wait_until(lambda: _t4_bundles(cp.ray_address) == [], "the cancelled batch's demand withdrawn", 10)
        wait_until(lambda: _usage(http)["nodes_starting"] == 0, "no node starting for the class any more", 10)


def test_a_job_larger_than_the_class_nodes_is_refused_at_once(cp):
    with cp.http() as http:
        body = text_body("nap", NAP, arg="seconds", gpu_class="t4")
        body["runtime"]["resources"]["num_gpus"] = 2
        reply = http.post("/v1/functions/create", json=body)
        assert reply.status_code == 400, reply.text
        assert "max_gpu_count_per_worker of 1" in reply.text
