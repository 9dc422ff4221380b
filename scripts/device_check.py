"""The real-CUDA check (issue 3) for a machine with an NVIDIA GPU, in one short run.

    python scripts/device_check.py          # on the GPU machine, from the repo root, after installing
    python scripts/device_check.py --dataplane-bench   # then a short run of benchmarks/bench_dataplane.py

It starts a throwaway `lancefn-server` whose `default` class comes from NVML (no config), registers a
`@cuda.jit` cell, then runs it through `.local()` (which must pick the GPU, not the simulator) and as
jobs (each must see exactly its placed devices in `CUDA_VISIBLE_DEVICES`). It
prints what it saw and exits non-zero if a check fails. On a machine without a GPU it says so and
runs everything on the simulator instead, which is how it is exercised in CI-less development.
"""

from __future__ import annotations

import os
import sys
import tempfile

# An elementwise doubling kernel; each cell below defines its own, under its own name.
KERNEL = """\
@cuda.jit
def {name}(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]
"""

CELL = f"""\
import os
import numpy as np
from numba import cuda

{KERNEL.format(name="_double")}
def probe(values: list[float]) -> list[str]:
    x = np.asarray(values, dtype=np.float32)
    out = np.zeros_like(x)
    _double.forall(x.size)(x, out)
    device = "CUDA simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else cuda.get_current_device().name
    if isinstance(device, bytes):
        device = device.decode()
    return [str(out.tolist()), os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"), str(device)]
"""


ARRAY_CELL = f"""\
import numpy as np
from numba import cuda
from numpy.typing import NDArray

{KERNEL.format(name="_twice")}
def twice(x: NDArray[np.float32]) -> NDArray[np.float32]:
    d_x = cuda.to_device(x.ravel())
    d_out = cuda.device_array_like(d_x)
    _twice.forall(x.size)(d_x, d_out)
    return d_out.copy_to_host().reshape(x.shape)
"""


def check_arrays(shell, real: bool, failures: list) -> None:
    """The Arrow data plane on this machine: a float32 array through a kernel, .local() and a job."""
    import numpy as np

    shell.run_cell_magic("gpu_function", "num_gpus=1 pip=numpy", ARRAY_CELL)
    twice = shell.user_ns["twice"]
    shape = (1000, 768) if real else (4, 8)  # the simulator runs one Python thread per element
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for how, got in (("local", twice.local(x)), ("job", twice.remote(x))):
        ok = (
            isinstance(got, np.ndarray)
            and got.dtype == np.float32
            and got.shape == shape
            and np.array_equal(got, x * 2)
        )
        print(
            f"arrays via {how}: {type(got).__name__} {getattr(got, 'dtype', '?')} {getattr(got, 'shape', '?')} exact={ok}"
        )
        if not ok:
            failures.append(f"array round trip via {how} was not exact")


def main() -> int:
    from IPython.core.interactiveshell import InteractiveShell

    from lancefn_jupyter.embedded import stop_server
    from lancefn_jupyter.kernel import api

    home = tempfile.mkdtemp(prefix="lancefn-device-check-")
    os.environ.pop("LANCEFN_URL", None)
    os.environ.pop("LANCEFN_DISABLE_NVML", None)
    failures = []
    try:
        api.use_local(home)
        classes = api.list_gpu_classes()
        print(repr(classes))
        default = next(c for c in classes if c.name == "default")
        real = not default.simulated
        print(f"GPU class 'default': {default.gpu_model}, {default.max_gpu_count_per_worker} GPU(s), real={real}")

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "lancefn_jupyter")
        shell.run_cell_magic("gpu_function", "num_gpus=1 pip=numpy", CELL)
        probe = shell.user_ns["probe"]

        doubled, visible, device = probe.local([1.0, 2.0, 3.0])
        print(f".local(): {doubled} on {probe.last_local_device} (CUDA_VISIBLE_DEVICES={visible}, device {device})")
        if doubled != "[2.0, 4.0, 6.0]":
            failures.append(f".local() computed {doubled}")
        if real and probe.last_local_device == "CUDA simulator":
            failures.append(".local() used the simulator on a machine with a GPU")

        n = default.max_gpu_count_per_worker
        jobs = [probe.submit([float(i)]) for i in range(n)]
        for job in jobs:
            doubled, visible, device = job.result(timeout=300)
            placement = job.snapshot.placement
            print(
                f"job {job.job_id}: {doubled} devices={list(placement.devices)} CUDA_VISIBLE_DEVICES={visible} device={device}"
            )
            expected = ",".join(placement.devices) if real else ""
            if visible != expected:
                failures.append(f"job {job.job_id} saw CUDA_VISIBLE_DEVICES={visible}, expected {expected!r}")
        check_arrays(shell, real, failures)
    finally:
        stop_server(home)
    for failure in failures:
        print("FAILED:", failure)
    print("device check:", "FAILED" if failures else "ok")
    if "--dataplane-bench" in sys.argv[1:]:
        import subprocess

        bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "bench_dataplane.py")
        subprocess.run([sys.executable, bench, "--quick"], check=False)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
