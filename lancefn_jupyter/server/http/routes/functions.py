"""``/v1/functions/*``: register, look up, diff, drop and run function versions
(docs/ARCHITECTURE.md, "REST API (v1)")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field
from starlette.requests import Request

from lancefn_jupyter.server.control import dialect
from lancefn_jupyter.server.control.artifact_check import check_artifact, in_process
from lancefn_jupyter.server.control.catalog import Prepared, finish_check
from lancefn_jupyter.server.control.intake import Admitted, JobRequest, RegisterRequest
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import pick, where, who
from lancefn_jupyter.server.http.bodies import (
    INLINE_JSON_BYTES,
    MAX_TIMEOUT_S,
    Body,
    decode_json,
    is_arrow,
    parse,
    parse_query,
    parse_raw,
)
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext, listing
from lancefn_jupyter.server.policy.namespaces import Principal


class NameVersion(Body):
    name: str
    version: str
    namespace: str | None = None  # the admin's pick among namespaces; others may only name their own


class ListFunctions(Body):
    include_definition: bool = False
    name: str | None = None
    page_token: str | None = None
    limit: int = Field(100, ge=1, le=1000)


class History(Body):
    name: str | None = None
    limit: int = Field(20, ge=1, le=1000)
    namespace: str | None = None  # one namespace's history: the caller's own unless the admin names another


class Diff(Body):
    name: str
    old: str | None = None
    new: str | None = None
    namespace: str | None = None


class Run(Body):
    name: str
    version: str
    namespace: str | None = None
    rows: Any = None  # checked against the signature by the control plane
    rows_file: str | None = None  # an Arrow IPC file a local client wrote into $HOME/data/uploads/
    timeout_s: float | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    wait_s: float | None = Field(None, ge=0, le=60)  # hold the reply until the job ends (≤ wait_s)
    init: Any = None  # a class entry's initialization values, checked against the signature by the control plane


def add_routes(router: Router, ctx: RouteContext) -> None:
    catalog, intake = ctx.plane.catalog, ctx.plane.intake

    async def checked(raw: bytes, name: str | None = None) -> Prepared:
        """The registration ``raw`` parsed and validated, its artifact's syntax checked (a large one in a child);
        ``name``: the function's name from the path (LanceDB's route), which the body then does not carry."""
        body = await decode_json(raw)
        if name is not None and isinstance(body, dict):
            body = {**body, "name": name}
        prepared = await off_loop(catalog.prepare, body)
        if not prepared.checked:
            check = await off_loop(check_artifact, prepared.source, prepared.entrypoint, prepared.plain)
            prepared = finish_check(prepared, check)
        return prepared

    async def register(request: Request, namespace: str, name: str | None = None) -> dict:
        caller = who(request)
        raw = await request.body()
        if in_process(raw):  # base64 is larger than its bytes: no artifact here needs a child
            prepared = await checked(raw, name)
        else:
            # A large registration waits for its turn on the loop, holding no thread, keys in turn: then its parsing
            # and its check in a child ("REST details").
            async with ctx.checks.turn(caller):
                prepared = await checked(raw, name)
        job_id, warnings = await intake.submit(RegisterRequest(prepared, namespace, lancedb=name is not None))
        # ``warnings``: the version's environment cannot be honoured here ("Environments"); omitted when none.
        return {"job_id": job_id, "warnings": warnings} if warnings else {"job_id": job_id}

    @router.post("/v1/functions/create", privilege="functions", status_code=202)
    async def create_function(request: Request) -> dict:
        return await register(request, who(request).namespace)

    _add_lancedb_routes(router, ctx, register)

    for path, method, name in (
        ("/v1/functions/describe", catalog.describe, "describe_function"),
        ("/v1/functions/artifact", catalog.artifact, "function_artifact"),
        ("/v1/functions/drop", catalog.drop, "drop_function"),
    ):
        router.post(path, privilege="functions")(_by_name_version(method, name))

    router.post("/v1/functions/list", privilege="functions")(
        listing(ListFunctions, catalog.list_functions, "list_functions")
    )

    @router.post("/v1/functions/history", privilege="functions")
    async def function_history(request: Request) -> dict:
        body = await parse(request, History)
        return await off_loop(catalog.history, body.name, body.limit, **pick(request, body.namespace))

    @router.post("/v1/functions/diff", privilege="functions")
    async def function_diff(request: Request) -> dict:
        body = await parse(request, Diff)
        return await off_loop(catalog.diff, body.name, body.old, body.new, **pick(request, body.namespace))

    async def run_function(caller: Principal, raw: bytes) -> dict:
        body = await parse_raw(raw, Run)
        request = JobRequest(
            body.name,
            body.version,
            where(caller, body.namespace),
            rows=body.rows,
            arrow_rows=None if body.rows_file is None else ctx.bodies.upload(body.rows_file),
            timeout_s=body.timeout_s,
            wait_s=body.wait_s,
            small=len(raw) <= INLINE_JSON_BYTES,
            init=body.init,
        )
        return _answer(await intake.submit(request), body.wait_s)

    async def run_any(request: Request) -> dict:
        """The router's route: Arrow bodies, which the guard does not buffer (it serves JSON ones)."""
        if not is_arrow(request.headers.get("content-type")):
            return await run_function(who(request), await request.body())
        return await _run_arrow(request)

    ctx.fastpath.post(router, "/v1/functions/run", "functions", run_function, status_code=202, route=run_any)

    async def _run_arrow(request: Request) -> dict:
        """Rows as an Arrow IPC stream body; name, version, timeout_s in the query string."""
        query = request.query_params
        fields = {k: query.get(k) for k in ("name", "version", "namespace")}
        params = parse_query(Run, {**fields, "rows": None}, "an Arrow run", query, ("timeout_s", "wait_s"))
        async with ctx.bodies.arrow_body(request) as rows_file:
            admitted = await intake.submit(
                JobRequest(
                    params.name,
                    params.version,
                    pick(request, params.namespace),
                    arrow_rows=rows_file,
                    timeout_s=params.timeout_s,
                    wait_s=params.wait_s,
                )
            )
        return _answer(admitted, params.wait_s)


