"""A `%%gpu_function` class whose `__init__` takes annotated values (LanceDB 0.40's initialization, docs/ARCHITECTURE.md,
"Warm state"): `submit(x, init={...})` and `map(..., init=...)` create it with them; left out, a 400 says what it
needs."""

from __future__ import annotations

import pytest
from helpers import kernel_shell

from lancefn_jupyter.kernel.client import InvalidRequest

CELL = """\
class Scale:
    def __init__(self, factor: float, offset: float = 0.0):
        self.factor, self.offset = factor, offset

    def __call__(self, x: float) -> float:
        return x * self.factor + self.offset

    def close(self):
        print("closed", self.factor)
"""


@pytest.fixture
def ip(control_plane):
    yield from kernel_shell(control_plane)


def test_a_cell_class_takes_its_init_values_per_run(ip):
    ip.run_cell_magic("gpu_function", "num_gpus=1", CELL)
    scale = ip.user_ns["Scale"]
    assert [f.name for f in scale.version.signature.initialization] == ["factor", "offset"]
    assert scale.submit(2.0, init={"factor": 3.0}).result() == 6.0
    assert scale.submit(2.0, init={"factor": 3.0, "offset": 1.0}).result() == 7.0
    assert scale.map([1.0, 2.0], init={"factor": 2.0}).result() == [2.0, 4.0]
    assert scale.map([1.0, 2.0, 3.0], chunk_size=1, parallel=2, init={"factor": 10.0}).result() == [10.0, 20.0, 30.0]
    with pytest.raises(InvalidRequest, match=r"init: missing factor; Scale@\w+ is created with \(factor, offset\?\)"):
        scale.submit(2.0)
