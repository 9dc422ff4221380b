"""The Ray executor on a multi-node cluster (``ray.cluster_utils.Cluster``: a GPU-less head and
labelled worker nodes, each its own raylet process on this machine): a job no node can fit says
why it waits, in the job and in the usage reply, and starts once a big enough node joins; the
event hub lives on the driver's node, so losing a worker node does not stop job events.

One cluster for the module; every wait is bounded."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from conftest import ControlPlaneProcess, register
from helpers import describe, ray_server, submit, text_body, wait_done, wait_until

pytest.importorskip("ray")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a throwaway cluster: no token in ~/.ray
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray.cluster_utils import Cluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SLOW = 120.0
CLASSES = """
[[gpu_classes]]
name = "t4"
gpu_model = "NVIDIA T4"
gpu_memory_bytes = 17179869184
max_gpu_count_per_worker = 4
"""
WHERE = """
import ray


def where(tag: str) -> str:
    return ray.get_runtime_context().get_node_id()
"""
T4 = "lancefn_gpu_class:t4"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    temp_dir = tempfile.mkdtemp(prefix="lfc", dir="/tmp")  # short: Ray's unix sockets live below
    os.makedirs(os.path.join(temp_dir, "ray"))
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir  # Ray's files (ray_current_cluster too) stay ours, not /tmp/ray
    try:
        cluster = Cluster(
            initialize_head=True,
            connect=True,  # this test is a driver too: it reads where the hub actor lives
            head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
        )
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def cp(cluster, tmp_path_factory) -> Iterator[ControlPlaneProcess]:
    with ray_server(
        tmp_path_factory, CLASSES, "--ray-address", cluster.address, LANCEFN_RAY_LOST_AFTER_S="60"
    ) as server:
        yield server


def _run(http, version: str, tag: str) -> str:
    return submit(http, "where", version, [{"tag": tag}])


def _hub_node() -> str:
    hubs = [
        a
        for a in ray._private.state.actors().values()
        if (a.get("Name") or "").startswith("lancefn-hub-") and a["State"] == "ALIVE"
    ]
    assert len(hubs) == 1, hubs
    return hubs[0]["Address"]["NodeID"]


def test_an_unfittable_job_says_why_and_starts_once_a_big_node_joins_and_node_loss_spares_events(cluster, cp):
    small = cluster.add_node(num_cpus=1, num_gpus=1, resources={T4: 1})
    cluster.wait_for_nodes()
    head_id = cluster.head_node.node_id
    with cp.http() as http:
        body = text_body("where", WHERE, arg="tag", gpu_class="t4")
        one = register(http, body)["version"]
        job = wait_done(http, _run(http, one, "first"), SLOW)
        assert job["job_state"] == "DONE" and job["result"] == [small.node_id], job

        # The event hub sits on the driver's node (the head here), never on a worker node.
        assert _hub_node() == head_id

        # Two GPUs: the class allows 4, but no node has more than 1.
        body["runtime"]["resources"]["num_gpus"] = 2
        two = register(http, body)["version"]
        waiting = _run(http, two, "big")
        # The reason follows the bridge's periodic read of the cluster: wait until it has seen the new node.
        job = wait_until(
            lambda: (
                "(the largest has 1)" in ((j := describe(http, waiting))["placement"].get("pending_reason") or "") and j
            ),
            "a pending reason naming the small node",
            SLOW,
        )
        assert job["job_state"] == "PENDING" and job["placement"]["waiting_on_capacity"] is True
        reason = job["placement"]["pending_reason"]
        assert "no node of GPU class 't4' can currently fit 2 GPUs (the largest has 1)" in reason
        assert "autoscaler" in reason
        usage = {row["name"]: row for row in http.get("/v1/gpu/usage").json()["classes"]}
        assert usage["t4"]["jobs_pending"] == 1 and usage["t4"]["pending_reason"] == reason

        # The worker node dies (the hub's node does not): a bigger node joins, the waiting job
        # runs there and its events and outcome still arrive; so do later jobs'.
        cluster.remove_node(small, allow_graceful=False)
        big = cluster.add_node(num_cpus=1, num_gpus=2, resources={T4: 2})
        cluster.wait_for_nodes()
        job = wait_done(http, waiting, SLOW)
        assert job["job_state"] == "DONE" and job["result"] == [big.node_id], job
        assert job["placement"]["node"] == big.node_id and "pending_reason" not in job["placement"]
        later = wait_done(http, _run(http, one, "after"), SLOW)
        assert later["job_state"] == "DONE" and later["result"] == [big.node_id]
        assert _hub_node() == head_id
        usage = {row["name"]: row for row in http.get("/v1/gpu/usage").json()["classes"]}
        assert "pending_reason" not in usage["t4"]
