"""The control plane's JSON (``server/encoding.py``): documents are written by orjson and read back the same,
what orjson refuses falls back to the standard library, and user values are checked strictly."""

from __future__ import annotations

import json
import math

import pytest

from lancefn_jupyter.server.encoding import checked_json, dumps

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "value",
    [
        {"job_id": "a" * 32, "placement": {"devices": ["sim0"], "queue_position": None}, "result": [1, 2.5, "é"]},
        [0.1, 1e16, -0.0, 2**63 - 1, -(2**63), True, None, ""],
        {"nested": [[{"k": "日本"}]], "emoji": "🙂"},
    ],
)
def test_documents_read_back_as_they_were_written(value):
    text = dumps(value)
    assert json.loads(text) == value
    assert ": " not in text and ", " not in text  # compact, like the standard library's separators


def test_what_orjson_refuses_is_written_by_the_standard_library():
    assert json.loads(dumps({"big": 2**70})) == {"big": 2**70}  # past 64 bits
    assert json.loads(dumps({1: "one"})) == {"1": "one"}  # a key that is not a string, as json writes it


def test_user_values_are_checked_strictly():
    for bad in (math.nan, math.inf, [1.0, -math.inf]):
        with pytest.raises(ValueError):
            checked_json(bad)
    with pytest.raises(TypeError):
        checked_json({"x": object()})
    assert checked_json({"x": [1, 2.5]}) == '{"x":[1,2.5]}'
