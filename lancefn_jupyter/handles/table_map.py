"""`f.map(table, column=..., into=...)` over an embedded LanceDB table (docs/ARCHITECTURE.md, "Batches").

    table = lancedb.connect("data/lance").open_table("docs")
    backfill = embed.map(table, column="text", into="embedding", parallel="auto")
    backfill.result()            # the table, with every row's `embedding` written

Reads `column` of the rows whose `into` is still null, runs them as a batch, and writes each chunk's
results back as soon as it finishes (one `merge_insert` commit per chunk), so a stopped backfill
resumes from the rows not yet written.  Rows are matched on `key` (default: `column` itself: a
function of the value gives equal rows equal results, so duplicates are harmless).  A result type
that does not fit an existing `into` column is refused before anything starts.  Without `into`,
it is a plain map over the column's values (a `Batch`).

Needs the optional extra: ``pip install 'lancefn-jupyter[lancedb]'`` (imported only here).
Runs in the kernel; it takes the function as a `FunctionRef` (handles/base.py).
"""

from __future__ import annotations

import threading
from typing import Any

from lancefn_jupyter.handles.base import FunctionRef
from lancefn_jupyter.handles.batch import Batch, BatchChunkError, start_batch
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import JobState

__all__ = ["TableMap", "map_table"]


def _pyarrow() -> Any:
    try:
        import lancedb  # noqa: F401  (the table API this module drives)
        import pyarrow
    except ImportError:
        raise ImportError(
            "mapping over a LanceDB table needs the lancedb extra: pip install 'lancefn-jupyter[lancedb]'"
        ) from None
    return pyarrow


def _column_type(signature_type: str | None) -> Any:
    """The pyarrow type of a LanceDB column holding results of a signature type (a plain one:
    `float64`, `list<float64>`, …; arrays and tables have no column type)."""
    if signature_type is None or dataplane.is_data_type(signature_type):
        raise ValueError(f"results of type {signature_type} cannot be written to a LanceDB column")
    return dataplane.arrow_type(signature_type)


def _fits(result: Any, column: Any) -> bool:
    """Whether values of arrow type `result` can be written to a column of arrow type `column`."""
    pa = _pyarrow()
    types = pa.types
    if result == column:
        return True
    if (types.is_integer(result) or types.is_floating(result)) and (
        types.is_floating(column) or (types.is_integer(result) and types.is_integer(column))
    ):
        return True
    list_like = types.is_list(column) or types.is_large_list(column) or types.is_fixed_size_list(column)
    return types.is_list(result) and list_like and _fits(result.value_type, column.value_type)


def map_table(
    function: FunctionRef,
    table: Any,
    *,
    column: str | None,
    into: str | None,
    key: str | None = None,
    parallel: Any = "auto",
    chunk_size: int | None = None,
    retries: int = 0,
    return_exceptions: bool = False,
    fresh: bool = False,
) -> Any:
    """Check everything (nothing starts on bad input), then start the batch (and the write-back)."""
    pa = _pyarrow()
    if not (hasattr(table, "merge_insert") and hasattr(table, "schema") and hasattr(table, "search")):
        raise TypeError(
            f"map(column=, into=) takes a LanceDB table (lancedb.connect(path).open_table(name)), not {type(table).__name__}"
        )
    if hasattr(table, "checkout_latest"):
        table.checkout_latest()  # another process (a killed backfill) may have written since it was opened
    schema = table.schema
    names = list(schema.names)
    if column is None:
        raise ValueError(f"pass column= the column to read from the table (one of {', '.join(names)})")
    if column not in names:
        raise ValueError(f"the table has no column {column!r}; its columns are {', '.join(names)}")
    inputs = function.signature.inputs
    if len(inputs) != 1:
        raise ValueError(
            f"{function.name} takes {len(inputs)} parameters; mapping a table column needs a function of one parameter (the column's value)"
        )
    param = inputs[0].name

    def start(values: Any) -> Batch:
        """The batch over `values` (the column's Arrow chunks, sent as they are)."""
        return start_batch(
            function,
            None,
            parallel=parallel,
            chunk_size=chunk_size,
            retries=retries,
            return_exceptions=return_exceptions,
            fresh=fresh,
            row_of=lambda value: {param: value},
            column=values,
        )

    if into is None:
        return start(table.search().select([column]).limit(None).to_arrow()[column])
    key = key or column
    if key not in names:
        raise ValueError(
            f"the table has no key column {key!r}; pass key= a column that identifies rows (one of {', '.join(names)})"
        )
    result_type = _column_type(function.signature.output.arrow_type)
    if into in names:
        existing = schema.field(into).type
        if not _fits(result_type, existing):
            raise TypeError(
                f"column {into!r} holds {existing} but {function.name} returns {result_type}; "
                f"write into a new column (another into= name) or change the function's return type"
            )
    elif into == key:
        raise ValueError("into= must differ from the key column")
    query = table.search().select(list(dict.fromkeys([column, key]))).limit(None)
    todo = (query.where(f"`{into}` IS NULL") if into in names else query).to_arrow()
    if todo.num_rows == 0:
        return TableMap(table, into, key, None, [])
    # Everything is checked and the input cut: now the batch starts (the column sent as Arrow chunks), then the new column is added.
    batch = start(todo[column])
    keys = todo[key].combine_chunks()
    if into not in names:
        table.add_columns(pa.field(into, result_type))
    return TableMap(table, into, key, batch, keys, result_type=result_type)


