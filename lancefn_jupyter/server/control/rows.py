"""The checks a run's input rows pass before a job is queued: JSON rows against the function's
signature, or an Arrow IPC rows file checked and kept under its final name (docs/ARCHITECTURE.md,
"Arrow data plane").  Runs in the control plane, on core threads."""

from __future__ import annotations

import os
from typing import Any

from lancefn_jupyter.server.encoding import checked_json
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.storage.files import DataStore
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import FunctionVersion


def check_init(fv: FunctionVersion, init: Any) -> dict[str, Any] | None:
    """A run's initialization values (a class entry's ``__init__`` arguments, LanceDB 0.40's
    ``signature.initialization``) checked against ``fv``: the values to keep in its jobs' spec, None for a version
    without initialization; a 400 naming what is missing, unknown or wrongly given."""
    fields = fv.signature.initialization
    if not fields:
        if init:
            raise ApiError(400, f"{fv.name}@{fv.version} takes no initialization values; leave init out")
        return None
    if init is None:
        init = {}
    if not isinstance(init, dict):
        raise ApiError(400, "init must be an object mapping initialization names to values, e.g. {'factor': 2.0}")
    names = [f.name for f in fields]
    takes = ", ".join(f"{f.name}{'?' if f.nullable else ''}" for f in fields)
    missing = [f.name for f in fields if not f.nullable and f.name not in init]
    unknown = sorted(set(init) - set(names))
    if missing or unknown:
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unknown {', '.join(unknown)}"] if unknown else []
        raise ApiError(
            400,
            f"init: {' and '.join(problems)}; {fv.name}@{fv.version} is created with ({takes}), "
            "e.g. init={" + ", ".join(f"{n!r}: ..." for n in names) + "}",
        )
    return {name: init[name] for name in names if name in init}


def init_of_binding(initialization: str) -> dict[str, Any]:
    """A LanceDB 0.40 binding's ``initialization`` (a base64 one-row Arrow IPC stream, its columns the values) as
    init values; a 400 saying what it must be otherwise."""
    import base64
    import binascii
    import json

    import pyarrow as pa

    shape = "initialization must be a base64 Arrow IPC stream of one row, a column per initialization value"
    try:
        table = pa.ipc.open_stream(base64.b64decode(initialization, validate=True)).read_all()
    except (binascii.Error, ValueError, pa.ArrowException):
        raise ApiError(400, f"{shape}; it is not one (or give init={{...}} as JSON instead)") from None
    if table.num_rows != 1:
        raise ApiError(400, f"{shape}; it has {table.num_rows} rows")
    values = table.to_pylist()[0]
    try:
        json.dumps(values, allow_nan=False)
    except (TypeError, ValueError):
        raise ApiError(400, f"{shape} of JSON values (numbers, text, booleans, lists, structs)") from None
    return values


def check_rows(fv: FunctionVersion, rows: Any) -> None:
    """JSON ``rows`` fit ``fv``'s signature: a 400 naming the row and the parameters otherwise."""
    if not isinstance(rows, list) or not rows:
        raise ApiError(400, "rows must be a non-empty list of objects, one {param: value} object per call")
    expected = [p.name for p in fv.signature.inputs]
    if [p.arrow_type for p in fv.signature.inputs] == [dataplane.RECORD_BATCH_TYPE]:
        # A RecordBatch function's rows are its columns, any names ("Batched functions").
        expected = sorted({key for row in rows if isinstance(row, dict) for key in row})
    wanted = set(expected)
    optional = {p.name for p in fv.signature.inputs if p.default is not None}  # the worker applies the default
    takes = [p.name if p.default is None else f"{p.name}={p.default}" for p in fv.signature.inputs]
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ApiError(
                400,
                f"rows[{i}] must be an object mapping parameter names to values, e.g. {{{', '.join(repr(n) + ': ...' for n in expected)}}}",
            )
        keys = set(row)
        missing = [n for n in expected if n not in keys and n not in optional]
        unknown = sorted(keys - wanted)
        if missing or unknown:
            problems = []
            if missing:
                problems.append(f"missing parameter(s) {', '.join(missing)}")
            if unknown:
                problems.append(f"unknown parameter(s) {', '.join(unknown)}")
            raise ApiError(
                400,
                f"rows[{i}]: {' and '.join(problems)}; {fv.name}@{fv.version} takes ({', '.join(takes)})",
            )
        try:
            checked_json(row).encode("utf-8")
        except ValueError:
            raise ApiError(
                400, f"rows[{i}] contains NaN or Infinity, which JSON cannot carry; use null or a finite number"
            ) from None


def take_arrow_rows(data: DataStore, fv: FunctionVersion, tmp: Any) -> dict:
    """Check an Arrow rows body (a temp file) and keep it under its final name; the rows ref
    stored in place of JSON rows: ``{"arrow_file": "rows/<uuid>.arrow", "rows_total": n}``."""
    tmp = os.fspath(tmp)
    _, final = data.new_rows_file()
    try:
        count = data.check_rows(tmp, fv.signature.inputs, f"{fv.name}@{fv.version}")
        os.replace(tmp, final)
    except ValueError as error:
        raise ApiError(400, str(error)) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"arrow_file": os.path.relpath(final, data.root), "rows_total": count}
