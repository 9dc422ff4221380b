"""GPU classes: operator TOML config, NVML detection, or a simulated default.

Resolution order (docs/ARCHITECTURE.md, "GPU class config (TOML)"):
1. a TOML file (``--gpu-classes FILE`` or ``$LANCEFN_GPU_CLASSES``), validated eagerly —
   any problem is a :class:`ConfigError` naming the file, the class and the field, and the
   server refuses to start;
2. otherwise local GPUs found through NVML (``nvidia-ml-py``) as one ``default`` class;
3. otherwise a ``default`` class of 2 simulated GPUs (numba CUDA simulator), so pending and
   running jobs can be seen on any laptop.

NVML being absent or failing in any way means "zero GPUs", quietly.  Setting
``LANCEFN_DISABLE_NVML=1`` skips NVML on purpose (tests use it to get the simulated default
deterministically on machines that do have GPUs).

Which class is the default (used by functions that don't pin ``gpu_class``): the config's
top-level ``default_class`` if given, else the class named ``default``, else the first class
listed.  Decision: a config without a ``default`` class is legal because operators often name
pools after hardware (``a100``, ``t4``); we make the first one the default rather than refuse.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, ValidationError

from lancefn_jupyter.server.errors import format_validation_error
from lancefn_jupyter.server.policy.demand import Ask, NodeScaling
from lancefn_jupyter.wire.models import GpuClass
from lancefn_jupyter.wire.quantities import memory_bytes

__all__ = [
    "SIMULATED_GPU_MODEL",
    "ClassRules",
    "ClassSpec",
    "ConfigError",
    "GpuClassConfig",
    "detect_nvml_gpus",
    "load_gpu_classes",
    "parse_gpu_classes",
    "simulated_default",
]

SIMULATED_GPU_MODEL = "Simulated GPU (numba CUDA simulator)"
SIMULATED_DEFAULT_COUNT = 2
ENV_VAR = "LANCEFN_GPU_CLASSES"

_T = TypeVar("_T")
_TOP_KEYS = {"gpu_classes", "default_class"}


class ConfigError(Exception):
    """A GPU class configuration problem; the message says where and how to fix it."""


class ClassRules(Protocol):
    """What an executor asks of each GPU class: its plug-in says (docs/ARCHITECTURE.md, "Executor plug-ins")."""

    name: str
    # True: the control plane places jobs on a class's devices, so each class lists some (or is simulated). False:
    # the executor reports each class's capacity itself, and a class may list none.
    needs_devices: bool


@dataclass(frozen=True)
class ClassSpec:
    """One class: its public hardware description plus where the local executor finds it."""

    gpu_class: GpuClass
    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES ids, or "sim0", "sim1", … when simulated
    # Its nodes as an autoscaler adds and removes them (``max_nodes`` …; executors that report capacity only)
    scaling: NodeScaling | None = None

    @property
    def name(self) -> str:
        return self.gpu_class.name

    @property
    def simulated(self) -> bool:
        return self.gpu_class.simulated


@dataclass(frozen=True)
class GpuClassConfig:
    classes: tuple[ClassSpec, ...]
    default_class: str
    source: str  # the file path, "nvml" or "simulated" — shown in logs and health output

    def get(self, name: str | None) -> ClassSpec | None:
        """The class named ``name`` (``None`` means the default class)."""
        wanted = self.default_class if name is None else name
        for spec in self.classes:
            if spec.name == wanted:
                return spec
        return None

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.classes]

    def devices(self) -> dict[str, tuple[str, ...]]:
        """Scheduler input: class name → device ids."""
        return {spec.name: spec.devices for spec in self.classes}


# ------------------------------------------------------------------------- loading


def load_gpu_classes(
    path: str | os.PathLike[str] | None = None,
    *,
    rules: ClassRules | None = None,
    environ: Mapping[str, str] | None = None,
    detect: Callable[[], list[tuple[str, str, int]]] | None = None,
) -> GpuClassConfig:
    """Resolve the GPU classes as described in the module docstring; a file's classes are checked with the
    executor's ``rules`` (None: each class must list its devices)."""
    environ = os.environ if environ is None else environ
    if path is None and environ.get(ENV_VAR):
        path = environ[ENV_VAR]
    if path is not None:
        path = os.fspath(path)
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(
                f"{path}: GPU class config file not found; fix the --gpu-classes path or {ENV_VAR}"
            ) from None
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(f"{path}: cannot read GPU class config ({error})") from None
        return parse_gpu_classes(text, source=path, rules=rules)
    gpus = (detect or detect_nvml_gpus)() if environ.get("LANCEFN_DISABLE_NVML", "") in ("", "0") else []
    if gpus:
        return nvml_default(gpus)
    return simulated_default()