def _count_distinct(values: Any) -> int:
    import pyarrow.compute as pc

    return pc.count_distinct(values, mode="all").as_py()


class TableMap:
    """A backfill of `into`: the batch (`.batch`) plus the kernel thread that writes each finished chunk."""

    def __init__(self, table: Any, into: str, key: str, batch: Batch | None, keys: Any, *, result_type: Any = None):
        self.table, self.into, self.key, self.batch = table, into, key, batch
        self.rows_written = 0
        self.rows_to_write = len(keys)
        self._keys = keys  # an Arrow array (or a list), in the batch's row order
        self._unique = batch is not None and _count_distinct(keys) == len(keys)
        self._type = result_type
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        if batch is not None:
            self._start_writer(batch)

    def _start_writer(self, batch: Batch) -> None:
        self._thread = threading.Thread(
            target=self._write_all, args=(batch,), name=f"lancefn-backfill-{self.into}", daemon=True
        )
        self._thread.start()

    def _write_all(self, batch: Batch) -> None:
        pa = _pyarrow()
        try:
            for chunk, values in batch.chunks_as_completed():
                if isinstance(values, BatchChunkError):
                    continue  # written once retried; `.result()` reports it
                keys = self._keys[chunk.row_start : chunk.row_end]
                if self._unique:  # Arrow slices as they are
                    data = pa.table({self.key: keys, self.into: pa.array(values, type=self._type)})
                else:  # one source row per key (merge_insert refuses ambiguity); equal keys have equal inputs
                    unique = dict(zip(keys.to_pylist(), values, strict=False))
                    data = pa.table(
                        {self.key: list(unique), self.into: pa.array(list(unique.values()), type=self._type)}
                    )
                with self._lock:
                    self.table.merge_insert(self.key).when_matched_update_all().execute(data)  # one commit per chunk
                    self.rows_written += chunk.row_end - chunk.row_start
        except BaseException as error:  # reported by result(); the thread must not die silently
            self._error = error

    def wait(self, timeout: float | None = None) -> TableMap:
        if self._thread is not None:
            self._thread.join(timeout)
        return self

    def result(self, timeout: float | None = None) -> Any:
        """The table once every row's `into` is written; raises BatchError if a chunk failed
        (what finished is written; `retry_failed()` runs the rest)."""
        self.wait(timeout)
        if self._thread is not None and self._thread.is_alive():
            raise TimeoutError(f"the backfill of {self.into!r} is still running after {timeout}s")
        if self._error is not None:
            raise self._error
        if self.batch is not None and self.batch.snapshot.batch_state != JobState.DONE:
            self.batch.raise_failure(self.batch.refresh())
        return self.table

    def retry_failed(self) -> TableMap:
        if self.batch is not None:
            self.wait()
            self.batch.retry_failed()
            self._start_writer(self.batch)
        return self

    def cancel(self) -> bool:
        return self.batch.cancel() if self.batch is not None else False

    def __repr__(self) -> str:
        head = f"Backfill of column {self.into!r}: {self.rows_written}/{self.rows_to_write} rows written"
        return head if self.batch is None else f"{head}\n{self.batch!r}"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        if self.batch is None:
            return {"text/plain": repr(self)}
        bundle = dict(self.batch._repr_mimebundle_(include, exclude))
        bundle["text/plain"] = repr(self)
        return bundle
