"""A version's host CPU and memory (docs/ARCHITECTURE.md, "Compute resources"): what one of its workers is given
and held to, and whether a worker of its GPU class can ever have that much. Pure.

``resource_request`` is the one function that says what a version's worker asks for (the executors, the
registration check and anything that sizes capacity from the queue read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lancefn_jupyter.wire.quantities import cpu_cores, format_bytes, format_cores, memory_bytes

if TYPE_CHECKING:  # the executors' TaskSpec holds a request: no pydantic models imported for it
    from lancefn_jupyter.wire.models import FunctionResourceRequirements, GpuClass

__all__ = ["NO_REQUEST", "ResourceRequest", "class_totals", "request_problem", "resource_request", "worker_limits"]


@dataclass(frozen=True)
class ResourceRequest:
    """CPU cores and memory bytes one worker is given and held to; None: not asked, and no class default."""

    cpu: float | None = None
    memory: int | None = None
    # How the request reads in messages: the version's own ``memory=16Gi``, or the class default's ``memory=8 GiB
    # (the class's share of 1 GPU)``.
    cpu_text: str = ""
    memory_text: str = ""

    def __bool__(self) -> bool:
        return self.cpu is not None or self.memory is not None


NO_REQUEST = ResourceRequest()


def _share(per_gpu: float | None, num_gpus: int) -> float | None:
    return None if per_gpu is None else per_gpu * max(1, num_gpus)


def resource_request(resources: FunctionResourceRequirements | None, gpu_class: GpuClass | None) -> ResourceRequest:
    """What a worker of a version with ``resources`` on ``gpu_class`` asks for: the version's own ``cpu`` /
    ``memory``, else its GPUs' share of the class (``cpu_per_gpu`` / ``memory_per_gpu``), else nothing."""
    if resources is None:
        return NO_REQUEST
    gpus = resources.num_gpus
    default = f"the class's share of {gpus} GPU{'' if gpus == 1 else 's'}"
    cpu: float | None
    memory: float | None
    if resources.cpu is not None:
        cpu, cpu_text = cpu_cores(resources.cpu), f"cpu={resources.cpu}"
    else:
        cpu = _share(gpu_class.cpu_per_gpu, gpus) if gpu_class is not None else None
        cpu_text = f"cpu={cpu:g} ({default})" if cpu is not None else ""
    if resources.memory is not None:
        memory, memory_text = memory_bytes(resources.memory), f"memory={resources.memory}"
    else:
        memory = _share(gpu_class.memory_bytes_per_gpu, gpus) if gpu_class is not None else None
        memory_text = f"memory={format_bytes(memory)} ({default})" if memory is not None else ""
    if cpu is None and memory is None:
        return NO_REQUEST
    return ResourceRequest(cpu, None if memory is None else int(memory), cpu_text, memory_text)


def worker_limits(gpu_class: GpuClass) -> tuple[tuple[float | None, str], tuple[int | None, str]]:
    """The most CPU cores and memory one worker of the class can ever have, each with the config field that says
    so: its node's total (``node_cpu``, ``node_memory``), else its GPUs' share times ``max_gpu_count_per_worker``."""
    most = gpu_class.max_gpu_count_per_worker
    shares = f"× max_gpu_count_per_worker {most}"
    cpu: tuple[float | None, str]
    memory: tuple[int | None, str]
    if gpu_class.node_cpu is not None:
        cpu = (gpu_class.node_cpu, "node_cpu")
    else:
        cpu = (_share(gpu_class.cpu_per_gpu, most), f"cpu_per_gpu {shares}")
    if gpu_class.node_memory_bytes is not None:
        memory = (gpu_class.node_memory_bytes, "node_memory")
    else:
        share = _share(gpu_class.memory_bytes_per_gpu, most)
        memory = (None if share is None else int(share), f"memory_per_gpu {shares}")
    return cpu, memory


def class_totals(gpu_class: GpuClass, gpus: int) -> tuple[float | None, int | None]:
    """The host CPU cores and memory the class's running jobs may hold together (the scheduler's): its node totals,
    else its ``gpus``' shares; None: not counted."""
    cpu = gpu_class.node_cpu if gpu_class.node_cpu is not None else _share(gpu_class.cpu_per_gpu, gpus)
    memory = gpu_class.node_memory_bytes
    if memory is None and gpu_class.memory_bytes_per_gpu is not None:
        memory = gpu_class.memory_bytes_per_gpu * max(1, gpus)
    return cpu, memory


def request_problem(request: ResourceRequest, gpu_class: GpuClass) -> str | None:
    """Why no worker of ``gpu_class`` can ever have ``request`` (a registration's 400), or None."""
    (cpu, cpu_source), (memory, memory_source) = worker_limits(gpu_class)
    where = f"the most a worker of GPU class {gpu_class.name!r} can have,"
    if request.cpu is not None and cpu is not None and request.cpu > cpu:
        return (
            f"{request.cpu_text} is more than {where} {format_cores(cpu)} ({cpu_source} in the GPU class config); "
            f"ask for at most cpu={cpu:g}, or pick another gpu_class"
        )
    if request.memory is not None and memory is not None and request.memory > memory:
        return (
            f"{request.memory_text} is more than {where} {format_bytes(memory)} ({memory_source} in the GPU class "
            "config); "
            f"ask for at most memory={memory // 2**20}Mi, or pick another gpu_class"
        )
    return None
