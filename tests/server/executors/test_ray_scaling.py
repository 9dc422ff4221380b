"""The Ray side of scaling with the queue, without a cluster: bundles for the autoscaler, what the bridge reports, and
two control planes' requests adding up through Ray's KV instead of cancelling each other (Ray's KV and
``request_resources`` stand in as dicts here; ``test_ray_autoscale.py`` runs the real ones)."""

from __future__ import annotations

import json
import time

import pytest

from lancefn_jupyter.server.executors.ray import scaling
from lancefn_jupyter.server.policy.demand import Ask, Demand, NodeScaling
from lancefn_jupyter.server.policy.gpu_classes import parse_gpu_classes

pytest.importorskip("ray")

pytestmark = pytest.mark.unit

T4 = "lancefn_gpu_class:t4"


def test_a_class_config_reaches_the_bridge_and_its_demand_becomes_class_bundles():
    from lancefn_jupyter.server.executors.ray_plugin import PLUGIN

    classes = parse_gpu_classes(
        '[[gpu_classes]]\nname = "t4"\ngpu_model = "T4"\ngpu_memory_bytes = 1\nmax_gpu_count_per_worker = 2\n'
        "max_nodes = 3\ngpus_per_node = 4\n"
        '[[gpu_classes]]\nname = "l4"\ngpu_model = "L4"\ngpu_memory_bytes = 1\nmax_gpu_count_per_worker = 1\n'
        'max_nodes = 2\nnode_cpu = 8\nnode_memory = "32Gi"\n'
        '[[gpu_classes]]\nname = "a100"\ngpu_model = "A100"\ngpu_memory_bytes = 1\nmax_gpu_count_per_worker = 8\n',
        rules=PLUGIN,
    )
    config = scaling.scaling_config(classes)
    assert config == {  # a100 does not scale; a node's CPUs and memory shape l4's bundles (0: not said)
        "t4": {"gpus": 4, "cpus": 0.0, "memory": 0, "max_nodes": 3, "min_nodes": 0},
        "l4": {"gpus": 1, "cpus": 8.0, "memory": 32 << 30, "max_nodes": 2, "min_nodes": 0},
    }
    assert scaling.scaling_of(json.loads(json.dumps({"scaling": config}))) == {
        "t4": NodeScaling(Ask(4), 3),
        "l4": NodeScaling(Ask(1, cpus=8, memory=32 << 30), 2),
    }
    demand = Demand((Ask(4), Ask(1, cpus=2, memory=8)))
    assert scaling.bundles_of("t4", demand) == [{"GPU": 4, T4: 4}, {"GPU": 1, T4: 1, "CPU": 2, "memory": 8}]


def test_the_report_says_nodes_up_starting_and_maximum_and_only_when_they_change():
    report = scaling.ScalingReport({"t4": NodeScaling(Ask(1), 4)})
    first = report.update(0.0, {"t4": Demand((Ask(1),) * 3)}, {"t4": 1})
    assert first["t4"] | {"next_up_ms": None} == {
        "nodes_up": 1,
        "nodes_starting": 2,
        "nodes_max": 4,
        "nodes_wanted": 3,
        "start_s": None,
        "next_up_ms": None,
    }
    assert report.update(1.0, {"t4": Demand((Ask(1),) * 3)}, {"t4": 1}) is None  # nothing changed
    later = report.update(31.0, {"t4": Demand((Ask(1),) * 3)}, {"t4": 2})
    assert later["t4"]["nodes_starting"] == 1 and later["t4"]["start_s"] == 31.0
    assert abs(later["t4"]["next_up_ms"] / 1000 - time.time()) < 5  # the other node, asked at 0, is due now
    assert report.update(32.0, {}, {"t4": 2})["t4"]["nodes_starting"] == 0  # the queue drained


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's internal KV and the autoscaler's one request, as dicts."""
    import ray.autoscaler.sdk
    import ray.experimental.internal_kv as kv

    store: dict[bytes, bytes] = {}
    requested: list[list[dict]] = []
    monkeypatch.setattr(kv, "_internal_kv_put", lambda key, value, overwrite=True: store.__setitem__(key, value))
    monkeypatch.setattr(kv, "_internal_kv_get", lambda key: store.get(key))
    monkeypatch.setattr(kv, "_internal_kv_del", lambda key: store.pop(key, None))
    monkeypatch.setattr(kv, "_internal_kv_list", lambda prefix: [k for k in store if k.startswith(prefix)])
    monkeypatch.setattr(ray.autoscaler.sdk, "request_resources", lambda bundles: requested.append(bundles))
    return store, requested


def test_two_control_planes_requests_add_up_and_a_gone_ones_stops_counting(fake_ray):
    store, requested = fake_ray
    one, two = scaling.DemandPublisher("hub-one"), scaling.DemandPublisher("hub-two")
    one.publish([{"GPU": 1.0, T4: 1.0}], 0.0)
    two.publish([{"GPU": 2.0, T4: 2.0}], 0.0)
    assert sorted(b["GPU"] for b in requested[-1]) == [1.0, 2.0]  # the second adds to the first
    one.publish([], 1.0)  # one's queue drained (a cancelled batch): two's request stays
    assert requested[-1] == [{"GPU": 2.0, T4: 2.0}]
    # one went away without withdrawing: its entry, older than the lease, stops counting and is dropped
    one.publish([{"GPU": 1.0, T4: 1.0}], 2.0)
    key = one.key
    store[key] = json.dumps({"at": time.time() - scaling.LEASE_S - 1, "bundles": [{"GPU": 1.0}]}).encode()
    two.publish([{"GPU": 2.0, T4: 2.0}], 3.0)
    assert requested[-1] == [{"GPU": 2.0, T4: 2.0}] and key not in store
    two.withdraw()
    assert requested[-1] == [] and not store
    assert two.due([], 100.0) and not one.due([{"GPU": 1.0, T4: 1.0}], 2.5)  # rewritten when changed or every 10 s
