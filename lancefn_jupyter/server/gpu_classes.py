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
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..models import GpuClass

__all__ = [
    "ConfigError",
    "ClassSpec",
    "GpuClassConfig",
    "SIMULATED_GPU_MODEL",
    "load_gpu_classes",
    "parse_gpu_classes",
    "detect_nvml_gpus",
    "simulated_default",
]

SIMULATED_GPU_MODEL = "Simulated GPU (numba CUDA simulator)"
SIMULATED_DEFAULT_COUNT = 2
ENV_VAR = "LANCEFN_GPU_CLASSES"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_CLASS_KEYS = {
    "name",
    "resource_name",
    "gpu_model",
    "gpu_memory_bytes",
    "max_gpu_count_per_worker",
    "node_selector",
    "tolerations",
    "devices",
    "simulated",
}
_TOP_KEYS = {"gpu_classes", "default_class"}


class ConfigError(Exception):
    """A GPU class configuration problem; the message says where and how to fix it."""


@dataclass(frozen=True)
class ClassSpec:
    """One class: its public hardware description plus where the local executor finds it."""

    gpu_class: GpuClass
    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES ids, or "sim0", "sim1", … when simulated

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
    executor: str = "local",
    environ: Mapping[str, str] | None = None,
    detect: Callable[[], list[tuple[str, str, int]]] | None = None,
) -> GpuClassConfig:
    """Resolve the GPU classes as described in the module docstring."""
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
        return parse_gpu_classes(text, source=path, executor=executor)
    if environ.get("LANCEFN_DISABLE_NVML", "") in ("", "0"):
        gpus = (detect or detect_nvml_gpus)()
    else:
        gpus = []
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
    )
    return GpuClassConfig((ClassSpec(gpu_class, tuple(index for index, _, _ in gpus)),), "default", "nvml")


def simulated_default(count: int = SIMULATED_DEFAULT_COUNT) -> GpuClassConfig:
    gpu_class = GpuClass(
        name="default",
        gpu_model=SIMULATED_GPU_MODEL,
        gpu_memory_bytes=0,  # the simulator has no device memory of its own
        max_gpu_count_per_worker=count,
        simulated=True,
    )
    return GpuClassConfig((ClassSpec(gpu_class, _sim_ids(count)),), "default", "simulated")


def _sim_ids(count: int) -> tuple[str, ...]:
    return tuple(f"sim{i}" for i in range(count))


# ------------------------------------------------------------------------- parsing


def parse_gpu_classes(text: str, *, source: str = "<gpu classes>", executor: str = "local") -> GpuClassConfig:
    """Validate TOML text into a config; every error names ``source``, the class and the field."""
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
        spec = _parse_class(entry, f"{source}: gpu_classes[{index}]", executor)
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


def _parse_class(entry: dict[str, Any], where: str, executor: str) -> ClassSpec:
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: field 'name' is {'missing' if name is None else repr(name)}; "
            "set name = \"...\" using letters, digits, '_', '.', '-' (e.g. name = \"default\")"
        )
    where = f"{where} (class {name!r})"
    unknown = sorted(set(entry) - _CLASS_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; allowed fields: {', '.join(sorted(_CLASS_KEYS))}")

    def fail(field: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{where}: field {field!r} {problem}; {fix}")

    devices = _parse_devices(entry, fail)
    simulated = "simulated" in entry
    if simulated:
        count = entry["simulated"]
        if type(count) is not int or count < 1:
            raise fail(
                "simulated", f"is {count!r}", "set simulated = N, the number of simulated GPUs (e.g. simulated = 2)"
            )
        if devices is not None:
            raise fail(
                "simulated",
                "is set together with 'devices'",
                "use either devices = [...] (real GPUs) or simulated = N, not both",
            )
        devices = _sim_ids(count)
    if devices is None:
        if executor == "local":
            raise fail(
                "devices",
                "is missing",
                "the local executor needs devices = [0, 1] (CUDA device ids) or simulated = N",
            )
        devices = ()  # Ray reports capacity itself

    def text(field: str, default: str | None) -> str:
        value = entry.get(field, default)
        if value is None:
            raise fail(field, "is missing", f'add {field} = "..."')
        if not isinstance(value, str) or not value.strip():
            raise fail(field, f"is {value!r}", "it must be a non-empty string")
        return value

    resource_name = text("resource_name", "nvidia.com/gpu")
    gpu_model = text("gpu_model", SIMULATED_GPU_MODEL if simulated else None)

    memory = entry.get("gpu_memory_bytes", 0 if simulated else None)
    if memory is None:
        raise fail(
            "gpu_memory_bytes", "is missing", "add gpu_memory_bytes = <bytes per GPU>, e.g. 85899345920 for 80 GiB"
        )
    if type(memory) is not int or memory < 0:
        raise fail("gpu_memory_bytes", f"is {memory!r}", "it must be a whole number of bytes ≥ 0, e.g. 85899345920")

    limit = entry.get("max_gpu_count_per_worker", len(devices) or None)
    if limit is None:
        raise fail(
            "max_gpu_count_per_worker", "is missing", "add max_gpu_count_per_worker = N (GPUs one worker may request)"
        )
    if type(limit) is not int or not 1 <= limit <= 2**32 - 1:
        raise fail("max_gpu_count_per_worker", f"is {limit!r}", "it must be a whole number ≥ 1")
    if devices and limit > len(devices):
        raise fail(
            "max_gpu_count_per_worker",
            f"is {limit} but the class has only {len(devices)} device(s)",
            f"lower it to at most {len(devices)} or add devices",
        )

    node_selector = entry.get("node_selector", {})
    if not isinstance(node_selector, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in node_selector.items()
    ):
        raise fail("node_selector", "must map strings to strings", 'write node_selector = { "label" = "value" }')
    tolerations = entry.get("tolerations", [])
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise fail(
            "tolerations",
            "must be a list of tables",
            'write tolerations = [{ key = "nvidia.com/gpu", operator = "Exists", effect = "NoSchedule" }]',
        )
    try:
        gpu_class = GpuClass(
            name=name,
            resource_name=resource_name,
            gpu_model=gpu_model,
            gpu_memory_bytes=memory,
            max_gpu_count_per_worker=limit,
            node_selector=node_selector,
            tolerations=tuple(tolerations),
            simulated=simulated,
        )
    except ValueError as error:  # pydantic's ValidationError; e.g. nan inside tolerations
        first = error.errors()[0] if hasattr(error, "errors") else {"loc": (), "msg": str(error)}
        field = ".".join(str(part) for part in first["loc"]) or "?"
        raise fail(field, f"is invalid ({first['msg']})", "fix the value") from None
    return ClassSpec(gpu_class, devices)


def _parse_devices(entry: dict[str, Any], fail: Callable[[str, str, str], ConfigError]) -> tuple[str, ...] | None:
    if "devices" not in entry:
        return None
    raw = entry["devices"]
    fix = "write devices = [0, 1] (CUDA device indices) or GPU UUID strings"
    if not isinstance(raw, list) or not raw:
        raise fail("devices", f"is {raw!r}", fix)
    devices: list[str] = []
    for item in raw:
        if type(item) is int and item >= 0:
            devices.append(str(item))
        elif isinstance(item, str) and item.strip() and "," not in item:
            devices.append(item.strip())
        else:
            raise fail("devices", f"contains {item!r}", fix)
    duplicates = sorted({d for d in devices if devices.count(d) > 1})
    if duplicates:
        raise fail("devices", f"lists device {duplicates[0]} more than once", "list each device once")
    return tuple(devices)
