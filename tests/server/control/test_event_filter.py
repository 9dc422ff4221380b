"""The filter of ``jobs/query_events`` (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): LanceDB 0.40's SQL-like
expressions over event rows, and a 400 saying what a filter may hold for anything else."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.control.event_filter import parse
from lancefn_jupyter.server.errors import ApiError

ROWS = [
    {"seq": 1, "state": "PENDING", "emitted_by": "lancefn-server", "claim_entity": None, "rows_processed": 0},
    {"seq": 2, "state": "IN_PROGRESS", "emitted_by": "node-1", "claim_entity": "w1", "rows_processed": 3},
    {"seq": 3, "state": "DONE", "emitted_by": "it's", "claim_entity": None, "rows_processed": 5},
]


@pytest.mark.parametrize(
    ("text", "seqs"),
    [
        ("state = 'DONE'", [3]),
        ("state != 'DONE'", [1, 2]),
        ("state <> 'DONE' and rows_processed >= 3", [2]),
        ("State = 'DONE'", [3]),  # names are case-insensitive, as in SQL
        ("state in ('PENDING', 'DONE')", [1, 3]),
        ("state NOT IN ('PENDING', 'DONE')", [2]),
        ("claim_entity IS NULL", [1, 3]),
        ("claim_entity is not null", [2]),
        ("claim_entity != 'w1'", []),  # NULL never compares true, as in SQL
        ("NOT (seq < 2 OR seq > 2)", [2]),
        ("emitted_by = 'it''s'", [3]),
        ("rows_processed > -1 AND (state = 'PENDING' OR state = 'DONE') AND NOT seq = 1", [3]),
    ],
)
def test_a_filter_keeps_the_rows_it_says(text, seqs):
    keep = parse(text)
    assert [row["seq"] for row in ROWS if keep(row)] == seqs


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("colour = 'red'", "'colour' is not a column"),
        ("state = DONE", "state is compared with 'quoted text', not DONE"),
        ("seq = '1'", "seq is compared with an integer, not '1'"),
        ("state = 'DONE' AND", "it ends too early"),
        ("(state = 'DONE'", "a '(' is not closed"),
        ("state = 'DONE' state", "unexpected 'state'"),
        ("state ~ 1", "cannot read '~ 1'"),
        ("state IS 'x'", "IS takes NULL"),
        ("state NOT = 'x'", "NOT after state takes IN"),
        ("state IN 'x'", "IN takes a list in parentheses"),
        ("(" * 40 + "seq = 1" + ")" * 40, "nested deeper than 32"),
        ("NOT " * 40 + "seq = 1", "nested deeper than 32"),
        ("seq = 1 OR " * 300 + "seq = 1", "over 2000"),
    ],
)
def test_anything_else_is_a_400_saying_what_a_filter_holds(text, problem):
    with pytest.raises(ApiError) as raised:
        parse(text)
    assert raised.value.status == 400 and problem in raised.value.message
    assert "a filter compares the columns state" in raised.value.message
