"""Wire models of a backfill (docs/ARCHITECTURE.md, "Backfills"): the request (the body of
``POST /v1/backfills/create``), the spec kept with its batch, and a chunk's slice of the table.

The request's options are checked here and nowhere else (:class:`BackfillOptions`): the kernel builds them
before it sends anything (``handles/table_map.py``), the server parses the body into :class:`BackfillRequest`;
what needs the function or the table (columns against parameters, types, ``where``) is the server's plan.

One name for the table: ``uri``, in the spec and in the slices, always the resolved spelling
(``realpath`` for a local path); the request and the batch's reply say ``table_uri``, as they always did.
A spec stored by an older server says ``table_uri``: it is read as ``uri``.

Pure: pydantic and the standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    AliasChoices,
    BeforeValidator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from lancefn_jupyter.wire.batch_models import MAX_RETRIES
from lancefn_jupyter.wire.models import MAX_TIMEOUT_S, TextMap, WireModel

__all__ = [
    "MAX_CHUNK_ROWS",
    "ON_ERROR",
    "RECOMPUTE",
    "BackfillOptions",
    "BackfillRequest",
    "BackfillSpec",
    "Columns",
    "OnError",
    "Recompute",
    "TableSlice",
]

Recompute = Literal["missing", "stale", "all"]  # which rows a backfill runs ("Which rows")
OnError = Literal["fail", "skip"]  # what a failing row does ("Bad rows")
RECOMPUTE: tuple[str, ...] = get_args(Recompute)
ON_ERROR: tuple[str, ...] = get_args(OnError)
MAX_CHUNK_ROWS = 1 << 20


def _one_of(name: str, allowed: tuple[str, ...], meaning: str) -> BeforeValidator:
    """A word of ``allowed``, refused with a message naming the option (before the Literal's own check)."""

    def check(value: Any) -> Any:
        if value not in allowed:
            raise ValueError(f"{name} must be {meaning}; got {name}={value!r}")
        return value

    return BeforeValidator(check)


def _within(name: str, low: float, high: float | None, meaning: str) -> AfterValidator:
    """``low`` ≤ value (≤ ``high``); None passes (not given)."""

    def check(value: Any) -> Any:
        if value is not None and not (low <= value and (high is None or value <= high)):
            raise ValueError(f"{name} must be {meaning}; got {value!r}")
        return value

    return AfterValidator(check)


def _column_name(value: str) -> str:
    if not value:
        raise ValueError("into must name the column the results go to")
    return value


# {param: column}, or [column, …] by position (a record_batch function: the columns it takes).
Columns = TextMap | tuple[StrictStr, ...]


def _columns_shape(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:  # one sentence instead of one per branch of the union
        raise ValueError(
            "columns must be {param: column}, a list of column names by position, one column name, or omitted"
        ) from None


class BackfillOptions(WireModel):
    """How a backfill runs, each option checked with a message that names it and its range."""

    where: StrictStr | None = None  # a Lance SQL filter, ANDed on top of `recompute` (checked by the plan)
    recompute: Annotated[Recompute, _one_of("recompute", RECOMPUTE, "one of 'missing', 'stale', 'all'")] = "missing"
    on_error: Annotated[
        OnError, _one_of("on_error", ON_ERROR, "'fail' (a failing chunk fails) or 'skip' (its row stays null)")
    ] = "fail"
    max_skip_fraction: Annotated[
        StrictFloat, _within("max_skip_fraction", 0, 1, "a number from 0 to 1 (of the rows)")
    ] = 0.01
    chunk_size: Annotated[
        StrictInt | None, _within("chunk_size", 1, MAX_CHUNK_ROWS, f"a whole number of rows from 1 to {MAX_CHUNK_ROWS}")
    ] = None
    # None: as many chunks at once as the class has GPUs ("auto")
    parallel: Annotated[
        StrictInt | None,
        _within("parallel", 1, None, "≥ 1, or null for as many as the class has GPUs ('auto')"),
    ] = None
    retries: Annotated[
        StrictInt,
        _within("retries", 0, MAX_RETRIES, f"a whole number from 0 to {MAX_RETRIES} (re-runs of a failed chunk)"),
    ] = 0
    timeout_s: Annotated[StrictFloat, Field(gt=0, le=MAX_TIMEOUT_S)] | None = None
    fresh: StrictBool = False  # accepted for symmetry with batches: a backfill always plans its rows anew


class BackfillRequest(BackfillOptions):
    """The body of ``POST /v1/backfills/create``: which function, which table and column, and the options."""

    name: StrictStr
    version: StrictStr
    namespace: StrictStr | None = None  # which namespace's function (as for functions/run)
    table_uri: Annotated[StrictStr, Field(min_length=1)]  # the Lance dataset: a LanceDB table's directory
    into: Annotated[StrictStr, AfterValidator(_column_name)]
    # {param: column}, [column, …] by position, one column, or omitted (the parameters named like table columns)
    columns: Annotated[Columns | StrictStr | None, WrapValidator(_columns_shape)] = None
    # A class entry's initialization values for every chunk (checked against the signature by the control plane):
    # JSON, or a LanceDB 0.40 binding's ``initialization`` (a base64 one-row Arrow IPC stream); one of the two.
    init: dict[str, Any] | None = None
    initialization: StrictStr | None = None


class BackfillSpec(WireModel):
    """What a backfill keeps with its batch (the ``backfills.spec`` column): the checked request against
    the table version it planned, the function's types, and, on a shared server, the table root whose
    owner's agent does its I/O ("Which tables")."""

    uri: StrictStr = Field(validation_alias=AliasChoices("uri", "table_uri"))  # table_uri: an older home's spec
    table_version: StrictInt
    into: StrictStr
    version_column: StrictStr  # the sidecar: each row's producing function version
    columns: Columns  # {param: column}, or a record_batch function's columns
    where: StrictStr | None = None
    recompute: Recompute
    on_error: OnError
    max_skip_fraction: StrictFloat
    input_types: TextMap  # param → its per-row type
    output_type: StrictStr
    table_root: StrictStr | None = None

    def column_map(self) -> Mapping[str, str]:
        """``columns`` as {param: column} (a record_batch function's columns map to themselves)."""
        return self.columns if isinstance(self.columns, Mapping) else {c: c for c in self.columns}


class TableSlice(WireModel):
    """A chunk's rows: offset ranges ``[start, end)`` inside one fragment of the table at the version its
    backfill planned (``batch_chunks.rows``, a chunk job's ``spec.table_slice``, ``TaskSpec.table_slice``);
    ``root``: the table root whose owner's agent reads it ("Which tables")."""

    uri: StrictStr
    table_version: StrictInt
    fragment: StrictInt
    ranges: tuple[tuple[StrictInt, StrictInt], ...]
    columns: Columns
    root: StrictStr | None = None