def detect_nvml_gpus() -> list[tuple[str, str, int]]:
    """``[(device index, model name, memory bytes)]`` via NVML; ``[]`` on any problem."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no permission: all mean "no GPUs"
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older bindings return bytes
                name = name.decode("utf-8", "replace")
            memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            gpus.append((str(index), str(name), memory))
        return gpus
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def nvml_default(gpus: Sequence[tuple[str, str, int]]) -> GpuClassConfig:
    models = sorted({model for _, model, _ in gpus})
    # Mixed hardware in one box still forms one pool; say so rather than pick one name.
    gpu_model = models[0] if len(models) == 1 else "mixed: " + ", ".join(models)
    gpu_class = GpuClass(
        name="default",
        gpu_model=gpu_model,
        gpu_memory_bytes=min(memory for _, _, memory in gpus),
        max_gpu_count_per_worker=len(gpus),
        **host_totals(),
    )
    return GpuClassConfig((ClassSpec(gpu_class, tuple(index for index, _, _ in gpus)),), "default", "nvml")


def simulated_default(count: int = SIMULATED_DEFAULT_COUNT) -> GpuClassConfig:
    gpu_class = GpuClass(
        name="default",
        gpu_model=SIMULATED_GPU_MODEL,
        gpu_memory_bytes=0,  # the simulator has no device memory of its own
        max_gpu_count_per_worker=count,
        simulated=True,
        **host_totals(),
    )
    return GpuClassConfig((ClassSpec(gpu_class, _sim_ids(count)),), "default", "simulated")


def _sim_ids(count: int) -> tuple[str, ...]:
    return tuple(f"sim{i}" for i in range(count))


# ------------------------------------------------------------------------- parsing


def parse_gpu_classes(text: str, *, source: str = "<gpu classes>", rules: ClassRules | None = None) -> GpuClassConfig:
    """Validate TOML text into a config, each class by the executor's ``rules`` (None: each must list its
    devices); every error names ``source``, the class and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML ({error}); see the example in docs/ARCHITECTURE.md") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key {unknown[0]!r}; allowed: {', '.join(sorted(_TOP_KEYS))} "
            "(each class is a [[gpu_classes]] table)"
        )
    entries = data.get("gpu_classes")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(
            f"{source}: define at least one GPU class as a [[gpu_classes]] table, e.g.\n"
            '[[gpu_classes]]\nname = "default"\ngpu_model = "NVIDIA A100"\ngpu_memory_bytes = 85899345920\ndevices = [0]'
        )
    specs: list[ClassSpec] = []
    seen_devices: dict[str, str] = {}
    for index, entry in enumerate(entries):
        spec = _parse_class(entry, f"{source}: gpu_classes[{index}]", rules)
        if any(other.name == spec.name for other in specs):
            raise ConfigError(
                f"{source}: gpu_classes[{index}]: duplicate class name {spec.name!r}; give each class its own name"
            )
        if not spec.simulated:
            for device in spec.devices:
                if device in seen_devices:
                    raise ConfigError(
                        f"{source}: class {spec.name!r}: field 'devices': device {device} is already in class "
                        f"{seen_devices[device]!r}; a GPU can belong to one class only"
                    )
                seen_devices[device] = spec.name
        specs.append(spec)
    names = [spec.name for spec in specs]
    default_class = data.get("default_class")
    if default_class is None:
        default_class = "default" if "default" in names else names[0]
    elif not isinstance(default_class, str) or default_class not in names:
        raise ConfigError(
            f"{source}: 'default_class' is {default_class!r} but no class has that name; use one of: {', '.join(names)}"
        )
    return GpuClassConfig(tuple(specs), default_class, source)


_DEVICES_FIX = "write devices = [0, 1] (CUDA device indices) or GPU UUID strings"
# What follows "field 'X' is <value>; " in a ConfigError: how to write the field.
_FIXES = {
    "name": "set name = \"...\" using letters, digits, '_', '.', '-' (e.g. name = \"default\")",
    "simulated": "set simulated = N, the number of simulated GPUs (e.g. simulated = 2)",
    "resource_name": "it must be a non-empty string",
    "gpu_model": "it must be a non-empty string",
    "gpu_memory_bytes": "it must be a whole number of bytes ≥ 0, e.g. 85899345920",
    "max_gpu_count_per_worker": "it must be a whole number ≥ 1",
    "node_selector": 'it must map strings to strings: write node_selector = { "label" = "value" }',
    "cpu_per_gpu": "it must be a number of cores > 0, e.g. cpu_per_gpu = 8",
    "node_cpu": "it must be a number of cores > 0, e.g. node_cpu = 64",
    "price_per_gpu_hour": "it must be a number ≥ 0, e.g. price_per_gpu_hour = 2.5",
    "price_per_cpu_hour": "it must be a number ≥ 0, e.g. price_per_cpu_hour = 0.04",
    "currency": 'it must be a short code without spaces, e.g. currency = "EUR"',
    "tolerations": "it must be a list of tables: "
    'write tolerations = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]',
    "max_nodes": "it must be a whole number ≥ 1: the most nodes of the class the autoscaler may run",
    "min_nodes": "it must be a whole number ≥ 0: the nodes of the class the autoscaler keeps up",
    "gpus_per_node": "it must be a whole number ≥ 1: the GPUs of one node (worker pod) of the class",
    "node_type": "it must be a non-empty string: the autoscaler's node type (KubeRay worker group) of the class",
}
_SCALING_FIELDS = ("min_nodes", "gpus_per_node", "node_type")  # meaningful only with max_nodes
_Text = Annotated[str, StringConstraints(pattern=r"\S")]  # not blank