def _answer(admitted: Admitted, wait_s: float | None) -> dict:
    """A run's reply; with ``wait_s``, the job as the wait left it (a quick job's result: no jobs/wait)."""
    return {"job_id": admitted.job_id} if wait_s is None else {"job_id": admitted.job_id, "job": admitted.job}


def _by_name_version(method: Callable[..., dict], name: str) -> Callable[[Request], Awaitable[dict]]:
    """A route (``name``) doing ``method`` to the function version a ``NameVersion`` body names."""

    async def route(request: Request) -> dict:
        body = await parse(request, NameVersion)
        return await off_loop(method, body.name, body.version, **pick(request, body.namespace))

    route.__name__ = name
    return route


# ----------------------------------------------------------------- LanceDB 0.40 dialect


class LanceVersion(Body):
    version: str


def _add_lancedb_routes(
    router: Router, ctx: RouteContext, register: Callable[[Request, str, str], Awaitable[dict]]
) -> None:
    """LanceDB 0.40's function routes (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): ``{id}`` is the name, its
    namespace path ``$``-joined in front; the root is the key's own namespace."""
    catalog = ctx.plane.catalog

    @router.post("/v1/function/{id}/create", privilege="functions", status_code=202)
    async def lancedb_create_function(request: Request) -> dict:
        namespace, name = _function_id(request)
        return await register(request, namespace, name)

    @router.post("/v1/function/{id}/describe", privilege="functions")
    async def lancedb_describe_function(request: Request) -> dict:
        namespace, name = _function_id(request)
        body = await parse(request, LanceVersion)
        return await off_loop(catalog.lancedb_describe, name, body.version, namespace)

    @router.post("/v1/function/{id}/drop", privilege="functions")
    async def lancedb_drop_function(request: Request) -> dict:
        namespace, name = _function_id(request)
        body = await parse(request, LanceVersion)
        return await off_loop(catalog.lancedb_drop, name, body.version, namespace)

    @router.get(
        "/v1/namespace/{ns}/function/list",
        privilege="functions",
        query=(("include_definition", False), ("page_token", False), ("limit", False)),
    )
    async def lancedb_list_functions(request: Request) -> dict:
        namespace = lancedb_namespace(request, dialect.namespace_path_of(request.path_params["ns"]))
        query = request.query_params
        params = parse_query(
            LanceList,
            {"page_token": query.get("page_token")},
            "a function list",
            query,
            ("include_definition", "limit"),
        )
        return await off_loop(
            catalog.lancedb_list, namespace, params.include_definition, params.page_token, params.limit
        )


class LanceList(Body):
    include_definition: bool = False
    page_token: str | None = None
    limit: int = Field(100, ge=1, le=1000)


def lancedb_namespace(request: Request, path: tuple[str, ...]) -> str:
    """The namespace a LanceDB namespace path means for the caller; another team's answers as a missing one."""
    caller = who(request)
    namespace = dialect.namespace_of(path, caller.namespace, caller.scope)
    if namespace is None:
        raise ApiError(
            404,
            f"namespace {'$'.join(path)!r} not found; leave namespace_path out for this API key's own namespace "
            f"({caller.namespace!r})",
        )
    return namespace


def _function_id(request: Request) -> tuple[str, str]:
    path, name = dialect.split_id(request.path_params["id"])
    return lancedb_namespace(request, path), name
