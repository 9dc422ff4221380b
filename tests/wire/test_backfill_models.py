"""The backfill's wire models (wire/backfill_models.py): valid bodies, each refusal naming its field, and the
shapes an older home stored."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lancefn_jupyter.wire.backfill_models import (
    MAX_CHUNK_ROWS,
    ON_ERROR,
    RECOMPUTE,
    BackfillOptions,
    BackfillRequest,
    BackfillSpec,
    TableSlice,
)
from lancefn_jupyter.wire.errors import format_validation_error
from lancefn_jupyter.wire.models import MAX_TIMEOUT_S

pytestmark = pytest.mark.unit

BODY = {"name": "embed", "version": "0123456789abcdef", "table_uri": "/data/docs.lance", "into": "vec"}


def refusal(model: type, data: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    return format_validation_error(caught.value)


def test_a_minimal_body_takes_the_defaults_and_encodes_to_itself():
    request = BackfillRequest.model_validate(BODY)
    assert (request.recompute, request.on_error, request.max_skip_fraction) == ("missing", "fail", 0.01)
    assert (request.chunk_size, request.parallel, request.retries, request.timeout_s) == (None, None, 0, None)
    assert request.columns is None and request.where is None and request.fresh is False
    assert request.to_wire() == BODY


def test_a_full_body_keeps_every_field():
    body = {
        **BODY,
        "namespace": "team-a",
        "columns": {"text": "body"},
        "where": "id > 3",
        "recompute": "stale",
        "on_error": "skip",
        "max_skip_fraction": 0.5,
        "chunk_size": 128,
        "parallel": 2,
        "retries": 3,
        "timeout_s": 60.0,
        "fresh": True,
    }
    request = BackfillRequest.model_validate(body)
    assert request.to_wire() == body
    assert BackfillRequest.from_json(json.dumps(body)) == request


@pytest.mark.parametrize(
    ("columns", "kept"),
    [({"text": "body"}, {"text": "body"}), (["a", "b"], ("a", "b")), ("body", "body"), (None, None)],
)
def test_columns_are_a_mapping_a_list_by_position_or_one_name(columns, kept):
    assert BackfillRequest.model_validate({**BODY, "columns": columns}).columns == kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"recompute": "sometimes"}, "recompute: recompute must be one of 'missing', 'stale', 'all'"),
        ({"on_error": "ignore"}, "on_error: on_error must be 'fail' (a failing chunk fails) or 'skip'"),
        ({"max_skip_fraction": 2}, "max_skip_fraction: max_skip_fraction must be a number from 0 to 1"),
        ({"max_skip_fraction": -0.1}, "max_skip_fraction: max_skip_fraction must be a number from 0 to 1"),
        ({"max_skip_fraction": True}, "max_skip_fraction: Input should be a valid number"),
        ({"chunk_size": 0}, f"chunk_size: chunk_size must be a whole number of rows from 1 to {MAX_CHUNK_ROWS}"),
        ({"chunk_size": MAX_CHUNK_ROWS + 1}, "chunk_size: chunk_size must be a whole number of rows from 1 to"),
        ({"chunk_size": 1.5}, "chunk_size: Input should be a valid integer"),
        ({"parallel": 0}, "parallel: parallel must be ≥ 1, or null for as many as the class has GPUs ('auto')"),
        ({"retries": 11}, "retries: retries must be a whole number from 0 to 10"),
        ({"retries": "3"}, "retries: Input should be a valid integer"),
        ({"timeout_s": 0}, "timeout_s: Input should be greater than 0"),
        ({"timeout_s": MAX_TIMEOUT_S + 1}, f"timeout_s: Input should be less than or equal to {MAX_TIMEOUT_S}"),
        ({"into": ""}, "into: into must name the column the results go to"),
        ({"table_uri": ""}, "table_uri: String should have at least 1 character"),
        ({"columns": {"text": 3}}, "columns: columns must be {param: column}, a list of column names by position"),
        ({"columns": 5}, "columns: columns must be {param: column}"),
        ({"where": 5}, "where: Input should be a valid string"),
        ({"fresh": "yes"}, "fresh: Input should be a valid boolean"),
        ({"name": None}, "name: Input should be a valid string"),
    ],
)
def test_each_refusal_names_its_field(change, message):
    assert refusal(BackfillRequest, {**BODY, **change}).startswith(message)


def test_the_options_alone_are_checked_as_in_the_request():
    """What the kernel builds before it sends anything: the request's own checks, without the table."""
    assert refusal(BackfillOptions, {"recompute": "x"}) == refusal(BackfillRequest, {**BODY, "recompute": "x"})
    assert RECOMPUTE == ("missing", "stale", "all") and ON_ERROR == ("fail", "skip")


# An older home's `backfills.spec`, as its server wrote it: the table as `table_uri`, `where` null.
OLD_SPEC = {
    "table_uri": "/data/docs.lance",
    "table_version": 3,
    "into": "n",
    "version_column": "n__lancefn_version",
    "columns": {"text": "text"},
    "where": None,
    "recompute": "missing",
    "on_error": "skip",
    "max_skip_fraction": 0.01,
    "input_types": {"text": "utf8"},
    "output_type": "int64",
    "table_root": "/roots/a",
}


def test_an_older_homes_spec_loads_and_is_stored_with_one_name_for_the_table():
    spec = BackfillSpec.from_json(json.dumps(OLD_SPEC))
    assert spec.uri == "/data/docs.lance" and spec.table_root == "/roots/a"
    stored = spec.to_wire()
    assert stored["uri"] == "/data/docs.lance" and "table_uri" not in stored and "where" not in stored
    assert BackfillSpec.from_wire(stored) == spec


def test_a_record_batch_functions_spec_lists_its_columns():
    spec = BackfillSpec.from_wire({**OLD_SPEC, "columns": ["text", "label"]})
    assert spec.columns == ("text", "label")
    assert spec.column_map() == {"text": "text", "label": "label"}


def test_a_slice_as_older_homes_stored_it_loads_and_encodes_the_same():
    """``batch_chunks.rows`` and a chunk job's ``spec.table_slice`` (a job reply shows it as it was)."""
    stored = {"uri": "/data/docs.lance", "table_version": 3, "fragment": 1, "ranges": [[0, 64], [70, 80]]}
    stored |= {"columns": {"text": "text"}, "root": "/roots/a"}
    piece = TableSlice.from_json(json.dumps(stored))
    assert piece.ranges == ((0, 64), (70, 80)) and piece.root == "/roots/a"
    assert piece.to_wire() == stored
    assert TableSlice.from_wire({**stored, "root": None}).to_wire() == {k: v for k, v in stored.items() if k != "root"}


def test_a_slice_is_refused_without_its_ranges():
    assert (
        refusal(TableSlice, {"uri": "/t", "table_version": 1, "fragment": 0, "columns": {}}) == "ranges: Field required"
    )
