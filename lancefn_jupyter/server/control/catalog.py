"""The function catalog: register, describe, list, history, diff and drop function versions,
and the one rule for which namespace's version a request means (docs/ARCHITECTURE.md,
"Namespaces").  Runs in the control plane, under the job table's lock where it writes; a
registration is recorded as a DONE ``create_function`` job through the journal."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict, Unpack

from pydantic import ValidationError

from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.environments.requirements import pip_problem
from lancefn_jupyter.server.control import dialect
from lancefn_jupyter.server.control.artifact_check import Checked, check_artifact, in_process
from lancefn_jupyter.server.control.jobtable import TableLock
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.pages import clamp_limit, decode_token, encode_token
from lancefn_jupyter.server.control.states import DONE, now_ms
from lancefn_jupyter.server.control.vault import SecretVault
from lancefn_jupyter.server.errors import ApiError, format_validation_error
from lancefn_jupyter.server.executors.base import REDACTED
from lancefn_jupyter.server.policy.gpu_classes import GpuClassConfig
from lancefn_jupyter.server.policy.namespaces import DEFAULT_NAMESPACE, visible
from lancefn_jupyter.server.policy.resources import request_problem, resource_request
from lancefn_jupyter.server.storage.store import JobRecord, Store, VersionRow
from lancefn_jupyter.wire.bundles import ENTRY_FILE, bundle_files, bundle_problem
from lancefn_jupyter.wire.models import (
    FunctionRegistrationRequest,
    FunctionResourceRequirements,
    FunctionSignature,
    FunctionVersion,
    decode_artifact,
    derive_version,
    environment_digest,
    rfc3339_now,
    version_id,
)
from lancefn_jupyter.wire.setup_part import setup_part

DEFAULT_MAX_ARTIFACT_BYTES = 4 * 1024 * 1024  # --max-artifact-bytes
_SETUP_DIGESTS_KEPT = 4096  # versions whose setup digest is remembered


class Where(TypedDict, total=False):
    """Which namespace's version a request means (``http.auth.pick``): the namespace it names,
    the caller's ``scope`` (None: the admin sees every namespace) and its own namespace ``home``."""

    namespace: str | None
    scope: str | None
    home: str


class Registration(NamedTuple):
    """A registration's reply: the (already DONE) ``create_function`` job, and warnings about the version
    (``POST /v1/functions/create``'s ``warnings``: why this server cannot honour its environment)."""

    job_id: str
    warnings: list[str]


class Prepared(NamedTuple):
    """A registration request checked but for a large artifact's syntax (``checked`` False: parse it in a child,
    ``artifact_check``, then :func:`finish_check`), and not yet recorded. ``source``: the entry's Python source (the
    artifact, or a bundle's ``user_function.py``)."""

    request: FunctionRegistrationRequest
    artifact: bytes
    checked: bool
    source: bytes

    @property
    def entrypoint(self) -> str:
        return self.request.artifact.entrypoint

    @property
    def plain(self) -> tuple[str, ...]:
        """A per-row signature's parameters (and ``"return"``) of plain Arrow types: annotated as pyarrow batches in
        the source, they make a LanceDB batch UDF (``artifact_check``, ``dialect.batch_udf``)."""
        return plain_typed(self.request.signature)


def plain_typed(signature: FunctionSignature) -> tuple[str, ...]:
    """See :attr:`Prepared.plain`: empty for a batched signature."""
    if signature.batched:
        return ()
    typed = [(p.name, p.arrow_type) for p in signature.inputs] + [("return", signature.output.arrow_type or "")]
    return tuple(name for name, arrow_type in typed if not arrow_type.startswith("arrow."))


def finish_check(prepared: Prepared, check: Checked) -> Prepared:
    """``prepared`` once its entry's source is checked: a 400 naming the problem, or the request as it runs (a
    LanceDB batch UDF's signature made batched: ``dialect.batch_udf``)."""
    if check.problem:
        raise ApiError(400, check.problem)
    request = prepared.request
    if check.arrow:
        signature = dialect.batch_udf(request.signature, check.arrow)
        if isinstance(signature, str):
            raise ApiError(400, f"artifact.entrypoint {request.artifact.entrypoint!r}: {signature}")
        request = request.model_copy(update={"signature": signature})
    return prepared._replace(request=request, checked=True)


