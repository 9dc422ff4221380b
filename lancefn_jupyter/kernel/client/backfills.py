"""`/v1/backfills/*`: create a backfill of a table column, and page through the rows it skipped
(docs/ARCHITECTURE.md, "Backfills"). A backfill is a batch: describe, wait, cancel and retry go through
`/v1/batches/*` (client/batches.py)."""

from __future__ import annotations

from typing import Any

from lancefn_jupyter.kernel.client._http import Transport
from lancefn_jupyter.wire.batch_models import BackfillError

__all__ = ["BackfillsResource"]


class BackfillsResource:
    def __init__(self, transport: Transport):
        self._t = transport

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """`{batch_id, rows_total, chunks_total, table_version}`; `body` as in the contract's REST table
        (`name, version, table_uri, columns, into`, and the options)."""
        return self._t.post("/v1/backfills/create", body)

    def errors(self, batch_id: str, *, offset: int = 0, limit: int = 1000) -> tuple[list[BackfillError], int]:
        """One page of the rows the backfill skipped, and how many it skipped in all."""
        reply = self._t.post("/v1/backfills/errors", {"batch_id": batch_id, "offset": offset, "limit": limit})
        return [BackfillError.from_wire(item) for item in reply["errors"]], int(reply["total"])
