"""`f.map(table, column=..., into=...)` over a LanceDB table: a backfill the control plane runs
(docs/ARCHITECTURE.md, "Backfills").

    table = lancedb.connect("data/lance").open_table("docs")
    backfill = embed.map(table, column="text", into="embedding", on_error="skip")
    backfill.result()            # the table at its latest version, every row's `embedding` written
    backfill.errors()            # the rows it skipped: row id, message, traceback, version

The kernel sends the table's Lance URI and the options (`POST /v1/backfills/create`); the control plane
chooses the rows (`into IS NULL`, `recompute=`, `where=`), runs them as a batch of chunk jobs and commits
the results into the table itself, matched by row id. No row passes through the kernel, and the backfill
goes on when the kernel restarts or the script that started it exits: `Backfill.attach(batch_id)`.
Without `into`, it is a plain map over the column's values in the kernel (a `Batch`).

Needs the optional extra: ``pip install 'lancefn-jupyter[lancedb]'`` (imported only here).
Runs in the kernel; it takes the function as a `FunctionRef` (handles/base.py).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from lancefn_jupyter.kernel.handles.base import FunctionRef
from lancefn_jupyter.kernel.handles.batch import Batch, BatchError, check_parallel, start_batch
from lancefn_jupyter.kernel.handles.submit import registered_version
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.backfill_models import BackfillOptions, BackfillRequest
from lancefn_jupyter.wire.errors import format_validation_error
from lancefn_jupyter.wire.models import TERMINAL_STATES, JobState, display_state

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.client import Client
    from lancefn_jupyter.wire.batch_models import BackfillError
    from lancefn_jupyter.wire.batch_models import Batch as BatchRecord

__all__ = ["Backfill", "map_table"]

_ERRORS_PAGE = 1000  # skipped rows per `/v1/backfills/errors` request (the route's default limit)


def _lancedb() -> Any:
    try:
        import lancedb
    except ImportError:
        raise ImportError(
            "mapping over a LanceDB table needs the lancedb extra: pip install 'lancefn-jupyter[lancedb]'"
        ) from None
    return lancedb


def _columns(function: FunctionRef, names: list[str], column: str | list[str] | None) -> list[str] | dict[str, str]:
    """What the backfill reads, as the create body's `columns`: the listed columns (matched to the
    parameters by position), else the parameters whose names are table columns."""
    inputs = function.signature.inputs
    record_batch = len(inputs) == 1 and inputs[0].form == "record_batch"
    if column is None:
        fields = dataplane.struct_fields(inputs[0].arrow_type) if record_batch else None
        if fields is not None:  # a LanceDB RecordBatch UDF: its struct's fields, by name
            return fields
        if record_batch:
            raise ValueError(
                f"{function.name} takes a RecordBatch: pass column= the list of columns to put in it (of {', '.join(names)})"
            )
        missing = [p.name for p in inputs if p.name not in names]
        if missing:
            raise ValueError(
                f"the table has no column named like parameter {', '.join(map(repr, missing))} of {function.name}; "
                f"pass column= the column (or a list, one per parameter) to read, of {', '.join(names)}"
            )
        return {p.name: p.name for p in inputs}
    listed = [column] if isinstance(column, str) else list(column)
    if not listed or not all(isinstance(c, str) for c in listed):
        raise TypeError(f"column= takes a column name or a list of names; got {column!r}")
    unknown = [c for c in listed if c not in names]
    if unknown:
        raise ValueError(f"the table has no column {unknown[0]!r}; its columns are {', '.join(names)}")
    if not record_batch and len(listed) != len(inputs):
        raise ValueError(
            f"{function.name} takes {len(inputs)} parameter(s) ({', '.join(p.name for p in inputs)}) but column= lists "
            f"{len(listed)} column(s); list one column per parameter, in order"
        )
    return listed


def _table_of(table: Any, function: FunctionRef) -> list[str]:
    """The column names of a LanceDB table at its latest version (refusing anything else)."""
    if not (hasattr(table, "uri") and hasattr(table, "schema") and hasattr(table, "search")):
        raise TypeError(
            f"{function.name}.map(column=, into=) takes a LanceDB table "
            f"(lancedb.connect(path).open_table(name)), not {type(table).__name__}"
        )
    if hasattr(table, "checkout_latest"):
        table.checkout_latest()  # another process (an earlier backfill) may have written since it was opened
    return list(table.schema.names)


def _plain_map(
    function: FunctionRef, table: Any, columns: list[str] | dict[str, str], options: dict[str, Any]
) -> Batch:
    """Without `into`: a map over the column's values, read by the kernel (a `Batch` of their results)."""
    names = list(columns.values()) if isinstance(columns, dict) else columns
    data = table.search().select(list(dict.fromkeys(names))).limit(None).to_arrow()
    if len(names) == 1 and len(function.signature.inputs) == 1:
        param = function.signature.inputs[0].name
        return start_batch(function, None, row_of=lambda value: {param: value}, column=data[names[0]], **options)
    params = [p.name for p in function.signature.inputs]
    rows = [
        dict(zip(params, values, strict=True)) for values in zip(*(data[n].to_pylist() for n in names), strict=True)
    ]
    return start_batch(function, rows, **options)


