"""Options of ``%%gpu_function`` and ``%gpu_profile`` (docs/ARCHITECTURE.md, "Notebook options"), from a magic line or Python kwargs.

One validation path serves both: a magic line is split with ``shlex``, each ``key=value``
is converted from text to a Python value, and from there the line and the kwargs of the
``gpu_function`` decorator meet in the same checks (``FunctionOptions.__post_init__`` and
``ComputeProfile.__post_init__``). Every error is an ``OptionsError`` that names the
option, says what was wrong and shows how to write it instead; the magics turn it into an
IPython ``UsageError``.

Precedence is defaults < profile < explicit options. An explicit option replaces the
profile's value, with two refinements a notebook user expects: ``env`` merges per variable
(the explicit value of a variable wins), and an explicit ``pip`` or ``conda`` replaces the
profile's whole package set (``pip``, ``conda`` and its ``conda_channels``), because pip
and conda environments are exclusive and mixing them would be an error the user never wrote.

``image``, ``timeout_s`` (default job timeout in seconds), ``state`` (``per_worker`` or
``per_job``: how long the module's state lives, "Warm state") and ``batched`` (the entry takes a chunk's
rows in one call, "Batched functions") are part of a compute profile too.

Over 600 lines: one concern, every option's parsing and check (the magic's words and the Python API's keywords
alike) and its place in a runtime, both ways; each option is a few small functions.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# The wire models' patterns, checked here first for option-shaped messages.
from lancefn_jupyter.wire.models import (
    ENV_NAME_PATTERN,
    NAME_PATTERN,
    PYTHON_VERSION_PATTERN,
    FunctionResourceRequirements,
    PythonEnvironmentSpec,
    PythonRuntimeSpec,
    SecretBinding,
    SecretReference,
    valid_num_gpus,
)
from lancefn_jupyter.wire.quantities import cpu_cores, memory_bytes, quantity_text

__all__ = [
    "ComputeProfile",
    "FunctionOptions",
    "OptionsError",
    "build_options",
    "build_profile",
    "parse_function_line",
    "parse_profile_line",
]

State = Literal["per_worker", "per_job"]
_DIGITS = re.compile(r"[0-9]+")
_NO_SPACES = re.compile(r"\S+")
_MAX_TIMEOUT_S = 1e9
_BOOLEANS = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
# The executor sets these from the job's placement; a user value would fight the scheduler.
_RESERVED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the GPUs come from the job's placement; choose them with num_gpus and gpu_class",
    "NUMBA_ENABLE_CUDASIM": "the simulator is chosen by the GPU class; use a simulated class or .local()",
}

_EXAMPLES = {
    "num_gpus": "num_gpus=1",
    "gpu_class": "gpu_class=default",
    "cpu": "cpu=4 (cores; cpu=500m is half a core)",
    "memory": "memory=16Gi (Ki, Mi, Gi, Ti; or k, M, G, T)",
    "name": "name=my_function",
    "pip": "pip=numpy,scipy",
    "conda": "conda=numba,cudatoolkit",
    "conda_channels": "conda_channels=conda-forge",
    "env": "env=MY_VAR=value",
    "python_version": "python_version=3.12",
    "image": "image=nvcr.io/nvidia/pytorch:24.05-py3",
    "profile": "profile=NAME",
    "register": "register=no",
    "timeout_s": "timeout_s=600",
    "state": "state=per_job",
    "include": "include=mylib.py",
    "batched": "batched=yes",
    "reuse_setup": "reuse_setup=no",
    "secrets": "secret=HF_TOKEN (or secret=hf:HF_TOKEN: secret hf as variable HF_TOKEN)",
}
# A line's other spelling of an option: ``secret=A secret=B`` reads better than ``secrets=``.
_ALIASES = {"secret": "secrets"}
_FUNCTION_KEYS = tuple(_EXAMPLES)
_PER_FUNCTION_KEYS = ("name", "profile", "register", "include", "secrets")
_PROFILE_KEYS = tuple(key for key in _FUNCTION_KEYS if key not in _PER_FUNCTION_KEYS)
_LIST_KEYS = ("pip", "conda", "conda_channels", "env", "include", "secrets")
_PACKAGE_KEYS = ("pip", "conda", "conda_channels")


class OptionsError(ValueError):
    """A bad option; the message names it, says what is wrong and how to write it."""


def _fail(key: str, problem: str, fix: str = "") -> OptionsError:
    return OptionsError(f"{key} {problem}; {fix or 'write ' + _EXAMPLES[key]}")


# --------------------------------------------------------------- checks on Python values
# Each takes the value as given (line text already converted) and returns it normalized.


def _check_num_gpus(value: Any) -> int:
    try:
        return valid_num_gpus(value)  # the wire model's rule, with an option-shaped message
    except ValueError:
        raise _fail("num_gpus", f"must be a whole number ≥ 1 (got {value!r})") from None


def _check_quantity(key: str, value: Any) -> str:
    """A Kubernetes quantity (docs/ARCHITECTURE.md, "Compute resources"), kept as text: it is part of the version."""
    try:
        text = quantity_text(value)
        (cpu_cores if key == "cpu" else memory_bytes)(text)
    except ValueError as error:
        raise OptionsError(str(error)) from None
    return text


def _check_str(key: str, value: Any, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(value, str):
        raise _fail(key, f"must be a string (got {value!r})")
    if not value.strip() or value != value.strip():
        raise _fail(key, f"must be non-empty without surrounding spaces (got {value!r})")
    if pattern is not None and not pattern.fullmatch(value):
        raise _fail(key, f"must be {what} (got {value!r})")
    return value


def _check_name(key: str, value: Any) -> str:
    return _check_str(key, value, NAME_PATTERN, "letters, digits, '_', '.', '-', starting with a letter or '_'")


def _split_specs(text: str) -> list[str]:
    """``"numpy>=1,<2,pkg[a,b]"`` → ``["numpy>=1,<2", "pkg[a,b]"]``.

    A comma separates packages, except inside ``[extras]`` and before a version operator,
    where it belongs to the previous package's requirement.
    """
    pieces = [""]
    depth = 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth <= 0:
            pieces.append("")
        else:
            pieces[-1] += char
    items: list[str] = []
    for piece in (piece.strip() for piece in pieces):
        if items and items[-1] and piece[:1] in ("<", ">", "=", "!", "~"):
            items[-1] += "," + piece
        else:
            items.append(piece)
    return items


def _check_list(key: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) for item in items):
        raise _fail(key, f"must be a string or a list of strings (got {value!r})")
    result: list[str] = []
    for item in items:
        # Commas separate entries in one string; channels never carry version specifiers.
        parts = [part.strip() for part in (item.split(",") if key == "conda_channels" else _split_specs(item))]
        if "" in parts:
            raise _fail(key, f"has an empty entry in {item!r}")
        flags = [part for part in parts if part.startswith("-")]
        if flags:
            raise _fail(key, f"takes names, not command-line flags (got {flags[0]!r})")
        if key == "pip":
            _check_requirements(parts)
        result += parts
    return tuple(dict.fromkeys(result))  # drop repeats, keep order


def _check_requirements(entries: Iterable[str]) -> None:
    """Each pip entry is a PEP 508 requirement: what no server installs (an option line hidden after a line
    break, text that is no requirement) is refused here, before it is registered. Direct references pass: a
    server of one namespace (and ``.local()``) builds them."""
    from lancefn_jupyter.environments.requirements import pip_entry_problem  # packaging: only when pip is given

    for entry in entries:
        problem = pip_entry_problem(entry)
        if problem is not None:
            raise OptionsError(problem)


def _check_env(value: Any) -> tuple[tuple[str, str], ...]:
    pairs = value.items() if isinstance(value, Mapping) else value
    if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Iterable):
        raise _fail("env", f"must be a mapping of names to strings (got {value!r})")
    result: dict[str, str] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(part, str) for part in pair)):
            raise _fail("env", f"must map names to strings (got {pair!r})")
        name, text = pair
        if not ENV_NAME_PATTERN.fullmatch(name):
            raise _fail("env", f"variable name {name!r} is invalid: use letters, digits and '_', no leading digit")
        if name in _RESERVED_ENV:
            raise _fail("env", f"must not set {name}", _RESERVED_ENV[name])
        if name in result and result[name] != text:
            raise _fail("env", f"sets {name} twice ({result[name]!r} and {text!r})", "keep one of them")
        result[name] = text
    return tuple(sorted(result.items()))


def _check_include(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(item, str) and item.strip() for item in items):
        raise _fail("include", f"must be a path or a list of paths (got {value!r})", "write include=mylib.py")
    return tuple(dict.fromkeys(items))  # repeatable; paths may contain commas, so no splitting


def _check_secrets(value: Any) -> tuple[tuple[str, str], ...]:
    """Secret bindings as ``((variable, secret name), ...)`` sorted by variable (docs/ARCHITECTURE.md, "Secrets"):
    from ``"NAME"`` (secret NAME as variable NAME), ``"secret:VARIABLE"``, a list of those, a mapping of variable to
    secret name, or LanceDB's ``EnvVarSecret`` objects."""
    if isinstance(value, str):
        items: list[Any] = [part for part in value.split(",") if part]
    elif isinstance(value, Mapping):
        items = [f"{secret}:{variable}" for variable, secret in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [part for item in value for part in (item.split(",") if isinstance(item, str) else [item]) if part]
    else:
        raise _fail("secrets", f"must be names or secret:VARIABLE pairs (got {type(value).__name__})")
    result: dict[str, str] = {}
    for item in items:
        if hasattr(item, "secret_name") and hasattr(item, "env_variable"):  # lancedb's EnvVarSecret
            secret, variable = item.secret_name, item.env_variable
        elif isinstance(item, tuple) and len(item) == 2:  # already checked: (variable, secret)
            variable, secret = item
        elif isinstance(item, str):
            secret, _, variable = item.partition(":")
            variable = variable or secret
        else:
            raise _fail("secrets", f"must be names or secret:VARIABLE pairs (got {item!r})")
        if not isinstance(secret, str) or not NAME_PATTERN.fullmatch(secret):
            raise _fail("secrets", f"names an invalid secret {secret!r}: use letters, digits, '_', '.', '-'")
        if not isinstance(variable, str) or not ENV_NAME_PATTERN.fullmatch(variable):
            raise _fail("secrets", f"binds an invalid variable name {variable!r}: use letters, digits and '_'")
        if variable in _RESERVED_ENV:
            raise _fail("secrets", f"must not set {variable}", _RESERVED_ENV[variable])
        if result.get(variable, secret) != secret:
            raise _fail("secrets", f"binds {variable} twice ({result[variable]!r} and {secret!r})", "keep one")
        result[variable] = secret
    return tuple(sorted(result.items()))


def _check_timeout(value: Any) -> float:
    # The upper bound (about 31 years) keeps huge ints from overflowing float(); NaN fails both tests.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_TIMEOUT_S:
        raise _fail("timeout_s", f"must be a positive number of seconds up to {_MAX_TIMEOUT_S:.0e} (got {value!r})")
    return float(value)


def _check_state(value: Any) -> State:
    if value not in get_args(State):
        raise _fail("state", f"must be per_worker (the default) or per_job (got {value!r})")
    return value


def _check_register(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail("register", f"must be True or False (got {value!r})", "write register=False to skip registering")
    return value


def _check_batched(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail("batched", f"must be True or False (got {value!r})", "write batched=True (batched=yes in a magic)")
    return value


def _check_reuse_setup(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(
            "reuse_setup",
            f"must be True or False (got {value!r})",
            "write reuse_setup=False (reuse_setup=no in a magic)",
        )
    return value


_CHECKS = {
    "num_gpus": _check_num_gpus,
    "gpu_class": lambda value: _check_name("gpu_class", value),
    "cpu": lambda value: _check_quantity("cpu", value),
    "memory": lambda value: _check_quantity("memory", value),
    "name": lambda value: _check_name("name", value),
    "pip": lambda value: _check_list("pip", value),
    "conda": lambda value: _check_list("conda", value),
    "conda_channels": lambda value: _check_list("conda_channels", value),
    "env": _check_env,
    "python_version": lambda value: _check_str("python_version", value, PYTHON_VERSION_PATTERN, "MAJOR.MINOR"),
    "image": lambda value: _check_str("image", value, _NO_SPACES, "an image reference without spaces"),
    "profile": lambda value: _check_name("profile", value),
    "register": _check_register,
    "timeout_s": _check_timeout,
    "state": _check_state,
    "include": _check_include,
    "batched": _check_batched,
    "reuse_setup": _check_reuse_setup,
    "secrets": _check_secrets,
}


def _normalize(instance: Any, keys: Iterable[str]) -> None:
    """Check and normalize a frozen dataclass's fields in place (``None`` = not set)."""
    for key in keys:
        value = getattr(instance, key)
        if value is not None:
            object.__setattr__(instance, key, _CHECKS[key](value))
    pip, conda, channels = (getattr(instance, key) for key in _PACKAGE_KEYS)
    if pip and conda:
        raise OptionsError(
            f"pip and conda are exclusive (got pip={','.join(pip)} and conda={','.join(conda)}): "
            "an environment is pip or conda; keep one of them"
        )
    if channels and not conda:
        raise OptionsError("conda_channels needs conda packages; add conda=PACKAGES or remove conda_channels")
    both = {variable for variable, _ in getattr(instance, "secrets", None) or ()} & dict(instance.env or ()).keys()
    if both:
        raise OptionsError(
            f"{sorted(both)[0]} is set by env= and bound to a secret; keep the secret (a token belongs in a secret)"
        )


# ------------------------------------------------------------------------- the values


@dataclass(frozen=True)
class ComputeProfile:
    """A reusable set of resource and environment options (``%gpu_profile``); ``None`` = not set."""

    name: str
    num_gpus: int | None = None
    gpu_class: str | None = None
    cpu: str | None = None
    memory: str | None = None
    pip: tuple[str, ...] | None = None
    conda: tuple[str, ...] | None = None
    conda_channels: tuple[str, ...] | None = None
    # repr=False: env values may be secrets and must never be echoed back (repr, %gpu_profile, errors).
    env: tuple[tuple[str, str], ...] | None = field(default=None, repr=False)
    python_version: str | None = None
    image: str | None = None
    timeout_s: float | None = None
    state: State | None = None
    batched: bool | None = None
    reuse_setup: bool | None = None

    def __post_init__(self) -> None:
        try:
            _check_name("profile", self.name)
        except OptionsError:
            raise OptionsError(
                f"profile name {self.name!r} is invalid: use letters, digits, '_', '.', '-'; "
                "write %gpu_profile big_gpu num_gpus=2"
            ) from None
        _normalize(self, _PROFILE_KEYS)

    def options(self) -> dict[str, Any]:
        """The options this profile sets."""
        return {key: getattr(self, key) for key in _PROFILE_KEYS if getattr(self, key) is not None}


@dataclass(frozen=True)
class FunctionOptions:
    """Resolved options of one GPU function (defaults, then profile, then explicit)."""

    num_gpus: int = 1
    gpu_class: str | None = None
    # Host CPU cores and memory per worker (Kubernetes quantities; None: the class's default).
    cpu: str | None = None
    memory: str | None = None
    name: str | None = None
    pip: tuple[str, ...] = ()
    conda: tuple[str, ...] = ()
    conda_channels: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # values may be secrets
    python_version: str | None = None
    image: str | None = None
    profile: str | None = None
    register: bool = True
    timeout_s: float | None = None
    # How long the module's state lives in a worker (docs/ARCHITECTURE.md, "Warm state").
    state: State = "per_worker"
    # Files / packages next to the notebook to ship besides the ones the cell imports (local_modules.py).
    include: tuple[str, ...] = ()
    # The entry takes every row of a chunk in one call (docs/ARCHITECTURE.md, "Batched functions").
    batched: bool = False
    # A new version whose setup part is unchanged runs on the earlier version's live worker (docs/ARCHITECTURE.md,
    # "Setup reuse"); False: always a worker of its own.
    reuse_setup: bool = True
    # Secrets bound to environment variables: ((variable, secret name), ...) (docs/ARCHITECTURE.md, "Secrets").
    secrets: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        _normalize(self, _FUNCTION_KEYS)

    def secret_bindings(self) -> tuple[SecretBinding, ...]:
        """The registration's ``secret_bindings`` (LanceDB 0.40's ``env`` kind), in variable order."""
        return tuple(
            SecretBinding(kind="env", variable=variable, secret_ref=SecretReference(name=secret))
            for variable, secret in self.secrets
        )

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def resources(self) -> FunctionResourceRequirements:
        return FunctionResourceRequirements(
            num_gpus=self.num_gpus, gpu_class=self.gpu_class, cpu=self.cpu, memory=self.memory
        )

    def environment(self) -> PythonEnvironmentSpec:
        return PythonEnvironmentSpec(
            kind="conda" if self.conda else "pip",
            packages=self.conda or self.pip,
            channels=self.conda_channels,
            image=self.image,
        )

    def runtime(self, default_python_version: str) -> PythonRuntimeSpec:
        """The resource-aware runtime (every GPU function is ``python_v2``)."""
        return PythonRuntimeSpec(
            kind="python_v2",
            python_version=self.python_version or default_python_version,
            environment=self.environment(),
            env=self.env_dict,
            resources=self.resources(),
            # per_worker is the default and never encoded, so the version ids of earlier cells stay the same.
            state="per_job" if self.state == "per_job" else None,
            reuse_setup=None if self.reuse_setup else "no",  # the default is never encoded either
        )

    @classmethod
    def from_runtime(
        cls, runtime: PythonRuntimeSpec, *, env: Mapping[str, str] | None = None, **options: Any
    ) -> FunctionOptions:
        """The inverse of :meth:`runtime`: the options a stored runtime was made from (``GpuFunction.from_version``).
        ``env``: the variables' values (default: the runtime's own; a looked-up version's caller passes its own);
        ``options``: what a runtime does not carry (``name``, ``timeout_s``, ``batched``, ``include``, …)."""
        resources, environment = runtime.resources, runtime.environment
        packages = tuple(environment.packages) if environment else ()
        conda = environment is not None and environment.kind == "conda"
        return build_options(
            num_gpus=resources.num_gpus if resources else None,
            gpu_class=resources.gpu_class if resources else None,
            cpu=resources.cpu if resources else None,
            memory=resources.memory if resources else None,
            pip=() if conda else packages,
            conda=packages if conda else (),
            conda_channels=tuple(environment.channels) if environment else (),
            image=environment.image if environment else None,
            python_version=runtime.python_version,
            env=dict(runtime.env or {}) if env is None else env,
            state=runtime.state,
            reuse_setup=runtime.reuse_setup != "no",
            **options,
        )


def _resolve(given: dict[str, Any], profile: ComputeProfile | None) -> FunctionOptions:
    """Apply the ``given`` options over ``profile`` over the defaults."""
    # Checked before merging, so an error names what the user wrote, not a merged value.
    explicit: dict[str, Any] = {key: _CHECKS[key](value) for key, value in given.items()}
    merged = profile.options() if profile is not None else {}
    if "pip" in explicit or "conda" in explicit:
        for key in _PACKAGE_KEYS:
            merged.pop(key, None)
    if "env" in explicit and "env" in merged:
        explicit = {**explicit, "env": tuple(sorted({**dict(merged["env"]), **dict(explicit["env"])}.items()))}
    merged.update(explicit)
    if profile is not None:
        merged["profile"] = profile.name
    return FunctionOptions(**merged)


def _unknown_option(key: str, valid: tuple[str, ...], where: str) -> OptionsError:
    if key in _PER_FUNCTION_KEYS and where == "a profile":
        return OptionsError(
            f"{key} is a per-function option, not allowed in a profile; put it on the %%gpu_function line"
        )
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return OptionsError(f"unknown option {key!r} for {where}; {hint}valid options: {', '.join(sorted(valid))}")


def _lookup_profile(name: str, profiles: Mapping[str, ComputeProfile]) -> ComputeProfile:
    if name not in profiles:
        defined = f"defined profiles: {', '.join(sorted(profiles))}" if profiles else "no profiles are defined yet"
        raise OptionsError(
            f"profile {name!r} is not defined ({defined}); define it with %gpu_profile {name} num_gpus=1 …"
        )
    return profiles[name]


# -------------------------------------------------------------------------- magic lines


def _from_text(key: str, values: list[str]) -> Any:
    """Convert the raw text(s) of one option to the Python value the checks take."""
    if key in _PACKAGE_KEYS or key in ("include", "secrets"):
        return values
    if key == "env":
        pairs = []
        for text in values:
            name, equals, value = text.partition("=")
            if not equals:
                raise _fail("env", f"takes NAME=VALUE (got {text!r})")
            pairs.append((name, value))
        return pairs
    (text,) = values
    if key == "num_gpus":
        if not _DIGITS.fullmatch(text) or len(text) > 10:  # more digits than any uint32
            raise _fail("num_gpus", f"must be a whole number ≥ 1 (got {text!r})")
        return int(text)
    if key in ("register", "batched", "reuse_setup"):
        if text.lower() not in _BOOLEANS:
            raise _fail(key, f"must be yes or no (got {text!r})")
        return _BOOLEANS[text.lower()]
    if key == "timeout_s":
        try:
            return float(text)
        except ValueError:
            raise _fail("timeout_s", f"must be a positive number of seconds (got {text!r})") from None
    return text


def _parse_tokens(tokens: list[str], valid: tuple[str, ...], where: str) -> dict[str, Any]:
    raw: dict[str, list[str]] = {}
    for token in tokens:
        key, equals, value = token.partition("=")
        if not equals:
            if token in valid:
                raise _fail(token, "needs a value")
            raise OptionsError(f"expected key=value, got {token!r}; write options like num_gpus=1 pip=numpy")
        key = _ALIASES.get(key, key) if _ALIASES.get(key) in valid else key
        if key not in valid:
            raise _unknown_option(key, valid, where)
        if key in raw and key not in _LIST_KEYS:
            raise _fail(key, f"is given twice ({raw[key][0]!r} and {value!r})", "keep one of them")
        raw.setdefault(key, []).append(value)
    return {key: _from_text(key, values) for key, values in raw.items()}


def _split_line(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as error:
        raise OptionsError(f"cannot split the options ({error}); close the quote or escape it with \\") from None


def parse_function_line(line: str, profiles: Mapping[str, ComputeProfile]) -> FunctionOptions:
    """Options of a ``%%gpu_function`` line, e.g. ``num_gpus=2 pip=numpy env=A=1 profile=big``."""
    given = _parse_tokens(_split_line(line), _FUNCTION_KEYS, "%%gpu_function")
    profile = _lookup_profile(_check_name("profile", given.pop("profile")), profiles) if "profile" in given else None
    return _resolve(given, profile)


def parse_profile_line(line: str) -> ComputeProfile:
    """A profile from a ``%gpu_profile NAME key=value…`` line."""
    tokens = _split_line(line)
    if not tokens or "=" in tokens[0]:
        raise OptionsError("a profile needs a NAME first; write %gpu_profile big_gpu num_gpus=2 pip=cupy-cuda12x")
    return ComputeProfile(tokens[0], **_parse_tokens(tokens[1:], _PROFILE_KEYS, "a profile"))


# ------------------------------------------------------------------------- Python kwargs


def _given(options: Mapping[str, Any], valid: tuple[str, ...], where: str) -> dict[str, Any]:
    for key in options:
        if key not in valid:
            raise _unknown_option(key, valid, where)

    # None, and an empty list option, mean "not given", so a decorator can forward its keyword
    # defaults (pip=(), env=None, ...) without them overriding a profile.
    def empty(key: str, value: Any) -> bool:
        return key in _LIST_KEYS and isinstance(value, (str, list, tuple, Mapping)) and not value

    return {key: value for key, value in options.items() if value is not None and not empty(key, value)}


def build_options(*, profiles: Mapping[str, ComputeProfile] | None = None, **options: Any) -> FunctionOptions:
    """Options from Python kwargs; ``profile`` is a ``ComputeProfile`` or a name in ``profiles``."""
    given = _given(options, _FUNCTION_KEYS, "gpu_function")
    profile = given.pop("profile", None)
    if profile is not None and not isinstance(profile, ComputeProfile):
        profile = _lookup_profile(_check_name("profile", profile), profiles or {})
    return _resolve(given, profile)


def build_profile(name: str, **options: Any) -> ComputeProfile:
    """A profile from Python kwargs, checked like ``%gpu_profile``."""
    return ComputeProfile(name, **_given(options, _PROFILE_KEYS, "a profile"))
