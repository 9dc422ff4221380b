"""`/v1/batches/*`: create, describe, list, cancel, retry and (long-poll) wait."""

from __future__ import annotations

import json
import time
from typing import Any

from lancefn_jupyter.kernel.client._http import ARROW_STREAM, Transport
from lancefn_jupyter.wire.batch_models import Batch
from lancefn_jupyter.wire.models import TERMINAL_STATES

__all__ = ["BatchesResource"]

_MAX_WAIT_S = 30.0


class BatchesResource:
    def __init__(self, transport: Transport):
        self._t = transport

    def create(
        self,
        name: str,
        version: str,
        chunks: list[list[dict[str, Any]]] | None,
        *,
        parallel: int | None = None,
        retries: int = 0,
        fresh: bool = False,
        timeout_s: float | None = None,
        arrow: bytes | None = None,
        rows_file: str | None = None,
        init: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`{batch_id, reused_chunks}`; `parallel=None` is "auto"; `init`: a class entry's initialization values.

        ``arrow``: the chunks as one Arrow IPC stream, one record batch per chunk (sent as
        ``application/vnd.apache.arrow.stream``, the other fields in the query string) instead of
        JSON ``chunks``; ``rows_file``: such a stream already written into the server's
        ``$HOME/data/uploads/`` (a client on the server's machine)."""
        body: dict[str, Any] = {"name": name, "version": version, "retries": retries, "fresh": fresh}
        if parallel is not None:
            body["parallel"] = parallel
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if init is not None:
            body["init"] = init
        if arrow is not None:
            params = {k: v if k in ("name", "version") else json.dumps(v) for k, v in body.items()}
            return self._t.request(
                "POST", "/v1/batches/create", content=arrow, content_type=ARROW_STREAM, params=params
            )
        if rows_file is not None:
            body["rows_file"] = rows_file
        else:
            body["chunks"] = chunks
        return self._t.post("/v1/batches/create", body)

    def describe(self, batch_id: str, *, include_chunks: bool = True) -> Batch:
        return Batch.from_wire(
            self._t.post("/v1/batches/describe", {"batch_id": batch_id, "include_chunks": include_chunks})
        )

    def list(self, *, state: str | None = None, name: str | None = None, limit: int | None = None) -> list[Batch]:
        body = {k: v for k, v in (("state", state), ("name", name), ("limit", limit)) if v is not None}
        return [Batch.from_wire(item) for item in self._t.post("/v1/batches/list", body)["batches"]]

    def cancel(self, batch_id: str) -> bool:
        return bool(self._t.post("/v1/batches/cancel", {"batch_id": batch_id})["cancelled"])

    def pause(self, batch_id: str) -> bool:
        """True if this call paused the batch (False: it was paused already)."""
        return bool(self._t.post("/v1/batches/pause", {"batch_id": batch_id})["paused"])

    def resume(self, batch_id: str) -> bool:
        """True if this call resumed the batch (False: it was not paused)."""
        return bool(self._t.post("/v1/batches/resume", {"batch_id": batch_id})["resumed"])

    def retry(self, batch_id: str) -> Batch:
        return Batch.from_wire(self._t.post("/v1/batches/retry", {"batch_id": batch_id}))

    def wait(self, batch_id: str, *, timeout: float | None = None, revision: int | None = None) -> Batch:
        """The batch once terminal (or newer than `revision`), or as it stands after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _MAX_WAIT_S if deadline is None else max(0.0, min(_MAX_WAIT_S, deadline - time.monotonic()))
            body: dict[str, Any] = {"batch_id": batch_id, "timeout_s": left}
            if revision is not None:
                body["revision"] = revision
            batch = Batch.from_wire(self._t.post("/v1/batches/wait", body, timeout=left + 10.0))
            if (
                batch.batch_state in TERMINAL_STATES
                or (revision is not None and batch.revision > revision)
                or (deadline is not None and time.monotonic() >= deadline)
            ):
                return batch
