"""Call arguments as the rows a job carries: JSON for small plain rows, else an Arrow table
(docs/ARCHITECTURE.md, "Arrow data plane"). Used by `GpuFunction` (submit, map, local) and batches."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import plain_json

__all__ = ["rows_payload", "to_json_value"]


def to_json_value(value: Any, where: str) -> Any:
    """Arguments travel as JSON; numpy values are converted, anything else is refused up front."""
    if hasattr(value, "tolist") and callable(value.tolist):
        value = value.tolist()
    if plain_json(value):  # the common case, without encoding it (the request encodes it once)
        return value
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"argument {where} cannot be sent to a GPU function job ({error}); pass JSON values "
            "(numbers, strings, bools, None, lists and dicts of them)"
        ) from None
    return value


def rows_payload(
    rows: list[dict[str, Any]], signature: Any, name: str, defaults: Mapping[str, Any] | None = None
) -> tuple[list[dict[str, Any]] | None, Any]:
    """(JSON rows, None) or (None, Arrow table of the rows): Arrow when a parameter or the return
    is an array / Arrow type, or a value JSON cannot carry (NaN, ±Inf); JSON for small plain rows."""
    types = {p.name: p.arrow_type for p in signature.inputs}
    if [p.form for p in signature.inputs] == ["record_batch"]:  # the rows are the columns ("Batched functions")
        import pyarrow as pa

        (param,) = types
        try:
            return None, dataplane.batch_rows(
                {param: pa.Table.from_pylist(rows)}, types, {param: "record_batch"}, name=name
            )
        except (dataplane.DataPlaneError, pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise TypeError(f"{name}(): {error}") from None
    if not dataplane.uses_data_plane(types.values(), signature.output.arrow_type):
        try:
            return [{k: to_json_value(v, f"{k!r} of {name}") for k, v in row.items()} for row in rows], None
        except TypeError as json_error:
            try:
                return None, dataplane.encode_rows(rows, types, name=name, defaults=defaults)
            except (dataplane.DataPlaneError, ImportError):
                raise json_error from None
    try:
        return None, dataplane.encode_rows(rows, types, name=name, defaults=defaults)
    except dataplane.DataPlaneError as error:
        raise TypeError(f"{name}(): {error}") from None
