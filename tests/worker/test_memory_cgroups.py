"""A worker held to its memory by the kernel (docs/ARCHITECTURE.md, "Compute resources"): where this host lets the
server make a memory cgroup (v2's controller, or a v1 memory cgroup of its own), a real child process that allocates
past its limit is killed by the kernel, which the parent reads back (``oom_killed``, the peak it held), and the cgroup
goes with it. Skipped where neither can be made (the fallback's watch is tested through the server in
``tests/server/executors/test_compute_resources.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lancefn_jupyter.worker import limits

pytestmark = pytest.mark.unit

GREEDY = "import sys, time; sys.stdin.readline(); block = b'x' * (300 * 2**20); time.sleep(1); print('survived')"


def test_past_its_memory_the_kernel_kills_the_worker_and_the_parent_reads_why():
    child = subprocess.Popen([sys.executable, "-c", GREEDY], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        held = limits.hold(child.pid, None, None, 100 * 2**20)
        if not held.kernel_memory:
            pytest.skip("no memory cgroup can be made here: the fallback's watch holds workers")
        out, _ = child.communicate(b"go\n", timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -9 and b"survived" not in out  # SIGKILL, by the kernel, before it printed
    assert limits.oom_killed(None, held)
    assert 90 * 2**20 <= limits.peak_held(held) <= 100 * 2**20
    limits.release(held)
    assert held.v1 is None or not held.v1.exists()


def test_a_worker_within_its_memory_runs_on_and_is_not_counted_killed():
    calm = "import sys; sys.stdin.readline(); block = b'x' * (20 * 2**20); print('fine')"
    child = subprocess.Popen([sys.executable, "-c", calm], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    held = limits.hold(child.pid, None, None, 512 * 2**20)
    out, _ = child.communicate(b"go\n", timeout=60)
    assert child.returncode == 0 and out.strip() == b"fine"
    assert not limits.oom_killed(None, held)
    limits.release(held)
