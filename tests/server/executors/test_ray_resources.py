"""A version's cpu= and memory= on Ray: its actor's ``num_cpus`` / ``memory`` (docs/ARCHITECTURE.md, "Compute
resources"; docs/ray.md)."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.executors.ray.bridge import actor_options  # Ray itself is imported only by the driver

pytestmark = pytest.mark.unit


def test_a_gpu_actor_holds_the_cpu_and_memory_its_version_asks_for():
    options = actor_options({"num_gpus": 1, "gpu_class": "small", "cpu": 4.0, "memory": 2**30})
    assert options["num_cpus"] == 4.0 and options["memory"] == 2**30
    assert options["num_gpus"] == 1 and options["resources"] == {"lancefn_gpu_class:small": 1}


def test_without_a_request_a_gpu_actor_holds_no_cpu_and_a_cpu_actor_keeps_rays_default():
    assert actor_options({"num_gpus": 2, "cpu": None, "memory": None})["num_cpus"] == 0
    assert "memory" not in actor_options({"num_gpus": 2})
    assert actor_options({"num_gpus": 0}) == {"max_restarts": 0, "max_concurrency": 1}
    assert actor_options({"num_gpus": 0, "cpu": 0.5})["num_cpus"] == 0.5