def unsupported_fields(request: FunctionRegistrationRequest) -> str | None:
    """Why a registration using a field this server cannot honour is refused (docs/ARCHITECTURE.md, "LanceDB 0.40
    dialect": nothing accepted is dropped), or None."""
    output = request.signature.output
    if output.kind == "scalar" and not output.fields:
        return None
    if output.kind == "named_struct" and output.fields and output.arrow_type is None:
        names = [field.name for field in output.fields]
        twice = sorted({name for name in names if names.count(name) > 1})
        return (
            f"signature.output.fields name {twice[0]!r} more than once; give each field its own name" if twice else None
        )
    return (
        f"signature.output.kind {output.kind!r} with {'fields' if output.fields else 'no fields'} is not supported by "
        "this server; return one value (output kind 'scalar', e.g. {'kind': 'scalar', 'arrow_type': 'float64', "
        "'nullable': False}) or a dict (kind 'named_struct' with its fields and no arrow_type)"
    )


@dataclass(frozen=True)
class Placement:
    """Where a function version's jobs run."""

    gpu_class: str | None
    num_gpus: int
    simulated: bool


def redact_definition(definition: dict) -> dict:
    """A FunctionVersion as replies show it: ``runtime.env`` values (often tokens or passwords)
    replaced by ``<redacted>``, names kept.  The stored definition keeps the values for the
    executor, and ``runtime_digest`` still covers them, so changing a value gives a new version."""
    runtime = definition.get("runtime")
    if not isinstance(runtime, dict) or not runtime.get("env"):
        return definition
    return {**definition, "runtime": {**runtime, "env": {name: REDACTED for name in runtime["env"]}}}


@functools.lru_cache(maxsize=256)
def stored_definition(definition: str) -> dict:
    """A stored definition's JSON, decoded once per version for launching its jobs; read it, never change it."""
    return json.loads(definition)


@functools.lru_cache(maxsize=256)
def stored_version(definition: str) -> FunctionVersion:
    """A stored definition parsed once (its text never changes): each run and launch of a version reuses it."""
    return FunctionVersion.from_wire(json.loads(definition))


