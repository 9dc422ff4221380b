"""Wire models of lancefn-jupyter and their canonical JSON (docs/ARCHITECTURE.md, "Function versions (wire rules)").

Every model is a frozen pydantic v2 value. Decoding ignores unknown fields and never
re-emits them; validation is eager and fails closed with a message that names the field
and says how to fix it. Encoding (``to_wire`` / ``to_canonical_json``) writes required
fields always and omits a field that is ``None`` or equal to its default, so a value that
did not use a newer optional field encodes to the same bytes as before it existed (that
is how ``gpu_class`` joined the contract without changing existing digests).

Pure: pydantic and the standard library only.

Over 600 lines: one concern, the wire contract of a version and a job, whose models refer to one another and
share one canonical encoding; splitting them would split the digest rules."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import keyword
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from lancefn_jupyter.wire.quantities import cpu_cores, memory_bytes

__all__ = [
    "ENV_NAME_PATTERN",
    "MAX_TIMEOUT_S",
    "NAME_PATTERN",
    "PYTHON_VERSION_PATTERN",
    "TERMINAL_STATES",
    "FailureFrame",
    "FunctionArtifact",
    "FunctionArtifactContent",
    "FunctionArtifactRequest",
    "FunctionOutput",
    "FunctionParameter",
    "FunctionRegistrationRequest",
    # function versions, leaf types first
    "FunctionResourceRequirements",
    "FunctionResultField",
    "FunctionSignature",
    "FunctionVersion",
    "GpuClass",
    "GpuUsage",
    "Job",
    "JobFailure",
    "JobPlacement",
    "JobProgress",
    # jobs and GPU classes
    "JobState",
    "JobTimings",
    "JobUsage",
    "PythonAdapterSpec",
    "PythonEnvironmentSpec",
    "PythonRuntimeSpec",
    "SecretBinding",
    "SecretReference",
    "TextMap",
    "WireModel",
    # encoding
    "canonical_json",
    "decode_artifact",
    "derive_version",
    "display_state",
    "environment_digest",
    "rfc3339_now",
    "runtime_digest",
    "valid_num_gpus",
    # derivation
    "version_id",
]

# NAME_, ENV_NAME_ and PYTHON_VERSION_PATTERN and valid_num_gpus are public: options.py checks them first.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
PYTHON_VERSION_PATTERN = re.compile(r"[0-9]+\.[0-9]+")
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})")
_UINT32_MAX = 2**32 - 1
MAX_TIMEOUT_S = 30 * 24 * 3600  # a job's timeout_s at most (30 days): timers can't take 1e300


# --------------------------------------------------------------------------- encoding


def _wire_value(value: Any) -> Any:
    """Plain JSON-shaped data from models, enums, mappings and sequences."""
    if isinstance(value, WireModel):
        return value.to_wire()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: _wire_value(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [_wire_value(child) for child in value]
    return value


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a JSON value or a model.

    Keys sorted at every depth, arrays in order, no whitespace, UTF-8 kept as is;
    NaN and infinities raise ``ValueError`` (they have no JSON form).
    """
    return json.dumps(
        _wire_value(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def rfc3339_now() -> str:
    """The current UTC time as RFC 3339 with milliseconds, e.g. ``2025-01-31T12:00:00.123Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------- field types


class _FrozenDict(dict):
    """A dict that refuses mutation, so a frozen model is frozen all the way down."""

    def _immutable(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("wire values are immutable; build a new model instead")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable  # type: ignore[assignment]
    __ior__ = _immutable  # type: ignore[assignment]

    def __reduce__(self):
        # copy/deepcopy/pickle would otherwise refill an empty instance item by item.
        return (_FrozenDict, (dict(self),))


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _FrozenDict({key: _freeze(child) for key, child in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(child) for child in value)
    return value


def plain_json(value: Any) -> bool:
    """Whether ``value`` is plainly finite JSON: str-keyed dicts, lists, strings, ints, finite floats, bools, None."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(key) is str and plain_json(child) for key, child in value.items())
    if kind is list:
        return all(plain_json(child) for child in value)
    return False


def _json_value(value: Any) -> Any:
    # pydantic's JSON parser accepts NaN/Infinity literals and Python callers can pass
    # anything, so free-form fields are checked to be finite JSON at decode time (what a parsed
    # reply holds is checked by a walk; anything else by encoding it, which also takes models).
    if plain_json(value):
        return value
    try:
        canonical_json(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"must be a finite JSON value ({error}); use numbers, strings, lists and objects") from None
    return value


def _pattern(regex: re.Pattern[str], what: str, example: str):
    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise ValueError(f"must be {what} (got {value!r}), e.g. {example!r}")
        return value

    return AfterValidator(check)


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


def _identifier(value: str) -> str:
    if not value.isidentifier() or keyword.iskeyword(value):
        raise ValueError(f"must be a Python identifier (got {value!r}), e.g. 'double_all'")
    return value


def _env_mapping(value: Mapping[str, str]) -> Mapping[str, str] | None:
    for key in value:
        if not ENV_NAME_PATTERN.fullmatch(key):
            raise ValueError(f"environment variable name {key!r} is invalid; use letters, digits and _, e.g. 'MY_VAR'")
    # An empty mapping means the same as no mapping; normalizing keeps the identity single.
    return _freeze(value) if value else None


def valid_num_gpus(value: Any) -> int:
    """``value`` if it is a GPU count the wire accepts, else a ``ValueError`` saying how to write one."""
    # bool is an int subclass and JSON floats like 1.0 are not whole GPU counts on the wire.
    if type(value) is not int or not 1 <= value <= _UINT32_MAX:
        raise ValueError(
            f"num_gpus must be a whole number of GPUs ≥ 1 (at most {_UINT32_MAX}), got {value!r}; write e.g. num_gpus=1"
        )
    return value


def _cpu_quantity(text: str) -> str:
    cpu_cores(text)  # the ValueError says how to write it
    return text


def _memory_quantity(text: str) -> str:
    memory_bytes(text)
    return text


_Name = Annotated[
    StrictStr, _pattern(NAME_PATTERN, "letters, digits, '_', '.', '-', starting with a letter or '_'", "my_function")
]
_Digest = Annotated[StrictStr, _pattern(_DIGEST, "'sha256:' followed by 64 lowercase hex digits", "sha256:" + "0" * 64)]
_Text = Annotated[StrictStr, AfterValidator(_non_empty)]
_Identifier = Annotated[StrictStr, AfterValidator(_identifier)]
_Count = Annotated[int, Field(strict=True, ge=0)]
_JSON = Annotated[Any, AfterValidator(_json_value)]
_FrozenJSONObject = Annotated[Mapping[StrictStr, Any], AfterValidator(_json_value), AfterValidator(_freeze)]
# Names to text, frozen with the model (wire modules beside this one use it: a backfill's columns, a task's types).
TextMap = Annotated[Mapping[StrictStr, StrictStr], AfterValidator(_freeze)]


class WireModel(BaseModel):
    """Base of every wire model: frozen, unknown fields ignored, canonical encoding."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    def to_wire(self) -> dict[str, Any]:
        """Known fields as plain JSON data, omitting ``None`` and defaults (required always)."""
        wire = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is None:
                continue
            if not field.is_required():
                default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
                if value == default:
                    continue
            wire[name] = _wire_value(value)
        return wire

    def to_canonical_json(self) -> str:
        return canonical_json(self.to_wire())

    @classmethod
    def from_json(cls, text: str | bytes):
        """Decode JSON text; raises ``pydantic.ValidationError`` (a ``ValueError``)."""
        return cls.model_validate_json(text)

    @classmethod
    def from_wire(cls, data: Any):
        """Decode already-parsed JSON data; raises ``pydantic.ValidationError``."""
        return cls.model_validate(data)


# ------------------------------------------------------------------ function versions


class FunctionResourceRequirements(WireModel):
    """Resources required every time a function version executes (part of its identity)."""

    num_gpus: Annotated[int, BeforeValidator(valid_num_gpus)]
    # Pins the operator-configured GPU class; omitted means the server's default.
    gpu_class: _Name | None = None
    # Host CPU cores and memory one worker of the version is given and held to, as Kubernetes quantities ("4",
    # "500m"; "16Gi"); omitted: the class's default (docs/ARCHITECTURE.md, "Compute resources"). Absent when not
    # asked, so the ids of versions registered before are unchanged.
    cpu: Annotated[StrictStr, AfterValidator(_cpu_quantity)] | None = None
    memory: Annotated[StrictStr, AfterValidator(_memory_quantity)] | None = None


class PythonEnvironmentSpec(WireModel):
    """One Python environment: pip or conda packages, conda channels, optional base image."""

    kind: Literal["pip", "conda"]
    packages: tuple[StrictStr, ...] = ()
    channels: tuple[StrictStr, ...] = ()
    image: _Text | None = None

    @field_validator("packages")
    @classmethod
    def _normalize_packages(cls, packages: tuple[str, ...]) -> tuple[str, ...]:
        # Order and repeats carry no meaning, so they must not change the version id.
        trimmed = [package.strip() for package in packages]
        if "" in trimmed:
            raise ValueError(f"package #{trimmed.index('')} is empty; remove it or name a package like 'numpy'")
        return tuple(sorted(set(trimmed)))

    @field_validator("channels")
    @classmethod
    def _check_channels(cls, channels: tuple[str, ...]) -> tuple[str, ...]:
        # Channel order is conda's priority order, so it is kept.
        trimmed = tuple(channel.strip() for channel in channels)
        if "" in trimmed:
            raise ValueError(f"channel #{trimmed.index('')} is empty; remove it or name a channel like 'conda-forge'")
        return trimmed

    @model_validator(mode="after")
    def _channels_need_conda(self):
        if self.channels and self.kind != "conda":
            raise ValueError("channels are only for conda environments; use kind='conda' or remove channels")
        return self


class PythonRuntimeSpec(WireModel):
    """Runtime of a function version.

    ``python`` is a CPU runtime and must not carry resources; ``python_v2`` is the
    resource-aware runtime and requires them. A kind from a newer server decodes to just
    ``{"kind": ...}``: its other fields are not understood, so they are not kept.
    """

    kind: StrictStr
    python_version: Annotated[StrictStr, _pattern(PYTHON_VERSION_PATTERN, "MAJOR.MINOR", "3.12")] | None = None
    environment: PythonEnvironmentSpec | None = None
    env: Annotated[Mapping[StrictStr, StrictStr], AfterValidator(_env_mapping)] | None = None
    resources: FunctionResourceRequirements | None = None
    # How long the module's state lives (docs/ARCHITECTURE.md, "Warm state"): absent = "per_worker"
    # (executed once per worker, so version ids of earlier registrations are unchanged);
    # "per_job" executes it afresh for every job.
    state: Literal["per_job"] | None = None
    # Whether a new version whose setup part equals an earlier one's may run on that version's live worker
    # (docs/ARCHITECTURE.md, "Setup reuse"): absent = yes (never encoded); "no" always gets a worker of its own.
    reuse_setup: Literal["no"] | None = None

    @field_validator("reuse_setup", mode="before")
    @classmethod
    def _default_reuse_setup(cls, reuse: Any) -> Any:
        if reuse in ("yes", True):
            return None  # the default is never encoded: it must not change a version id
        if reuse is False:
            return "no"
        if reuse is not None and reuse != "no":
            raise ValueError(f"reuse_setup must be 'yes' (the default) or 'no', not {reuse!r}")
        return reuse

    # LanceDB 0.40's GPU marker (docs/ARCHITECTURE.md, "LanceDB 0.40 dialect"): true or absent, python_v2 only; alone
    # it means one GPU of the default class (``resources`` is filled in), beside ``resources`` it must agree (it
    # does: num_gpus ≥ 1). Encoded when present, so it counts in the version's identity.
    gpu: Literal[True] | None = None

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_marker(cls, gpu: Any) -> Any:
        if gpu is not None and gpu is not True:
            raise ValueError(
                f"runtime.gpu must be true or absent (got {gpu!r}); leave it out for a CPU function (kind='python')"
            )
        return gpu

    @model_validator(mode="before")
    @classmethod
    def _gpu_means_one_gpu(cls, data: Any) -> Any:
        one_gpu = isinstance(data, Mapping) and data.get("kind") == "python_v2" and data.get("gpu") is True
        if one_gpu and data.get("resources") is None:
            return {**data, "resources": {"num_gpus": 1}}
        return data

    @field_validator("state", mode="before")
    @classmethod
    def _default_state(cls, state: Any) -> Any:
        if state == "per_worker":
            return None  # the default is never encoded: it must not change a version id
        if state is not None and state != "per_job":
            raise ValueError(f"state must be 'per_worker' (the default) or 'per_job', not {state!r}")
        return state

    @model_validator(mode="before")
    @classmethod
    def _discard_unknown_kind_payload(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            kind = data.get("kind")
            if isinstance(kind, str) and kind not in ("python", "python_v2"):
                return {"kind": kind}
        return data

    @model_validator(mode="after")
    def _check_kind(self):
        if self.kind not in ("python", "python_v2"):
            return self
        fix = {
            "python_version": "add python_version='3.12'",
            "environment": "add environment={'kind': 'pip'}",
            "resources": "add resources={'num_gpus': 1}, or use kind='python' for a CPU function",
        }
        required = ("python_version", "environment") + (("resources",) if self.kind == "python_v2" else ())
        for name in required:
            if getattr(self, name) is None:
                raise ValueError(f"{self.kind} runtime requires {name}; {fix[name]}")
        if self.kind == "python" and self.gpu:
            raise ValueError("python runtime with gpu requires kind='python_v2' (or drop gpu for a CPU function)")
        if self.kind == "python" and self.resources is not None:
            raise ValueError(
                "python runtime with resources requires kind='python_v2' (or drop resources for a CPU function)"
            )
        return self


class FunctionArtifactContent(WireModel):
    """The artifact bytes, base64-encoded, carried in a registration request."""

    encoding: Literal["base64"]
    data: StrictStr


class PythonAdapterSpec(WireModel):
    """How the server turns the scalar entry function into a batch function."""

    kind: Literal["scalar_to_arrow_batch"]
    # Literal[1] alone would also accept True (True == 1).
    version: Annotated[int, Field(strict=True, ge=1, le=1)]


class FunctionArtifactRequest(WireModel):
    """The artifact as uploaded: identity plus content and adapter."""

    # "python_bundle": LanceDB 0.40's ``udf(code=[module])``, the JSON of its files (``wire/bundles.py``).
    kind: Literal["python_callable", "python_bundle"]
    digest: _Digest
    entrypoint: _Identifier
    content: FunctionArtifactContent
    adapter: PythonAdapterSpec


class FunctionArtifact(WireModel):
    """The artifact's identity as returned in a version (no bytes)."""

    kind: Literal["python_callable", "python_bundle"]
    digest: _Digest
    entrypoint: _Identifier


class FunctionParameter(WireModel):
    """One input of the entry function.

    ``default`` is the Python literal source of the parameter's default value (e.g. ``"2"``,
    ``"None"``); present means the input is optional: a row may omit it and the worker applies
    the default. Absent (the common case) keeps the encoding, so version ids, as before.
    """

    name: _Identifier
    arrow_type: _Text
    nullable: StrictBool
    default: StrictStr | None = None
    # A batched function's parameter: how the chunk's values arrive ("list", "ndarray", "arrow",
    # "record_batch"; docs/ARCHITECTURE.md, "Batched functions"). Absent for per-row functions (ids unchanged).
    form: StrictStr | None = None


class FunctionResultField(WireModel):
    """One field of a ``named_struct`` output (LanceDB 0.40)."""

    name: _Text
    arrow_type: _Text
    nullable: StrictBool


class FunctionOutput(WireModel):
    """The entry function's output; other kinds than ``scalar`` stay decodable."""

    kind: _Text
    arrow_type: _Text | None = None
    nullable: StrictBool | None = None
    # A batched function's return: "list", "ndarray" (axis 0 the rows) or "arrow" ("Batched functions").
    form: StrictStr | None = None
    # A ``named_struct`` output's fields in order (LanceDB 0.40); empty (omitted) for a scalar.
    fields: tuple[FunctionResultField, ...] = ()

    @model_validator(mode="after")
    def _scalar_needs_type(self):
        if self.kind == "scalar" and (self.arrow_type is None or self.nullable is None):
            raise ValueError(
                "a scalar output requires arrow_type and nullable, "
                "e.g. {'kind': 'scalar', 'arrow_type': 'int64', 'nullable': False}"
            )
        return self


class FunctionSignature(WireModel):
    """Inputs in call order and the output."""

    inputs: tuple[FunctionParameter, ...]
    output: FunctionOutput
    # True: the entry is called once per chunk with every row's values (docs/ARCHITECTURE.md, "Batched
    # functions"); arrow_type stays the type of one row's value. False (omitted): once per row.
    batched: StrictBool = False
    # A class entry's ``__init__`` parameters (LanceDB 0.40): values come per run, not from the version.
    initialization: tuple[FunctionParameter, ...] = ()

    @field_validator("inputs")
    @classmethod
    def _unique_names(cls, inputs: tuple[FunctionParameter, ...]) -> tuple[FunctionParameter, ...]:
        names = [parameter.name for parameter in inputs]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"input {name!r} appears more than once; give each parameter its own name")
        return inputs


class SecretReference(WireModel):
    """Which secret a binding means: its name and namespace path (LanceDB 0.40)."""

    name: _Name
    namespace_path: tuple[_Name, ...] = ()


class SecretBinding(WireModel):
    """How a secret reaches the function: ``kind`` ``env`` puts its value in the environment ``variable``."""

    kind: _Text
    variable: Annotated[StrictStr, _pattern(ENV_NAME_PATTERN, "an environment variable name", "HF_TOKEN")] | None = None
    secret_ref: SecretReference | None = None


class FunctionRegistrationRequest(WireModel):
    """What the kernel sends to register a function version."""

    name: _Name
    artifact: FunctionArtifactRequest
    signature: FunctionSignature
    runtime: PythonRuntimeSpec
    # Secrets bound by name (names only, never values); empty (omitted) keeps earlier ids.
    secret_bindings: tuple[SecretBinding, ...] = ()


class FunctionVersion(WireModel):
    """An immutable registered version; resources are part of its identity."""

    name: _Name
    version: _Text
    artifact: FunctionArtifact
    signature: FunctionSignature
    runtime: PythonRuntimeSpec
    runtime_digest: _Digest
    environment_digest: _Digest
    created_at: Annotated[StrictStr, _pattern(_RFC3339, "an RFC 3339 UTC timestamp", "2025-01-31T12:00:00.000Z")]
    secret_bindings: tuple[SecretBinding, ...] = ()


# ---------------------------------------------------------------------- derivation


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _keyed_runtime(runtime: PythonRuntimeSpec, env_key: bytes | None) -> PythonRuntimeSpec:
    """``runtime`` with each ``env`` value replaced by ``hmac-sha256:<hex>`` of it under the server's ``env_key``
    (what the digests hash, so a short env value cannot be found offline by hashing guesses; same value, same
    server → same digest). Unchanged without an env or a key."""
    if not env_key or not runtime.env:
        return runtime
    keyed = {
        name: "hmac-sha256:" + hmac.new(env_key, value.encode("utf-8"), hashlib.sha256).hexdigest()
        for name, value in runtime.env.items()
    }
    return runtime.model_copy(update={"env": keyed})


def version_id(request: FunctionRegistrationRequest, env_key: bytes | None = None) -> str:
    """The version id: first 16 hex digits of sha256 of the canonical request, its env values keyed
    (:func:`_keyed_runtime`)."""
    if env_key and request.runtime.env:
        request = request.model_copy(update={"runtime": _keyed_runtime(request.runtime, env_key)})
    return hashlib.sha256(request.to_canonical_json().encode("utf-8")).hexdigest()[:16]


def runtime_digest(runtime: PythonRuntimeSpec, env_key: bytes | None = None) -> str:
    """``sha256:<hex>`` of the runtime's canonical JSON, its env values keyed (:func:`_keyed_runtime`)."""
    return _sha256(_keyed_runtime(runtime, env_key).to_canonical_json())


def environment_digest(environment: PythonEnvironmentSpec) -> str:
    """``sha256:<hex>`` of the environment's canonical JSON."""
    return _sha256(environment.to_canonical_json())


def derive_version(
    request: FunctionRegistrationRequest, created_at: str, env_key: bytes | None = None
) -> FunctionVersion:
    """The version a server records for ``request``; identical requests give identical ids (on one server:
    ``env_key`` is its digest key, see :func:`_keyed_runtime`)."""
    environment = request.runtime.environment
    if environment is None:
        raise ValueError(f"runtime.kind {request.runtime.kind!r} is not supported here; use 'python' or 'python_v2'")
    artifact = request.artifact
    return FunctionVersion(
        name=request.name,
        version=version_id(request, env_key),
        artifact=FunctionArtifact(kind=artifact.kind, digest=artifact.digest, entrypoint=artifact.entrypoint),
        signature=request.signature,
        runtime=request.runtime,
        runtime_digest=runtime_digest(request.runtime, env_key),
        environment_digest=environment_digest(environment),
        created_at=created_at,
        secret_bindings=request.secret_bindings,
    )


def decode_artifact(request: FunctionArtifactRequest) -> bytes:
    """The artifact bytes, after checking them against ``artifact.digest``."""
    try:
        data = base64.b64decode(request.content.data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            "artifact.content.data is not valid base64; encode the artifact bytes with base64.b64encode"
        ) from None
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != request.digest:
        raise ValueError(
            f"artifact.digest {request.digest} does not match the content ({actual}); "
            "set digest to the sha256 of the artifact bytes"
        )
    return data


# ------------------------------------------------------------------ jobs and GPU classes


class JobState(str, Enum):
    """Server-side job states; ``display_state`` gives the words users see."""

    PENDING = "PENDING"
    IN_PROGRESS = "IN_PROGRESS"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


TERMINAL_STATES = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})