def _devices(value: Any) -> tuple[str, ...]:
    """Device indices or UUIDs as CUDA_VISIBLE_DEVICES entries; the message goes after "field 'devices' "."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"is {value!r}; {_DEVICES_FIX}")
    devices: list[str] = []
    for item in value:
        if type(item) is int and item >= 0:
            devices.append(str(item))
        elif isinstance(item, str) and item.strip() and "," not in item:
            devices.append(item.strip())
        else:
            raise ValueError(f"contains {item!r}; {_DEVICES_FIX}")
    repeated = sorted({d for d in devices if devices.count(d) > 1})
    if repeated:
        raise ValueError(f"lists device {repeated[0]} more than once; list each device once")
    return tuple(devices)


def _memory(value: Any) -> int:
    """A memory size: a whole number of bytes or a quantity (``"16Gi"``); the message goes after "field 'X' "."""
    if type(value) is int and value > 0:
        return value
    if isinstance(value, str):
        try:
            return memory_bytes(value)
        except ValueError:
            pass
    raise ValueError(f'is {value!r}; write a quantity like "16Gi" or a whole number of bytes')


def host_totals() -> dict[str, Any]:
    """This machine's CPUs and memory, as a class's node totals (the default classes: docs/ARCHITECTURE.md, "GPU
    class config")."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return {"node_cpu": os.cpu_count() or 1, **({"node_memory_bytes": memory} if memory > 0 else {})}


class _ClassEntry(BaseModel):
    """One ``[[gpu_classes]]`` table as written; what one field's default depends on another's
    (simulated classes, a limit from the device count) is settled in :func:`_class_spec`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]
    devices: Annotated[tuple[str, ...] | None, BeforeValidator(_devices)] = None
    simulated: Annotated[int, Field(ge=1)] | None = None
    resource_name: _Text = "nvidia.com/gpu"
    gpu_model: _Text | None = None
    gpu_memory_bytes: Annotated[int, Field(ge=0)] | None = None
    max_gpu_count_per_worker: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    node_selector: dict[str, str] = {}
    tolerations: Annotated[tuple[dict, ...], Field(strict=False)] = ()
    # Host CPU and memory ("Compute resources"): one GPU's share, and the class's node totals.
    cpu_per_gpu: Annotated[float | int, Field(gt=0)] | None = None
    memory_per_gpu: Annotated[int, BeforeValidator(_memory)] | None = None
    node_cpu: Annotated[float | int, Field(gt=0)] | None = None
    node_memory: Annotated[int, BeforeValidator(_memory)] | None = None
    # Prices ("Cost"): an hour of one GPU, of one CPU core, in the operator's currency.
    price_per_gpu_hour: Annotated[float | int, Field(ge=0)] | None = None
    price_per_cpu_hour: Annotated[float | int, Field(ge=0)] | None = None
    currency: Annotated[str, StringConstraints(pattern=r"^\S{1,16}$")] = "USD"
    max_nodes: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    min_nodes: Annotated[int, Field(ge=0, le=2**32 - 1)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=2**32 - 1)] | None = None
    node_type: _Text | None = None


def _entry_problem(error: ValidationError, raw: dict[str, Any]) -> str:
    """The problem to report, after ``where``: a bad name first (the others are then named by
    class), then an unknown field, then the first field in table order."""
    items = error.errors(include_url=False, include_input=False)
    item = next((i for i in items if i["loc"][:1] == ("name",)), None)
    item = item or next((i for i in items if i["type"] == "extra_forbidden"), items[0])
    field = str(item["loc"][0])
    where = "" if field == "name" else f" (class {raw.get('name')!r})"
    if item["type"] == "extra_forbidden":
        return f"{where}: unknown field {field!r}; allowed fields: {', '.join(sorted(_ClassEntry.model_fields))}"
    if item["type"] == "value_error":  # devices: its validator says what and how
        return f"{where}: field {field!r} {item['msg'].removeprefix('Value error, ')}"
    value = repr(raw[field]) if field in raw else "missing"
    return f"{where}: field {field!r} is {value}; {_FIXES[field]}"


def _parse_class(raw: dict[str, Any], where: str, rules: ClassRules | None) -> ClassSpec:
    try:
        entry = _ClassEntry.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(where + _entry_problem(error, raw)) from None
    return _class_spec(entry, f"{where} (class {entry.name!r})", rules)


def _class_spec(entry: _ClassEntry, where: str, rules: ClassRules | None) -> ClassSpec:
    """The class with its defaults filled in, checking what spans fields."""

    def fail(field: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{where}: field {field!r} {problem}; {fix}")

    simulated = entry.simulated is not None
    devices = entry.devices
    if entry.simulated is not None:
        if devices is not None:
            raise fail(
                "simulated",
                "is set together with 'devices'",
                "use either devices = [...] (real GPUs) or simulated = N, not both",
            )
        devices = _sim_ids(entry.simulated)
    elif devices is None:
        if rules is None or rules.needs_devices:
            who = f"the {rules.name} executor needs" if rules is not None else "write"
            raise fail("devices", "is missing", f"{who} devices = [0, 1] (CUDA device ids) or simulated = N")
        devices = ()  # the executor reports the class's capacity itself

    def need(field: str, value: _T | None, fix: str) -> _T:
        if value is None:
            raise fail(field, "is missing", fix)
        return value

    gpu_model = need(
        "gpu_model", entry.gpu_model or (SIMULATED_GPU_MODEL if simulated else None), 'add gpu_model = "..."'
    )
    memory = need(
        "gpu_memory_bytes",
        entry.gpu_memory_bytes if entry.gpu_memory_bytes is not None else (0 if simulated else None),
        "add gpu_memory_bytes = <bytes per GPU>, e.g. 85899345920 for 80 GiB",
    )
    limit = need(
        "max_gpu_count_per_worker",
        entry.max_gpu_count_per_worker or len(devices) or None,
        "add max_gpu_count_per_worker = N (GPUs one worker may request)",
    )
    if devices and limit > len(devices):
        raise fail(
            "max_gpu_count_per_worker",
            f"is {limit} but the class has only {len(devices)} device(s)",
            f"lower it to at most {len(devices)} or add devices",
        )
    try:
        gpu_class = GpuClass(
            **entry.model_dump(include={"name", "resource_name", "node_selector", "tolerations"}),
            gpu_model=gpu_model,
            gpu_memory_bytes=memory,
            max_gpu_count_per_worker=limit,
            simulated=simulated,
            cpu_per_gpu=entry.cpu_per_gpu,
            memory_bytes_per_gpu=entry.memory_per_gpu,
            node_cpu=entry.node_cpu,
            node_memory_bytes=entry.node_memory,
            price_per_gpu_hour=entry.price_per_gpu_hour,
            price_per_cpu_hour=entry.price_per_cpu_hour,
            currency=entry.currency,
        )
    except ValidationError as error:  # e.g. nan inside tolerations
        raise ConfigError(f"{where}: field {format_validation_error(error)}; fix the value") from None
    return ClassSpec(gpu_class, devices, _scaling(entry, limit, devices, fail))


def _scaling(
    entry: _ClassEntry, limit: int, devices: tuple[str, ...], fail: Callable[[str, str, str], ConfigError]
) -> NodeScaling | None:
    """The class's nodes as an autoscaler scales them (docs/ray.md, "Scaling with the queue"), or None."""
    if entry.max_nodes is None:
        for name in _SCALING_FIELDS:
            if getattr(entry, name) is not None:
                raise fail(name, "is set without 'max_nodes'", "add max_nodes = N (the most nodes of the class)")
        return None
    if devices:
        raise fail(
            "max_nodes",
            "is set on a class with devices",
            "an autoscaler scales classes whose executor reports their capacity (--executor ray, no devices)",
        )
    per_node = entry.gpus_per_node or limit
    if per_node < limit:
        raise fail(
            "gpus_per_node",
            f"is {per_node} but max_gpu_count_per_worker is {limit}: a job of {limit} GPUs could never start",
            f"lower max_gpu_count_per_worker to at most {per_node} or raise gpus_per_node",
        )
    min_nodes = entry.min_nodes or 0
    if min_nodes > entry.max_nodes:
        raise fail("min_nodes", f"is {min_nodes}, more than max_nodes = {entry.max_nodes}", "lower it")
    # A node's CPUs and memory bound what its jobs may ask together (0: not said, not bounded)
    node = Ask(per_node, float(entry.node_cpu or 0), int(entry.node_memory or 0))
    return NodeScaling(node, entry.max_nodes, min_nodes, entry.node_type or entry.name)