class FunctionCatalog:
    max_artifact_bytes = DEFAULT_MAX_ARTIFACT_BYTES  # --max-artifact-bytes, set by create_app

    def __init__(
        self,
        *,
        store: Store,
        classes: GpuClassConfig,
        lock: TableLock,
        journal: JobJournal,
        environment_check: Callable[[EnvironmentRequest], str | None] | None = None,
        digest_key: bytes | None = None,
        allow_direct_references: bool = True,
        secrets: SecretVault | None = None,
    ):
        self.store, self.classes, self.lock, self.journal = store, classes, lock, journal
        # Each namespace's secrets (docs/ARCHITECTURE.md, "Secrets"): a version's bindings must name existing ones.
        self.secrets = secrets or SecretVault(store)
        # Whether pip entries ``NAME @ URL`` are accepted (docs/ARCHITECTURE.md, "Environments"): a server of one
        # namespace, or --allow-direct-references.
        self.allow_direct_references = allow_direct_references
        # The server's secret that env values are keyed with in version ids and runtime digests (docs/ARCHITECTURE.md,
        # "Function versions"); None: unkeyed.
        self.digest_key = digest_key
        # The executor's refusal of a version's environment (docs/ARCHITECTURE.md, "Environments"), or None.
        self.environment_check = environment_check
        # (namespace, name, version) → its setup digest: derived from the stored version, never part of its id
        # (docs/ARCHITECTURE.md, "Setup reuse"); parsed once per version, not per job.
        self._setup_digests: dict[tuple[str, str, str], str | None] = {}

    def setup_digest(self, namespace: str, name: str, version: FunctionVersion, artifact: bytes) -> str | None:
        """The digest of the version's setup part with what else its setup depends on (its runtime: environment,
        env, resources, state; its namespace and name), or None when its workers are never reused for another
        version (``state=per_job``, ``reuse_setup=no``, a source that does not parse)."""
        key = (namespace, name, version.version)
        if key in self._setup_digests:
            return self._setup_digests[key]
        digest = None
        runtime = version.runtime
        # A bundle's other modules are no part of its entry's setup part: its workers are never reused.
        if runtime.state != "per_job" and runtime.reuse_setup != "no" and version.artifact.kind != "python_bundle":
            try:
                part = setup_part(artifact.decode("utf-8"), version.artifact.entrypoint)
            except UnicodeDecodeError:
                part = None
            if part is not None:
                text = "\0".join((namespace, name, part.digest, runtime.to_canonical_json())).encode()
                key_bytes = self.digest_key or b""
                digest = hmac.new(key_bytes, text, hashlib.sha256).hexdigest()  # env values are in it: keyed
        if len(self._setup_digests) >= _SETUP_DIGESTS_KEPT:
            self._setup_digests.clear()  # recomputed on demand: a parse per version
        self._setup_digests[key] = digest
        return digest

    # ----------------------------------------------------------------- requests

    def register(self, body: Any, namespace: str = DEFAULT_NAMESPACE) -> Registration:
        """Validate and record a function version in ``namespace``; returns the (already DONE) job's id and
        the warnings about it (the executor cannot honour its environment: its jobs will fail).  A large artifact
        is parsed in a child here and now; the server's route takes a turn at the children first
        (:meth:`prepare`, ``artifact_check.CheckTurns``, :meth:`record`)."""
        prepared = self.prepare(body)
        if not prepared.checked:
            prepared = finish_check(prepared, check_artifact(prepared.source, prepared.entrypoint, prepared.plain))
        return self.record(prepared, namespace)

    def prepare(self, body: Any) -> Prepared:
        """A registration request validated and its artifact decoded, a small one's syntax checked; a 4xx names
        what is wrong."""
        if not isinstance(body, Mapping):
            raise ApiError(400, "the body must be a JSON object: a function registration request")
        try:
            request = FunctionRegistrationRequest.from_wire(body)
        except ValidationError as error:
            raise ApiError(400, "invalid registration request: " + format_validation_error(error)) from None
        refused = unsupported_fields(request)
        if refused:
            raise ApiError(400, refused)
        runtime = request.runtime
        if runtime.kind not in ("python", "python_v2"):
            raise ApiError(
                400,
                f"runtime.kind {runtime.kind!r} is not supported by this server; use 'python' (CPU) or 'python_v2' (GPU)",
            )
        environment = runtime.environment
        if environment is not None and environment.kind == "pip":
            problem = pip_problem(environment.packages, direct_references=self.allow_direct_references)
            if problem:
                raise ApiError(400, f"runtime.environment.packages: {problem}")
        try:
            artifact = decode_artifact(request.artifact)
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        limit = self.max_artifact_bytes
        if len(artifact) > limit:
            raise ApiError(
                413,
                f"the artifact is {len(artifact)} bytes, over this server's limit of {limit}; "
                "keep data out of the function's source, or start lancefn-server with a larger --max-artifact-bytes",
            )
        source = artifact
        if request.artifact.kind == "python_bundle":
            files = bundle_files(artifact)
            problem = bundle_problem(files)
            if problem:
                raise ApiError(400, problem)
            assert files is not None  # bundle_problem refuses what is no bundle
            source = files[ENTRY_FILE].encode("utf-8", "surrogatepass")
        prepared = Prepared(request, artifact, in_process(source), source)
        if not prepared.checked:
            return prepared
        return finish_check(prepared, check_artifact(source, prepared.entrypoint, prepared.plain))

    def record(self, prepared: Prepared, namespace: str = DEFAULT_NAMESPACE, lancedb: bool = False) -> Registration:
        """Record a prepared registration whose artifact is checked in ``namespace``: the version and its DONE
        ``create_function`` job; returns its id and the warnings about the version.  ``lancedb``: the job's result is
        the version in LanceDB 0.40's shape (its client reads it)."""
        request, artifact = prepared.request, prepared.artifact
        runtime = request.runtime
        if runtime.resources is not None:
            self.placement(runtime.resources.gpu_class, runtime.resources.num_gpus)
            self._check_resources(runtime.resources)
        if request.secret_bindings:
            problem = self.secrets.binding_problem(namespace, request.secret_bindings, runtime.env or ())
            if problem:
                raise ApiError(400, problem)
        vid = version_id(request, self.digest_key)
        warnings = self._environment_warnings(request)
        with self.lock:
            row = self.store.get_version(request.name, vid, namespace)
            with self.store.batch():
                if row is None:
                    version = derive_version(request, rfc3339_now(), self.digest_key)
                    definition = version.to_canonical_json()
                    self.store.insert_version(request.name, vid, definition, artifact, version.created_at, namespace)
                else:
                    definition = row.definition
                    if row.dropped:  # registering it again brings a dropped version back
                        self.store.set_dropped(request.name, vid, False, namespace)
                now = now_ms()
                rec = JobRecord(
                    job_id=uuid.uuid4().hex,
                    job_type="create_function",
                    state=DONE,
                    creation_ms=now,
                    started_ms=now,
                    finished_ms=now,
                    spec={"name": request.name, "version": vid},
                    name=request.name,
                    result=self._shaped(json.loads(definition), namespace)
                    if lancedb
                    else redact_definition(json.loads(definition)),
                    namespace=namespace,
                )
                self.journal.persist(rec, new=True)
            return Registration(rec.job_id, warnings)

    def _environment_warnings(self, request: FunctionRegistrationRequest) -> list[str]:
        if self.environment_check is None:
            return []
        runtime = request.runtime
        digest = environment_digest(runtime.environment) if runtime.environment is not None else ""
        wanted = EnvironmentRequest.from_runtime(runtime.to_wire(), digest)
        problem = self.environment_check(wanted)
        return [problem] if problem else []

    def describe(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        row = self._live_row(name, version, "register it again to restore it", **where)
        # The FunctionVersion and, as lists and jobs do, its namespace (the admin's key sees every one).
        return {**redact_definition(json.loads(row.definition)), "namespace": row.namespace}

    def artifact(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        """The version's artifact bytes (base64), so any process can run or diff it (`lookup`, `.local()`)."""
        row = self._live_row(name, version, "register it again to restore it", **where)
        definition = json.loads(row.definition)["artifact"]
        return {
            "name": name,
            "version": version,
            "entrypoint": definition["entrypoint"],
            "digest": definition["digest"],
            "encoding": "base64",
            "data": base64.b64encode(row.artifact).decode("ascii"),
        }

    def runnable(self, name: str, version: str, **where: Unpack[Where]) -> tuple[FunctionVersion, str]:
        """The version a run or batch means and the namespace its jobs belong to (whose env they run with)."""
        row = self._live_row(name, version, "register it again to run it", **where)
        return stored_version(row.definition), row.namespace

    def history(self, name: str | None, limit: int, **where: Unpack[Where]) -> dict:
        """Each function's newest `limit` versions, newest first, with their one-line change (`versions`)."""
        from lancefn_jupyter.wire.versions import history

        functions = []
        ns = self._one_namespace(name, **where)
        for fname, known in sorted(self._live_versions(name, ns).items()):
            shown = known[-(limit + 1) :]  # one more, so the oldest row shown still has a change line
            rows = history(fname, shown, [self._source(fname, fv.version, ns) for fv in shown])[:limit]
            functions.append(
                {
                    "name": fname,
                    "versions": [
                        {"version": r.version, "created_at": r.created_at, "change": r.change, "snippet": r.snippet}
                        for r in rows
                    ],
                }
            )
        if name is not None and not functions:
            raise ApiError(
                404, f"no function named {name!r} is registered; list functions with POST /v1/functions/list"
            )
        return {"functions": functions}

    def diff(self, name: str, old: str | None, new: str | None, **where: Unpack[Where]) -> dict:
        """Source diff and runtime differences of two versions (`versions.diff_pair` picks them)."""
        from lancefn_jupyter.wire.versions import VersionLookupError, diff_pair, diff_versions

        ns = self._one_namespace(name, **where)
        known = {fv.version: fv for fv in self._live_versions(name, ns).get(name, [])}
        try:
            old_id, new_id = diff_pair(name, list(known), old, new)
        except VersionLookupError as error:
            raise ApiError(404 if error.unknown else 400, str(error)) from None
        sources = [self._source(name, v, ns) for v in (old_id, new_id)]
        return diff_versions(known[old_id], known[new_id], *sources).to_wire()

    def list_functions(
        self, *, name: str | None, include_definition: bool, page_token: str | None, limit: int, scope: str | None
    ) -> dict:
        after = decode_token(page_token) or 0
        limit = clamp_limit(limit)
        rows = self.store.list_versions(name=name, after_seq=after, limit=limit + 1, namespace=scope)
        reply: dict[str, Any] = {"functions": []}
        for _seq, fname, fversion, definition, owner in rows[:limit]:
            item: dict[str, Any] = {"name": fname, "version": fversion, "namespace": owner}
            if include_definition:
                item["definition"] = redact_definition(json.loads(definition))
            reply["functions"].append(item)
        if len(rows) > limit:
            reply["page_token"] = encode_token(rows[limit - 1][0])
        return reply

    def drop(self, name: str, version: str, **where: Unpack[Where]) -> dict:
        with self.lock:
            row = self._row(name, version, **where)
            if not row.dropped:
                self.store.set_dropped(name, version, True, row.namespace)
            return {"dropped": not row.dropped}

    # ------------------------------------------------- LanceDB 0.40 dialect

    def _shaped(self, definition: dict, namespace: str) -> dict:
        ids = self.store.version_ids(definition["name"], namespace)
        return dialect.lancedb_version(redact_definition(definition), ids=ids, namespace=namespace)

    def _lancedb_row(self, name: str, version: str, namespace: str) -> VersionRow:
        """The live version a LanceDB ``version`` (decimal, or our content id) of ``name`` means; 404 otherwise."""
        vid = dialect.version_position(self.store.version_ids(name, namespace), version)
        row = self.store.get_version(name, vid, namespace) if vid is not None else None
        if row is None or row.dropped:
            raise ApiError(
                404, f"function {name!r} has no version {version!r}; list its versions with db.list_functions()"
            )
        return row

    def lancedb_describe(self, name: str, version: str, namespace: str) -> dict:
        """A version in LanceDB 0.40's shape (``POST /v1/function/{id}/describe``)."""
        return self._shaped(json.loads(self._lancedb_row(name, version, namespace).definition), namespace)

    def lancedb_drop(self, name: str, version: str, namespace: str) -> dict:
        """``POST /v1/function/{id}/drop``: ``{"dropped": false}`` when it was dropped already or never existed."""
        vid = dialect.version_position(self.store.version_ids(name, namespace), version)
        with self.lock:
            row = self.store.get_version(name, vid, namespace) if vid is not None else None
            if row is None or row.dropped:
                return {"dropped": False}
            self.store.set_dropped(name, row.version, True, namespace)
            return {"dropped": True}

    def lancedb_list(self, namespace: str, include_definition: bool, page_token: str | None, limit: int) -> dict:
        """``GET /v1/namespace/{ns}/function/list``: live versions in registration order, paginated."""
        listed = self.list_functions(
            name=None, include_definition=True, page_token=page_token, limit=limit, scope=namespace
        )
        functions = []
        for item in listed["functions"]:
            shaped = self._shaped(item["definition"], namespace)
            entry: dict[str, Any] = {"name": item["name"], "version": shaped["version"]}
            if include_definition:
                entry["definition"] = shaped
            functions.append(entry)
        reply: dict[str, Any] = {"functions": functions}
        if "page_token" in listed:
            reply["page_token"] = listed["page_token"]
        return reply

    # ---------------------------------------------------------------- placement

    def placement(self, gpu_class: str | None, num_gpus: int) -> Placement:
        """The class and GPUs a version asks for, checked against this server's config (a 400 otherwise)."""
        problem = self.capacity_problem(gpu_class, num_gpus)
        if problem:
            raise ApiError(400, problem)
        spec = self.classes.get(gpu_class)
        assert spec is not None  # capacity_problem found the class
        return Placement(spec.name, num_gpus, spec.simulated)

    def _check_resources(self, resources: FunctionResourceRequirements) -> None:
        """A version asking for more CPU or memory than a worker of its class can ever have is refused (a 400 naming
        the limit: docs/ARCHITECTURE.md, "Compute resources")."""
        spec = self.classes.get(resources.gpu_class)
        if spec is not None:
            problem = request_problem(resource_request(resources, spec.gpu_class), spec.gpu_class)
            if problem:
                raise ApiError(400, problem)

    def capacity_problem(self, gpu_class: str | None, num_gpus: int) -> str | None:
        spec = self.classes.get(gpu_class)
        if spec is None:
            available = ", ".join(
                f"{s.name} (max {s.gpu_class.max_gpu_count_per_worker} GPUs/worker)" for s in self.classes.classes
            )
            return f"unknown gpu_class {gpu_class!r}; available GPU classes: {available}"
        limit = spec.gpu_class.max_gpu_count_per_worker
        if num_gpus > limit:
            limits = ", ".join(f"{s.name}: {s.gpu_class.max_gpu_count_per_worker}" for s in self.classes.classes)
            return (
                f"num_gpus={num_gpus} exceeds GPU class {spec.name!r} (max_gpu_count_per_worker of {limit}); "
                f"request at most {limit} GPU{'' if limit == 1 else 's'} or pick another class ({limits})"
            )
        return None

    # ------------------------------------------------------- namespace resolution

    def _row(
        self,
        name: str,
        version: str,
        namespace: str | None = DEFAULT_NAMESPACE,
        scope: str | None = None,
        home: str = DEFAULT_NAMESPACE,
    ) -> VersionRow:
        """The version a caller means (see ``namespaces``); 404 if never registered *or not the
        caller's to see*, with the same message either way so nothing leaks."""
        row = None
        if namespace is not None:
            if visible(scope, namespace):
                row = self.store.get_version(name, version, namespace)
        else:  # the admin named no namespace: its own first, else wherever it is
            row = self.store.get_version(name, version, home) or self.store.get_version(name, version, None)
        if row is None:
            raise ApiError(
                404, f"function version {name}@{version} not found; list versions with POST /v1/functions/list"
            )
        return row

    def _live_row(self, name: str, version: str, fix: str, **where: Unpack[Where]) -> VersionRow:
        """``_row``, and a 404 saying how to ``fix`` it when the version was dropped."""
        row = self._row(name, version, **where)
        if row.dropped:
            raise ApiError(404, f"function version {name}@{version} was dropped; {fix}")
        return row

    def _one_namespace(
        self, name: str | None, namespace: str | None = None, scope: str | None = None, home: str = DEFAULT_NAMESPACE
    ) -> str | None:
        """The one namespace a history/diff request means: the caller's own, or for the admin the one
        it names, else its own if that has ``name``, else the first that does.  None when the caller
        may not see it (its replies are then those of an unknown name)."""
        if (
            namespace is None
            and scope is None
            and name is not None
            and not self.store.list_versions(name=name, after_seq=0, limit=1, namespace=home)
        ):
            first = self.store.list_versions(name=name, after_seq=0, limit=1)
            namespace = first[0][4] if first else None
        namespace = namespace or home
        return namespace if visible(scope, namespace) else None

    def _live_versions(self, name: str | None, namespace: str | None) -> dict[str, list[FunctionVersion]]:
        """Live versions (env values redacted) of one namespace by name, registration order."""
        grouped: dict[str, list[FunctionVersion]] = {}
        if namespace is None:
            return grouped
        for _, fname, _, definition, _ in self.store.list_versions(
            name=name, after_seq=0, limit=10**9, namespace=namespace
        ):
            grouped.setdefault(fname, []).append(FunctionVersion.from_wire(redact_definition(json.loads(definition))))
        return grouped

    def _source(self, name: str, version: str, namespace: str | None) -> str:
        row = self.store.get_version(name, version, namespace)
        assert row is not None  # callers pass versions they just listed
        return row.artifact.decode("utf-8", errors="replace")