_DISPLAY = {
    JobState.PENDING: "pending",
    JobState.IN_PROGRESS: "running",
    JobState.DONE: "finished",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.TIMED_OUT: "timed out",
}


def display_state(state: JobState | str) -> str:
    """``"pending"``, ``"running"``, ``"finished"``, ``"failed"``, ``"cancelled"`` or ``"timed out"``."""
    return _DISPLAY[JobState(state)]


class JobPlacement(WireModel):
    """Where a job runs or waits: its class, GPUs, devices and place in the queue."""

    gpu_class: _Name | None = None
    num_gpus: _Count = 0
    devices: tuple[StrictStr, ...] = ()
    waiting_on_capacity: StrictBool = False
    queue_position: _Count | None = None
    node: StrictStr | None = None
    # When a queued job should start (epoch ms), from the queue and recent run times; None: unknown.
    expected_start_ms: StrictInt | None = None
    # The expected start rests on run times that say little (a version without history, widely spread or
    # outlived class run times): UIs say "start time uncertain".
    expected_start_uncertain: StrictBool = False
    pending_reason: StrictStr | None = None  # why it cannot start now beyond waiting its turn (Ray)


class JobProgress(WireModel):
    """Rows finished out of rows submitted."""

    rows_done: _Count = 0
    rows_total: _Count = 0

    @model_validator(mode="after")
    def _done_within_total(self):
        if self.rows_done > self.rows_total:
            raise ValueError(f"rows_done ({self.rows_done}) exceeds rows_total ({self.rows_total})")
        return self


