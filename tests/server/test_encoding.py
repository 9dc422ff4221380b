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


def test_request_bodies_read_integers_past_64_bits_exactly():
    from lancefn_jupyter.server.http.bodies import load_json

    assert load_json(b'{"rows": [{"x": 123456789012345678901234567890}]}') == {
        "rows": [{"x": 123456789012345678901234567890}]
    }
    assert load_json(b'{"rows": [{"x": 1.5, "y": "\\u00e9"}]}') == {"rows": [{"x": 1.5, "y": "é"}]}


@pytest.mark.parametrize("body", [b'{"x": NaN}', b"[1e400]", b'{"x": "\\ud800"}', b"\xed\xa0\x80", b"{"])
def test_request_bodies_that_are_no_json_are_refused_as_before(body):
    from lancefn_jupyter.server.errors import ApiError
    from lancefn_jupyter.server.http.bodies import load_json

    try:
        value = load_json(body)
    except ApiError as error:
        assert error.status == 400
    else:  # what the standard library reads ([inf]) is refused where the rows are checked, as before
        assert value == [math.inf]


def test_the_client_reads_integers_past_64_bits_exactly():
    from lancefn_jupyter.kernel.client._http import _decode, _Reply

    def decoded(body: bytes) -> object:
        return _decode(_Reply(200, "OK", {"content-type": "application/json"}, body))

    big = b'{"result": [123456789012345678901234567890, 2.5]}'
    assert decoded(big) == {"result": [123456789012345678901234567890, 2.5]}
    for value in (-(2**70), 2**64, 10**18 * 99):  # negative, in an array first, 20 digits
        assert decoded(json.dumps([value, 0.1234567890123456789]).encode()) == [value, 0.1234567890123456789]
        assert decoded(str(value).encode()) == value  # the whole body
    # A float's long fraction is no integer: orjson reads it (and reads it as the standard library would).
    assert decoded(b'{"run_ms":0.0023540051188319921}') == {"run_ms": 0.0023540051188319921}
