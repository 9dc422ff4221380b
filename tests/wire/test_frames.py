"""A failure's remote frames, summarized safely (docs/ARCHITECTURE.md, "Debugging a failure"): never a secret, never
a huge object's data, whatever a repr does."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lancefn_jupyter.wire.frames import FRAMES_MAX, LOCALS_MAX, REPR_MAX, capture_frames, frames_text, short_repr

pytestmark = pytest.mark.unit

ARTIFACT = "<gpu_function deep@abc>"


class Loud:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


def test_short_reprs_are_bounded_and_say_what_big_or_broken_values_are():
    assert short_repr(np.zeros((4000, 4000), dtype=np.float32)) == "numpy.ndarray(dtype=float32, shape=(4000, 4000))"
    assert len(short_repr("x" * 10**6)) <= REPR_MAX and len(short_repr(list(range(10**6)))) <= REPR_MAX
    assert short_repr({"a": [1, [2, [3, [4]]]]}) == "{'a': [1, [...]]}"
    assert short_repr(Loud()).startswith("<Loud instance at 0x")  # its repr raised
    assert short_repr(np.float32).startswith("<class")  # a type is no array, though it has `shape` and `dtype`


def test_frames_keep_the_artifacts_innermost_frames_with_secrets_redacted():
    source = "def deep(n, key_value):\n    api_key = key_value\n    data = os\n    if n == 0:\n        raise ValueError(n)\n    deep(n - 1, key_value)\n"
    namespace = {"os": os}
    exec(compile(source, ARTIFACT, "exec"), namespace)
    try:
        namespace["deep"](FRAMES_MAX + 3, "value " + "s3cr3t-value")
    except ValueError as exc:
        frames = capture_frames(exc.__traceback__, [ARTIFACT], ["s3cr3t-value", "on"])
    assert len(frames) == FRAMES_MAX and [f["line"] for f in frames] == [6] * (FRAMES_MAX - 1) + [5]
    innermost = frames[-1]["locals"]
    assert innermost == {"n": "0", "key_value": "'value <redacted>'", "api_key": "<redacted>"}  # no module `data`
    assert frames_text(frames[-1:]) == (
        "deep (line 5):\n    n = 0\n    key_value = 'value <redacted>'\n    api_key = <redacted>"
    )


def test_at_most_so_many_locals_per_frame():
    def many() -> None:
        scope = {f"v{i}": i for i in range(LOCALS_MAX * 2)}
        exec("raise KeyError(1)", {}, scope)

    try:
        many()
    except KeyError as exc:
        frames = capture_frames(exc.__traceback__, ["<string>"])
    assert len(frames[-1]["locals"]) == LOCALS_MAX