class FailureFrame(WireModel):
    """One remote frame of a failure: its function, its line in the artifact, its locals' short reprs
    (``wire/frames.py``)."""

    function: StrictStr
    line: int
    locals: dict[str, str] = Field(default_factory=dict)


class JobFailure(WireModel):
    """Why a job failed, and whether running it again may succeed."""

    phase: Literal[
        "validation",
        "environment",
        "import",  # servers before issue 24; module execution now fails in "setup"
        "setup",
        "run",
        "result",
        "worker",
        "timeout",
        "server_restart",
        "executor",
        "resources",  # the worker used more than its version's memory= ("Compute resources")
    ]
    message: StrictStr
    retryable: StrictBool = False
    traceback: StrictStr | None = None
    # Debugging a failure (docs/ARCHITECTURE.md): the failing rows' span in the job's rows, those rows when kept, and
    # the remote frames' locals (bounded and redacted by the control plane).
    failing_rows: tuple[int, int] | None = None
    rows: list[dict[str, Any]] | None = None
    frames: tuple[FailureFrame, ...] | None = None


_Millis = Annotated[float, Field(strict=False, ge=0, allow_inf_nan=False)]


class JobTimings(WireModel):
    """Where a job's time went (docs/ARCHITECTURE.md, "Warm state"), in milliseconds.

    ``queued_ms``: created → a worker took it; ``start_ms``: starting a worker process or actor
    (0 when one was warm); ``environment_ms``: building its environment (0 for now);
    ``setup_ms``: executing the version's module and the class entry's ``setup()`` (0 when warm);
    ``run_ms``: calling the entry on the rows.  ``cold``: the job paid a start or a setup.
    ``setup_reused_from`` / ``rebind_ms``: see "Setup reuse".
    """

    queued_ms: _Millis = 0.0
    start_ms: _Millis = 0.0
    environment_ms: _Millis = 0.0
    setup_ms: _Millis = 0.0
    run_ms: _Millis = 0.0
    cold: StrictBool = False
    # The earlier version whose live worker ran it, its setup part being the same (docs/ARCHITECTURE.md, "Setup
    # reuse"), and the milliseconds its worker took to rebind the new code; None / 0 otherwise.
    setup_reused_from: _Text | None = None
    rebind_ms: _Millis = 0.0