def map_table(
    function: FunctionRef,
    table: Any,
    *,
    column: str | list[str] | None,
    into: str | None,
    key: str | None = None,
    where: str | None = None,
    recompute: str = "missing",
    on_error: str = "fail",
    max_skip_fraction: float = 0.01,
    parallel: Any = "auto",
    chunk_size: int | None = None,
    retries: int = 0,
    return_exceptions: bool = False,
    fresh: bool = False,
    init: dict[str, Any] | None = None,
) -> Backfill | Batch:
    """Check what the kernel can see (nothing starts on bad input), then create the backfill; the
    control plane checks the rest (types, `where`, `init`: a class entry's values for every chunk) and refuses with a
    400 that says what to change."""
    _lancedb()
    if key is not None:
        warnings.warn(
            f"map(table, key={key!r}) is ignored: a backfill matches rows by their row id now, so no key column "
            "is needed and equal values no longer share a result (docs/ARCHITECTURE.md, 'Backfills'); drop key=",
            FutureWarning,
            stacklevel=3,
        )
    names = _table_of(table, function)
    columns = _columns(function, names, column)
    if into is None:
        options = {"parallel": parallel, "chunk_size": chunk_size, "retries": retries, "fresh": fresh, "init": init}
        return _plain_map(function, table, columns, {**options, "return_exceptions": return_exceptions})
    if return_exceptions:
        raise ValueError('a backfill writes no exceptions into the table: pass on_error="skip" to skip failing rows')
    if not isinstance(into, str) or not into:
        raise TypeError(f"into= takes the name of the column to write; got {into!r}")
    read = list(columns.values()) if isinstance(columns, dict) else columns
    if into in read:
        raise ValueError(f"into={into!r} is also an input column; write the results into another column")
    try:  # the options' one check (wire/backfill_models.py), before anything is registered or sent
        checked = BackfillOptions.model_validate(
            {
                "where": where,
                "recompute": recompute,
                "on_error": on_error,
                "max_skip_fraction": max_skip_fraction,
                "chunk_size": chunk_size,
                "parallel": check_parallel(parallel),
                "retries": retries,
                "timeout_s": function.timeout_s,
                "fresh": fresh,
            }
        )
    except ValidationError as error:
        raise ValueError(format_validation_error(error)) from None
    version = registered_version(function)
    request = BackfillRequest(
        name=version.name,
        version=version.version,
        table_uri=str(table.uri),
        into=into,
        columns=columns if isinstance(columns, dict) else tuple(columns),
        init=init,
        **dict(checked),
    )
    from lancefn_jupyter.kernel.session import current_client

    client = current_client()
    reply = client.backfills.create(request.to_wire())
    batch = Batch(reply["batch_id"], client=client, function=function)
    return Backfill(batch, table=table)


