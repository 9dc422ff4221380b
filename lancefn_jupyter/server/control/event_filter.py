"""The filter of ``POST /v1/jobs/query_events`` (LanceDB 0.40's ``Job.events(filter=...)``, docs/ARCHITECTURE.md,
"LanceDB 0.40 dialect"): a small SQL-like expression over an event row's columns, parsed into a predicate.

Pure: ``parse`` raises ``ApiError(400)`` saying what a filter may hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

from lancefn_jupyter.server.errors import ApiError

__all__ = ["MAX_FILTER_CHARS", "kept_rows", "parse"]

Row = dict[str, Any]
Predicate = Callable[[Row], bool]

MAX_FILTER_CHARS = 2000
_MAX_DEPTH = 32  # nested parentheses and NOTs: deeper is no filter a person writes
TEXT_COLUMNS = ("state", "updated_by", "emitted_from", "emitted_by", "claim_entity", "job_id")
NUMBER_COLUMNS = ("seq", "updated_at_millis", "rows_processed")
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "IS", "NULL"})
ACCEPTED = (
    f"a filter compares the columns {', '.join(TEXT_COLUMNS)} (with 'quoted text') and {', '.join(NUMBER_COLUMNS)} "
    "(with integers) using =, !=, <>, <, <=, >, >=, IN (...), NOT IN (...), IS NULL or IS NOT NULL, joined by AND, "
    "OR, NOT and parentheses; e.g. state = 'DONE' OR rows_processed > 0"
)

_TOKEN = re.compile(
    r"\s*(?:(?P<text>'(?:[^']|'')*')|(?P<number>-?\d+)|(?P<op><=|>=|!=|<>|=|<|>)|(?P<punct>[(),])|(?P<word>[A-Za-z_]\w*))"
)
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def kept_rows(
    read: Callable[[int, int], list[tuple[int, str]]],
    row: Callable[[int, str], Row],
    limit: int,
    keep: Predicate | None,
) -> list[Row]:
    """The first ``limit`` event rows ``keep`` keeps (all, when None), oldest first: ``read(after, size)`` gives a page
    of ``(seq, data)`` above sequence number ``after``, ``row`` makes one an event row. A filter reads on past the rows
    it drops, a page at a time."""
    size = limit if keep is None else max(limit, 1000)
    rows: list[Row] = []
    after = 0
    while page := read(after, size):
        made = [row(seq, data) for seq, data in page]
        rows += made if keep is None else [r for r in made if keep(r)]
        if keep is None or len(rows) >= limit or len(page) < size:
            break
        after = page[-1][0]
    return rows[:limit]


def parse(text: str) -> Predicate:
    """``text`` as a predicate over event rows; a row's NULL (None) column compares as SQL's: never true."""
    if len(text) > MAX_FILTER_CHARS:
        raise ApiError(400, f"filter is {len(text)} characters, over {MAX_FILTER_CHARS}; {ACCEPTED}")
    parser = _Parser(_tokens(text))
    predicate = parser.disjunction(0)
    if (extra := parser.peek()) is not None:
        parser.fail(f"unexpected {extra[1]!r}")
    return predicate


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, at = [], 0
    while text[at:].strip():
        match = _TOKEN.match(text, at)
        if match is None:
            raise ApiError(400, f"filter: cannot read {text[at:].strip()[:20]!r}; {ACCEPTED}")
        kind = match.lastgroup or ""
        value = match.group(kind)
        tokens.append(("keyword", value.upper()) if kind == "word" and value.upper() in _KEYWORDS else (kind, value))
        at = match.end()
    return tokens


class _Parser:
    """Recursive descent: disjunction → conjunction → negation → comparison or a parenthesised disjunction."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            self.fail("it ends too early")
        self.at += 1
        return token

    def accept(self, kind: str, value: str) -> bool:
        if self.peek() == (kind, value):
            self.at += 1
            return True
        return False

    def fail(self, problem: str) -> NoReturn:
        raise ApiError(400, f"filter: {problem}; {ACCEPTED}")

    def disjunction(self, depth: int) -> Predicate:
        parts = [self.conjunction(depth)]
        while self.accept("keyword", "OR"):
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else (lambda row: any(p(row) for p in parts))

    def conjunction(self, depth: int) -> Predicate:
        parts = [self.negation(depth)]
        while self.accept("keyword", "AND"):
            parts.append(self.negation(depth))
        return parts[0] if len(parts) == 1 else (lambda row: all(p(row) for p in parts))

    def negation(self, depth: int) -> Predicate:
        if depth > _MAX_DEPTH:
            self.fail(f"nested deeper than {_MAX_DEPTH}")
        if self.accept("keyword", "NOT"):
            inner = self.negation(depth + 1)
            return lambda row: not inner(row)
        if self.accept("punct", "("):
            inner = self.disjunction(depth + 1)
            if not self.accept("punct", ")"):
                self.fail("a '(' is not closed")
            return inner
        return self.comparison()

    def comparison(self) -> Predicate:
        kind, word = self.take()
        column = word.lower()  # SQL's names are case-insensitive
        if kind != "word" or column not in TEXT_COLUMNS + NUMBER_COLUMNS:
            self.fail(f"{word!r} is not a column")
        if self.accept("keyword", "IS"):
            negated = self.accept("keyword", "NOT")
            if not self.accept("keyword", "NULL"):
                self.fail(f"IS{' NOT' if negated else ''} takes NULL")
            return lambda row: (row.get(column) is None) != negated
        negated = self.accept("keyword", "NOT")
        if self.accept("keyword", "IN"):
            values = self.values(column)
            return lambda row: row.get(column) is not None and (row[column] in values) != negated
        if negated:
            self.fail(f"NOT after {column} takes IN")
        kind, op = self.take()
        if kind != "op":
            self.fail(f"{column} is compared with =, !=, <>, <, <=, >, >=, IN or IS, not {op!r}")
        value, compare = self.value(column), _COMPARE[op]
        return lambda row: row.get(column) is not None and compare(row[column], value)

    def values(self, column: str) -> frozenset:
        if not self.accept("punct", "("):
            self.fail("IN takes a list in parentheses")
        values = {self.value(column)}
        while self.accept("punct", ","):
            values.add(self.value(column))
        if not self.accept("punct", ")"):
            self.fail("an IN list is not closed")
        return frozenset(values)

    def value(self, column: str) -> str | int:
        kind, value = self.take()
        if column in NUMBER_COLUMNS:
            if kind != "number":
                self.fail(f"{column} is compared with an integer, not {value}")
            return int(value)
        if kind != "text":
            self.fail(f"{column} is compared with 'quoted text', not {value}")
        return value[1:-1].replace("''", "'")