class Job(WireModel):
    """A job as the server reports it."""

    job_id: _Text
    job_type: Literal["create_function", "run_function"]
    job_state: JobState
    creation_ms: _Count
    started_ms: _Count | None = None
    finished_ms: _Count | None = None
    spec: _FrozenJSONObject = Field(default_factory=dict)
    placement: JobPlacement
    progress: JobProgress
    # The job's output handed to the user as decoded (lists stay lists), so it is
    # checked to be JSON but not frozen.
    result: _JSON = None
    failure: JobFailure | None = None
    namespace: _Text | None = None  # the owning team (servers before namespaces: absent)
    # "arrow": the result is an Arrow IPC stream at GET /v1/jobs/result (not in `result`), and
    # `result_summary` ({type, dtype?, shape?, nbytes, item?, expired?, committed?, nonfinite?}) describes it.
    result_format: _Text | None = None
    result_summary: _JSON = None
    timings: JobTimings | None = None  # once the job ended on a worker (servers before issue 24: absent)
    usage: JobUsage | None = None  # once a job that ran has ended ("Cost")


class GpuClass(WireModel):
    """An operator-configured GPU class: hardware only, never live availability."""

    name: _Name
    resource_name: _Text = "nvidia.com/gpu"
    gpu_model: _Text
    gpu_memory_bytes: _Count
    max_gpu_count_per_worker: Annotated[int, Field(strict=True, ge=1, le=_UINT32_MAX)]
    node_selector: TextMap = Field(default_factory=dict)
    tolerations: tuple[_FrozenJSONObject, ...] = ()
    simulated: StrictBool = False
    # Host CPU cores and memory (docs/ARCHITECTURE.md, "Compute resources"): one GPU's share (a version that asks for
    # none gets its GPUs' share), and the class's node totals (what its workers hold together at most); None: not
    # configured.
    cpu_per_gpu: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    memory_bytes_per_gpu: Annotated[int, Field(gt=0)] | None = None
    node_cpu: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    node_memory_bytes: Annotated[int, Field(gt=0)] | None = None
    # What an hour of one GPU / one CPU core of the class costs, in ``currency`` (docs/ARCHITECTURE.md, "Cost").
    price_per_gpu_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    price_per_cpu_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    currency: _Text = "USD"


