"""CPU and memory quantities as Kubernetes writes them (docs/ARCHITECTURE.md, "Compute resources"): ``cpu=4``,
``cpu=500m``, ``memory=16Gi``, ``memory=512M``. Pure: the kernel checks a version's options with these, the control
plane places and holds workers to them."""

from __future__ import annotations

import math
import re

__all__ = ["cpu_cores", "format_bytes", "format_cores", "memory_bytes", "quantity_text"]

_CPU = re.compile(r"([0-9]+(?:\.[0-9]+)?)(m?)")
_MEMORY = re.compile(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?")
_UNITS = {
    None: 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}
_MAX_CORES = 1e6
_MAX_BYTES = 2**60


def quantity_text(value: object) -> str:
    """A quantity as text: a Python number (``cpu=4``, ``memory=2**30``) becomes its decimal text."""
    if isinstance(value, bool):
        raise ValueError(f"must be a quantity, not {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number (got {value!r})")
        return repr(value)
    if isinstance(value, str):
        return value.strip()
    raise ValueError(f"must be a number or a quantity string (got {value!r})")


def cpu_cores(text: str) -> float:
    """``"4"`` → 4.0, ``"0.5"`` / ``"500m"`` → 0.5; ValueError saying how to write it."""
    match = _CPU.fullmatch(text)
    if match is None:
        raise ValueError(f"cpu={text!r} is not a CPU quantity; write cpu=4, cpu=0.5 or cpu=500m")
    cores = float(match.group(1)) / (1000 if match.group(2) else 1)
    if not 0 < cores <= _MAX_CORES:
        raise ValueError(f"cpu={text!r} must be more than 0 cores and at most {_MAX_CORES:g}")
    return cores


def memory_bytes(text: str) -> int:
    """``"16Gi"`` → 17179869184, ``"512M"`` → 512000000, ``"1000"`` → 1000 bytes; ValueError saying how to write it."""
    match = _MEMORY.fullmatch(text)
    if match is None:
        raise ValueError(f"memory={text!r} is not a memory quantity; write memory=16Gi, memory=512Mi or memory=8G")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if not 0 < size <= _MAX_BYTES:
        raise ValueError(f"memory={text!r} must be more than 0 bytes and at most 1Ei")
    return size


def format_bytes(size: float) -> str:
    """``17179869184`` → ``"16 GiB"``, ``17502615552`` → ``"16.3 GiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size:.0f} B"


def format_cores(cores: float) -> str:
    """``4.0`` → ``"4 CPUs"``, ``0.5`` → ``"0.5 CPU"``."""
    text = f"{cores:g}"
    return f"{text} CPU" + ("" if cores <= 1 else "s")
