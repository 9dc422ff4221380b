"""Demand shaping: a class's queue → node-shaped bundles for the autoscaler, bounded by the class's maximum nodes and
each namespace's allowance; how long node starts took; the pending reason while a class scales up."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.policy.demand import (
    Ask,
    Job,
    NodeScaling,
    StartClock,
    allowances,
    scaling_reason,
    shape_demand,
)

pytestmark = pytest.mark.unit

ONE_GPU_NODES = NodeScaling(Ask(1), max_nodes=4)


def jobs(*gpus: int, namespace: str = "") -> list[Job]:
    return [Job(Ask(g), namespace) for g in gpus]


def test_sixteen_one_gpu_jobs_ask_for_the_class_maximum_of_one_gpu_nodes():
    demand = shape_demand([], jobs(*[1] * 16), ONE_GPU_NODES)
    assert demand.bundles == (Ask(1),) * 4
    assert demand.over_max == 12 and demand.never_fits == 0


def test_jobs_are_packed_into_nodes_of_the_class_shape_first_fit():
    eight = NodeScaling(Ask(8), max_nodes=3)
    demand = shape_demand(jobs(4), jobs(2, 4, 8, 2, 1), eight)
    # node 1: the running 4 + 2 + 2 = 8; node 2: 4 + 1; node 3: 8
    assert demand.bundles == (Ask(8), Ask(5), Ask(8))
    assert demand.nodes == 3 and demand.over_max == 0


def test_running_jobs_count_and_the_request_drains_with_the_queue():
    assert shape_demand(jobs(1, 1), jobs(1), ONE_GPU_NODES).bundles == (Ask(1),) * 3
    assert shape_demand(jobs(1), [], ONE_GPU_NODES).bundles == (Ask(1),)
    assert shape_demand([], [], ONE_GPU_NODES).bundles == ()  # nothing waits: idle nodes may go


def test_a_job_larger_than_a_node_never_counts_and_later_jobs_still_do():
    two = NodeScaling(Ask(2), max_nodes=2)
    demand = shape_demand([], jobs(4, 1), two)
    assert demand.never_fits == 1 and demand.bundles == (Ask(1),)


def test_cpus_and_memory_shape_the_bundles_where_the_node_says_them():
    node = NodeScaling(Ask(2, cpus=8, memory=64), max_nodes=4)
    queued = [Job(Ask(1, cpus=6, memory=8)), Job(Ask(1, cpus=6, memory=8)), Job(Ask(1, cpus=1, memory=80))]
    demand = shape_demand([], queued, node)
    # two 6-CPU jobs cannot share an 8-CPU node; 80 bytes of memory never fit a node of 64
    assert demand.bundles == (Ask(1, 6, 8), Ask(1, 6, 8)) and demand.never_fits == 1


def test_a_namespace_over_its_allowance_adds_no_demand_and_others_still_do():
    queued = jobs(1, 1, 1, namespace="a") + jobs(1, namespace="b")
    demand = shape_demand(jobs(1, namespace="a"), queued, ONE_GPU_NODES, allowance={"a": 2})
    # a holds 1 and may hold 2: one more of its jobs counts; b is not capped
    assert demand.bundles == (Ask(1),) * 3 and demand.over_allowance == 2
    assert allowances({"a": 4, "b": 1}, {"a": 3}) == {"a": 1, "b": 1}


def test_the_start_clock_times_nodes_from_the_ask_to_the_join():
    clock = StartClock()
    assert clock.recent_s() is None
    clock.update(0.0, wanted=2, up=0)
    clock.update(30.0, wanted=2, up=1)
    clock.update(50.0, wanted=2, up=2)
    assert clock.recent_s() == 50.0  # the median of 30 and 50: the later of two
    clock.update(60.0, wanted=1, up=0)  # scaled down, one more asked: timed from now
    clock.update(100.0, wanted=1, up=1)
    assert sorted(clock._took) == [30.0, 40.0, 50.0] and clock.recent_s() == 40.0
    assert clock.next_up(100.0) is None  # nothing asked
    clock.update(110.0, wanted=2, up=1)
    assert clock.next_up(120.0) == 150.0 and clock.next_up(160.0) == 160.0  # asked at 110, ~40 s; late: now


def test_an_ask_withdrawn_before_any_node_joined_is_not_timed():
    clock = StartClock()
    clock.update(0.0, wanted=3, up=0)
    clock.update(5.0, wanted=1, up=0)  # the queue drained: two asks withdrawn
    clock.update(20.0, wanted=1, up=1)
    assert clock.recent_s() == 20.0


def test_the_scaling_reason_says_how_many_nodes_start_and_how_long_they_took():
    assert scaling_reason(2, 41.6) == "scaling up: 2 nodes starting, ~42 s recently"
    assert scaling_reason(1, None) == "scaling up: 1 node starting"
    assert scaling_reason(0, 40.0) is None