class JobUsage(WireModel):
    """What an ended job held (docs/ARCHITECTURE.md, "Cost"): seconds of its worker, GPU- and CPU-seconds, and its cost
    where its class has prices."""

    held_s: _Millis = 0.0
    gpu_seconds: _Millis = 0.0
    cpu_seconds: _Millis = 0.0
    cost: _Millis | None = None
    currency: StrictStr | None = None
    # On a real GPU, sampled through NVML while it ran: its worker's peak GPU memory, the GPUs' mean utilisation.
    gpu_memory_peak_bytes: _Millis | None = None
    gpu_util_mean_pct: _Millis | None = None


class GpuUsage(WireModel):
    """Live use of one GPU class."""

    name: _Name
    gpus_total: _Count
    gpus_busy: _Count
    jobs_running: _Count
    jobs_pending: _Count
    pending_reason: StrictStr | None = None  # a pending job of the class no node can fit (Ray)
    # A class an autoscaler scales (Ray, ``max_nodes``): its nodes up, asked for and not up yet, and its maximum
    nodes_up: _Count | None = None
    nodes_starting: _Count | None = None
    nodes_max: _Count | None = None
    # Its idle warm workers (each holds a version's loaded state): when each retires unused, epoch ms, soonest first
    # (`--worker-idle-s`; docs/ARCHITECTURE.md, "Isolation"). Empty where none is idle or the executor does not say.
    warm_retire_ms: tuple[_Count, ...] = ()

    def nodes_text(self) -> str | None:
        """'0 of 4 nodes up · 2 starting' for a class an autoscaler scales, else None."""
        if self.nodes_max is None:
            return None
        starting = f" · {self.nodes_starting} starting" if self.nodes_starting else ""
        return f"{self.nodes_up or 0} of {self.nodes_max} nodes up{starting}"
