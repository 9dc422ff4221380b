"""Math-library threads per worker (docs/ARCHITECTURE.md, "Workers"): the CPUs shared by the devices, and the
value a worker's function actually sees through a real control plane."""

from __future__ import annotations

import os

from lancefn_jupyter.server.executors.local import threads_per_worker
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig, parse_gpu_classes


def classes(*simulated: int) -> GpuClassConfig:
    text = "".join(
        f'[[gpu_classes]]\nname = "c{i}"\ngpu_model = "Sim"\ngpu_memory_bytes = 1073741824\n'
        f"max_gpu_count_per_worker = 1\nsimulated = {n}\n"
        for i, n in enumerate(simulated)
    )
    return parse_gpu_classes(text, source="test")


def test_the_cpus_are_shared_by_every_class_device():
    assert threads_per_worker(classes(2), cpus=16) == 8
    assert threads_per_worker(classes(2, 2), cpus=16) == 4
    assert threads_per_worker(classes(8), cpus=2) == 1  # never 0
    assert threads_per_worker(None, cpus=4) == 4


def omp_threads() -> str:
    import os

    return os.environ.get("OMP_NUM_THREADS", "unset")


def test_a_worker_runs_with_its_share_unless_the_server_sets_it(control_plane_factory):
    from lancefn_jupyter.kernel import api
    from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state

    kernel_session.registered.clear()
    shared = control_plane_factory()  # the default class: 2 simulated GPUs
    api.connect(shared.url, shared.api_key)
    fn = api.gpu_function(num_gpus=1)(omp_threads)
    assert fn.submit().result() == str(max(1, (os.cpu_count() or 1) // 2))
    chosen = control_plane_factory(env={"OMP_NUM_THREADS": "3"})
    api.connect(chosen.url, chosen.api_key)
    assert api.gpu_function(num_gpus=1)(omp_threads).submit().result() == "3"
