"""LanceDB 0.40's secret routes: ``/v1/secret/{id}/create|alter|describe|drop`` and
``GET /v1/namespace/{ns}/secret/list`` (docs/ARCHITECTURE.md, "Secrets"). ``{id}`` is the name, its namespace path
``$``-joined in front; the root is the key's own namespace. No reply carries a value but ``/v1/secrets/local_env``'s,
to a key of the secrets' own namespace, for the kernel's ``.local()``."""

from __future__ import annotations

from pydantic import Field
from starlette.requests import Request

from lancefn_jupyter.server.control import dialect
from lancefn_jupyter.server.control.offload import off_loop
from lancefn_jupyter.server.errors import ApiError
from lancefn_jupyter.server.http.auth import who
from lancefn_jupyter.server.http.bodies import Body, parse, parse_query, parse_raw
from lancefn_jupyter.server.http.router import Router
from lancefn_jupyter.server.http.routes.context import RouteContext
from lancefn_jupyter.server.http.routes.functions import lancedb_namespace
from lancefn_jupyter.wire.models import SecretBinding


class NoFields(Body):
    """The body of ``describe`` and ``drop``: none, or a JSON object (its fields are not read)."""


async def no_fields(request: Request) -> None:
    """A body sent with ``describe`` / ``drop`` must still be JSON (a 400 says what is wrong); none at all is fine."""
    raw = await request.body()
    if raw.strip():
        await parse_raw(raw, NoFields)


class SecretValue(Body):
    value: object = None  # checked by the vault: a non-empty string


class LocalEnv(Body):
    secret_bindings: list[SecretBinding] = Field(max_length=64)


class SecretList(Body):
    page_token: str | None = None
    limit: int = Field(100, ge=1, le=1000)


def add_routes(router: Router, ctx: RouteContext) -> None:
    vault = ctx.plane.secrets

    def secret_id(request: Request) -> tuple[str, str]:
        path, name = dialect.split_id(request.path_params["id"])
        return lancedb_namespace(request, path), name

    @router.post("/v1/secret/{id}/create", privilege="functions")
    async def create_secret(request: Request) -> dict:
        namespace, name = secret_id(request)
        body = await parse(request, SecretValue)
        return await off_loop(vault.create, namespace, name, body.value)

    @router.post("/v1/secret/{id}/alter", privilege="functions")
    async def alter_secret(request: Request) -> dict:
        namespace, name = secret_id(request)
        body = await parse(request, SecretValue)
        return await off_loop(vault.alter, namespace, name, body.value)

    @router.post("/v1/secret/{id}/describe", privilege="functions")
    async def describe_secret(request: Request) -> dict:
        namespace, name = secret_id(request)
        await no_fields(request)
        return vault.describe(namespace, name)

    @router.post("/v1/secret/{id}/drop", privilege="functions")
    async def drop_secret(request: Request) -> dict:
        namespace, name = secret_id(request)
        await no_fields(request)
        return await off_loop(vault.drop, namespace, name)

    @router.post("/v1/secrets/local_env", privilege="functions")
    async def local_env(request: Request) -> dict:
        """The one reply with values: a version's bound secrets of the key's own namespace as ``{env: {VARIABLE:
        value}}``, for the kernel's ``.local()`` run of it (docs/ARCHITECTURE.md, "Secrets")."""
        caller = who(request)
        if not caller.admin and "jobs" not in caller.privileges:
            # values only to a key that could read them anyway: one that registers and runs the namespace's functions
            raise ApiError(403, "reading bound secrets for .local() needs a key with the 'jobs' privilege too")
        body = await parse(request, LocalEnv)
        return {"env": vault.local_env(caller.namespace, tuple(body.secret_bindings))}

    @router.get(
        "/v1/namespace/{ns}/secret/list", privilege="functions", query=(("page_token", False), ("limit", False))
    )
    async def list_secrets(request: Request) -> dict:
        namespace = lancedb_namespace(request, dialect.namespace_path_of(request.path_params["ns"]))
        query = request.query_params
        params = parse_query(SecretList, {"page_token": query.get("page_token")}, "a secret list", query, ("limit",))
        return vault.list(namespace, params.page_token, params.limit)
