"""`/v1/functions/*`: register, describe, list, drop and run function versions."""

from __future__ import annotations

import base64
import builtins  # the resources have a list() method that shadows the type in annotations
import json
import warnings
from collections.abc import Iterator
from typing import Any

from lancefn_jupyter.kernel.client._http import ARROW_STREAM, Transport
from lancefn_jupyter.kernel.client.errors import ApiError, LancefnEnvironmentWarning
from lancefn_jupyter.kernel.client.jobs import JobsResource
from lancefn_jupyter.wire.models import FunctionRegistrationRequest, FunctionVersion, Job, JobState

__all__ = ["FunctionListing", "FunctionsResource"]


class FunctionListing:
    """One row of `functions/list`: name, version and (when asked) the full definition."""

    __slots__ = ("definition", "name", "version")

    def __init__(self, name: str, version: str, definition: FunctionVersion | None):
        self.name, self.version, self.definition = name, version, definition

    def __repr__(self) -> str:
        return f"FunctionListing({self.name!r}, {self.version!r})"


class FunctionsResource:
    def __init__(self, transport: Transport, jobs: JobsResource):
        self._t = transport
        self._jobs = jobs

    def create(self, request: FunctionRegistrationRequest) -> str:
        """Submit a registration; returns the `create_function` job id (202). The reply's ``warnings`` (why the
        control plane cannot honour the version's environment) are raised as :class:`LancefnEnvironmentWarning`."""
        reply = self._t.post("/v1/functions/create", request.to_wire())
        for text in reply.get("warnings") or ():
            warnings.warn(LancefnEnvironmentWarning(f"{request.name}: {text}"), stacklevel=3)
        return reply["job_id"]

    def register(self, request: FunctionRegistrationRequest, *, timeout: float = 60.0) -> FunctionVersion:
        """Create and wait for the registration job; returns the immutable version. Environment warnings: as in
        :meth:`create`."""
        job = self._jobs.wait(self.create(request), timeout=timeout)
        if job.job_state != JobState.DONE:
            message = job.failure.message if job.failure else f"registration ended {job.job_state.value}"
            raise ApiError(400, "registration_failed", message, None)
        return FunctionVersion.from_wire(job.result)

    def describe(self, name: str, version: str) -> FunctionVersion:
        return FunctionVersion.from_wire(self._t.post("/v1/functions/describe", {"name": name, "version": version}))

    def list(self, name: str | None = None, *, include_definition: bool = False) -> Iterator[FunctionListing]:
        """All versions (following page tokens), optionally of one function name."""
        body: dict[str, Any] = {"include_definition": include_definition}
        if name is not None:
            body["name"] = name
        while True:
            page = self._t.post("/v1/functions/list", body)
            for item in page["functions"]:
                definition = item.get("definition")
                yield FunctionListing(
                    item["name"], item["version"], FunctionVersion.from_wire(definition) if definition else None
                )
            token = page.get("page_token")
            if not token:
                return
            body["page_token"] = token

    def artifact(self, name: str, version: str) -> bytes:
        """The version's artifact source bytes (`POST /v1/functions/artifact`)."""
        reply = self._t.post("/v1/functions/artifact", {"name": name, "version": version})
        return base64.b64decode(reply["data"])

    def history(self, name: str | None = None, *, limit: int = 20) -> builtins.list[dict[str, Any]]:
        """`POST /v1/functions/history`: per function, its newest versions with their one-line change."""
        body: dict[str, Any] = {"limit": limit, **({"name": name} if name is not None else {})}
        return self._t.post("/v1/functions/history", body)["functions"]

    def drop(self, name: str, version: str) -> bool:
        return bool(self._t.post("/v1/functions/drop", {"name": name, "version": version})["dropped"])

    def run(
        self,
        name: str,
        version: str,
        rows: builtins.list[dict[str, Any]] | None,
        *,
        timeout_s: float | None = None,
        arrow: bytes | None = None,
        rows_file: str | None = None,
        init: dict[str, Any] | None = None,
    ) -> str:
        """Submit a `run_function` job with one row per call; returns the job id (202).

        ``arrow``: the rows as an Arrow IPC stream (``dataplane.encode_rows`` + ``to_ipc_bytes``),
        sent as ``application/vnd.apache.arrow.stream`` instead of JSON ``rows``. ``rows_file``: the
        name of an Arrow IPC file already written into the server's ``$HOME/data/uploads/`` (a
        client on the server's machine: no bytes over HTTP)."""
        if arrow is not None:
            params: dict[str, Any] = {"name": name, "version": version}
            if timeout_s is not None:
                params["timeout_s"] = timeout_s
            if init is not None:
                params["init"] = json.dumps(init)
            return self._t.request(
                "POST", "/v1/functions/run", content=arrow, content_type=ARROW_STREAM, params=params
            )["job_id"]
        body: dict[str, Any] = {"name": name, "version": version}
        if rows_file is not None:
            body["rows_file"] = rows_file
        else:
            body["rows"] = rows
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if init is not None:
            body["init"] = init
        return self._t.post("/v1/functions/run", body)["job_id"]

    def run_job(
        self,
        name: str,
        version: str,
        rows: builtins.list[dict[str, Any]],
        *,
        timeout_s: float | None = None,
        wait_s: float = 0.0,
        init: dict[str, Any] | None = None,
    ) -> Job:
        """Submit a `run_function` job and return it as it stands after up to `wait_s` seconds
        (finished, for a quick job: its result comes in this one round trip)."""
        body: dict[str, Any] = {"name": name, "version": version, "rows": rows, "wait_s": wait_s}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        if init is not None:
            body["init"] = init
        return Job.from_wire(self._t.post("/v1/functions/run", body, timeout=wait_s + 10.0)["job"])