class Backfill:
    """A backfill of a table column: the batch the control plane runs (`.batch`), its rows written and
    skipped, the skipped rows' errors, and the table once done (docs/ARCHITECTURE.md, "Backfills")."""

    def __init__(self, batch: Batch, *, table: Any = None):
        self.batch = batch
        self._table = table  # None when attached by id: opened from the URI on first use

    @classmethod
    def attach(cls, batch_id: str, *, client: Client | None = None) -> Backfill:
        """Re-attach to a backfill (after a kernel restart, from another process) by its batch id."""
        batch = Batch.attach(batch_id, client=client)
        if batch.snapshot.backfill is None:
            raise ValueError(f"batch {batch_id} is not a backfill; attach to it with Batch.attach({batch_id!r})")
        return cls(batch)

    @property
    def batch_id(self) -> str:
        return self.batch.batch_id

    def _current(self) -> BatchRecord:
        """The batch as it stands (re-read while it runs)."""
        snapshot = self.batch.snapshot
        return snapshot if snapshot.batch_state in TERMINAL_STATES else self.batch.refresh()

    @property
    def into(self) -> str:
        backfill = self.batch.snapshot.backfill
        assert backfill is not None  # a backfill's batch (checked at attach)
        return backfill.into

    @property
    def rows_total(self) -> int:
        """The rows chosen at create (0: nothing was left to do)."""
        return self.batch.snapshot.rows_total

    @property
    def rows_written(self) -> int:
        """Rows committed to the table so far."""
        backfill = self._current().backfill
        return backfill.rows_written if backfill is not None else 0

    @property
    def rows_skipped(self) -> int:
        """Rows whose call failed with `on_error="skip"` (their `into` stays null; `errors()` says why)."""
        backfill = self._current().backfill
        return backfill.rows_skipped if backfill is not None else 0

    @property
    def state(self) -> str:
        return self.batch.state

    def wait(self, timeout: float | None = None) -> Backfill:
        """Block until the backfill ended (or `timeout` s). Ctrl-C stops waiting, not the backfill."""
        self.batch.wait(timeout)
        return self

    def table(self) -> Any:
        """The table, checked out at its latest version (what the backfill committed is in it)."""
        if self._table is None:
            uri = self.batch.snapshot.backfill.table_uri  # type: ignore[union-attr]  # a backfill's batch
            parent, _, leaf = uri.rstrip("/").rpartition("/")
            if not leaf.endswith(".lance"):
                raise ValueError(
                    f"{uri} is not a LanceDB table's directory (<db>/<name>.lance); open it with lance.dataset(uri)"
                )
            self._table = _lancedb().connect(parent or ".").open_table(leaf[: -len(".lance")])
        elif hasattr(self._table, "checkout_latest"):
            self._table.checkout_latest()
        return self._table

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then the table at its latest version; raises `BatchError` if the backfill failed or was
        cancelled (what was committed stays; `retry_failed()` runs the rest)."""
        snapshot = self.batch.snapshot
        if snapshot.batch_state not in TERMINAL_STATES or snapshot.chunks is None:
            snapshot = self.batch.wait(timeout).snapshot
        if snapshot.batch_state not in TERMINAL_STATES:
            raise TimeoutError(
                f"the backfill of {self.into!r} (batch {self.batch_id}) is still {display_state(snapshot.batch_state)} after {timeout}s"
            )
        if snapshot.batch_state != JobState.DONE:
            self._raise_failure(snapshot)
        return self.table()

    def _raise_failure(self, snapshot: BatchRecord) -> None:
        backfill, failure = snapshot.backfill, snapshot.failure
        head = f"the backfill of {self.into!r} (batch {self.batch_id}, {snapshot.name}@{snapshot.version})"
        written = f"{backfill.rows_written if backfill else 0} of {snapshot.rows_total} rows are written and stay"
        if backfill is not None and backfill.commit_failure:
            raise BatchError(
                f"{head} could not commit its results: {backfill.commit_failure}; {written}. "
                "The table changed under it (compacted or rows deleted): run the same map again to backfill the rest",
                snapshot,
            )
        if failure is not None and failure.phase == "skip_limit":
            raise BatchError(
                f"{head} stopped: {failure.message}; {written}. See backfill.errors() for why rows failed, "
                "fix the function (or raise max_skip_fraction=) and run the same map again",
                snapshot,
            )
        self.batch.raise_failure(snapshot)

    def errors(self) -> list[BackfillError]:
        """Every row the backfill skipped (`on_error="skip"`): its row id, fragment and offset, the
        message and traceback (at your cell's lines), and the version that ran it."""
        found: list[BackfillError] = []
        while True:
            page, total = self.batch.client.backfills.errors(self.batch_id, offset=len(found), limit=_ERRORS_PAGE)
            found.extend(page)
            if not page or len(found) >= total:
                break
        function = self.batch.function
        if function is None:
            return found
        return [
            e.model_copy(update={"traceback": function.map_traceback(e.traceback)}) if e.traceback else e for e in found
        ]

    def retry_failed(self) -> Backfill:
        """Run again only the chunks that did not finish; finished ones are not recomputed."""
        self.batch.retry_failed()
        return self

    def cancel(self) -> bool:
        """Cancel every chunk still pending or running (fragments already committed stay written)."""
        return self.batch.cancel()

    def pause(self) -> bool:
        """No new chunk starts; running chunks finish and their fragments commit. True if this call paused it."""
        return self.batch.pause()

    def resume(self) -> bool:
        """A paused backfill goes on where it stopped. True if this call resumed it."""
        return self.batch.resume()

    # -- display
    def _card(self) -> tuple[str, str]:
        from lancefn_jupyter.kernel.display.batch import SKIPPED_SHOWN, batch_card

        snapshot = self.batch.snapshot
        backfill = snapshot.backfill
        skipped: list[BackfillError] = []
        if backfill is not None and backfill.rows_skipped:
            skipped = self.batch.client.backfills.errors(self.batch_id, limit=SKIPPED_SHOWN)[0]
        return batch_card(snapshot, skipped=skipped)

    def __repr__(self) -> str:
        return self._card()[0]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle = dict(self.batch._repr_mimebundle_(include, exclude))
        bundle["text/plain"], bundle["text/html"] = self._card()
        return bundle
