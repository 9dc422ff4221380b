"""The function handle: `GpuFunction` (from `%%gpu_function` cells and the `gpu_function` decorator),
its registration, and the calls that run it (`submit`, `map`, `remote`, `local`).

A refused cell binds its name to an `UnregisteredFunction` instead (docs/user-guide.md, "When a cell is refused").
`GpuFunction.from_version` builds the handle of a version looked up from the control plane (`lookup.py`).
Runs in the kernel (docs/ARCHITECTURE.md, "Client and API (kernel side)").

Over 600 lines: one concern, the handle a cell binds (`GpuFunction`: registration, calls, map, local runs and its
display), whose methods share its options and registration state; the leaves it calls are already apart."""

from __future__ import annotations

import hashlib
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from lancefn_jupyter.kernel.client import LancefnEnvironmentWarning, LancefnError
from lancefn_jupyter.kernel.display import cards as display
from lancefn_jupyter.kernel.handles.history import diff_versions
from lancefn_jupyter.kernel.handles.job import Job, missing_module_hint
from lancefn_jupyter.kernel.handles.rows import rows_payload
from lancefn_jupyter.kernel.handles.submit import registered_version, run_job
from lancefn_jupyter.kernel.handles.tracebacks import map_traceback, say_once
from lancefn_jupyter.kernel.options import FunctionOptions, build_options
from lancefn_jupyter.kernel.packaging import (
    PackagedFunction,
    PackagingError,
    entry_name,
    package_cell,
    package_function,
)
from lancefn_jupyter.kernel.session import class_hardware, current_client, profiles, registration_cache
from lancefn_jupyter.wire.frames import short_repr
from lancefn_jupyter.wire.models import FunctionRegistrationRequest, FunctionSignature, FunctionVersion

if TYPE_CHECKING:
    from lancefn_jupyter.kernel.handles.batch import Batch, Estimate
    from lancefn_jupyter.kernel.handles.table_map import Backfill
    from lancefn_jupyter.wire.versions import VersionDiff

__all__ = [
    "GpuFunction",
    "NotRegisteredError",
    "UnregisteredFunction",
    "bind_refused",
    "function_from_cell",
    "gpu_function",
    "request_key",
]

_SHOW_JOB_AFTER_S = 2.0  # ipyparallel's progress_after default: quick calls stay quiet
_UNKNOWN = object()  # a lazily computed attribute not computed yet
# (server URL, request key) → the environment warnings its registration got, so a cached registration (a re-run
# cell) warns again (docs/ARCHITECTURE.md, "Environments")
_environment_warnings: dict[tuple[str, str], tuple[str, ...]] = {}


def _is_lance_table(items: Any) -> bool:
    return type(items).__module__.startswith("lancedb")


def _echo_log(stream: str, lines: list[str]) -> None:
    print("\n".join(lines), file=sys.stderr if stream == "stderr" else sys.stdout)


def request_key(request: FunctionRegistrationRequest) -> str:
    return hashlib.sha256(request.to_canonical_json().encode()).hexdigest()


def _looked_up_stub(fv: FunctionVersion) -> Callable[..., Any]:
    """Stands in for the Python function, which lives in another process: it carries the signature
    (so `submit`/`map` bind arguments as usual) and says what to call instead."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise LancefnError(
            f"{fv.name}@{fv.version} was looked up from the control plane, so its Python function is not "
            f"in this process; call .local(...), .remote(...), .submit(...) or .map(...)"
        )

    stub.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by inspect.signature
        [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in fv.signature.inputs]
    )
    stub.__name__ = stub.__qualname__ = fv.artifact.entrypoint
    return stub


class GpuFunction:
    """A registered (or registrable) function version that still calls the local function.

    `f(x)` runs in this kernel; `f.submit(x)` / `f.map(xs)` / `f.remote(x)` run as jobs on the control
    plane; `f.local(x)` runs the packaged artifact in a subprocess on a local GPU or the CUDA simulator.
    It is the `FunctionRef` its jobs, batches and table maps hold (handles/base.py).

    A class entry (docs/ARCHITECTURE.md, "Warm state") binds its class name to the handle, and the handle
    takes `__call__`'s arguments: `scale(3)` runs one instance made on the first call in this kernel
    (``setup()`` once, as a worker does) and calls it; the jobs send rows as for a function.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        packaged: PackagedFunction,
        options: FunctionOptions,
        *,
        cell_source: str | None = None,
        line_offset: int = 0,
        root: str | None = None,
        where: str = "cell line {}",
        request: FunctionRegistrationRequest | None = None,
    ):
        """`where` labels the user's lines in remote tracebacks; `request` replaces the registration
        request built from `packaged` and `options` (a looked-up version's, env values redacted)."""
        self._fn = fn
        self.root = root  # the notebook's directory, for the missing-local-module hint
        self._packaged = packaged
        self._options = options
        self._cell_source = cell_source
        # Notebook line of the packaged text's line 0 (the magic line, plus any blank lines IPython dropped).
        self._line_offset = line_offset
        self._version: FunctionVersion | None = None
        self._where = where
        self._py_signature: inspect.Signature | None = None
        self._positional: object = _UNKNOWN  # ``_plain_names``, once known
        self._instance: Any = None  # a class entry's kernel-side instance, made on the first call
        self.timeout_s: float | None = options.timeout_s
        self.last_local_device: str | None = None
        # Why the control plane cannot honour the version's environment (its jobs fail with it), from registration
        self.environment_warnings: tuple[str, ...] = ()
        self.name = options.name or packaged.entrypoint
        if request is None:
            request = FunctionRegistrationRequest(
                name=self.name,
                artifact=packaged.artifact_request(),
                signature=packaged.signature,
                runtime=options.runtime(f"{sys.version_info.major}.{sys.version_info.minor}"),
                secret_bindings=options.secret_bindings(),
            )
        self._request = request
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.name)

    @classmethod
    def from_version(cls, fv: FunctionVersion, source: bytes) -> GpuFunction:
        """The handle of a registered version whose artifact text is `source` (what `lookup()` returns)."""
        text = source.decode("utf-8")
        packaged = PackagedFunction(
            source=source,
            digest=fv.artifact.digest,
            entrypoint=fv.artifact.entrypoint,
            signature=fv.signature,
            line_map={i: i for i in range(1, text.count("\n") + 2)},  # the artifact is the user's text here
        )
        runtime = fv.runtime
        options = FunctionOptions.from_runtime(
            runtime,
            env={key: os.environ[key] for key in (runtime.env or {}) if key in os.environ},  # the server redacts values
            name=fv.name,
            batched=fv.signature.batched or None,
            secrets=tuple((b.variable, b.secret_ref.name) for b in fv.secret_bindings if b.variable and b.secret_ref),
        )
        # The registered request (env values redacted), cached as registered: `register()` finds the
        # version there and sends nothing.
        request = FunctionRegistrationRequest(
            name=fv.name,
            artifact=packaged.artifact_request(),
            signature=fv.signature,
            runtime=runtime,
            secret_bindings=fv.secret_bindings,
        )
        registration_cache()[(current_client().url, request_key(request))] = fv
        handle = cls(
            _looked_up_stub(fv),
            packaged,
            options,
            cell_source=text,
            where=f"line {{}} of {fv.name}@{fv.version[:8]}'s source",
            request=request,
        )
        handle.register()
        return handle

    # -- identity
    @property
    def registration_request(self) -> FunctionRegistrationRequest:
        return self._request

    @property
    def artifact_source(self) -> str:
        return self._packaged.source.decode("utf-8")

    @property
    def options(self) -> FunctionOptions:
        return self._options

    @property
    def signature(self) -> FunctionSignature:
        return self._packaged.signature

    @property
    def entrypoint(self) -> str:
        """The name of the function in its artifact (and in the cell)."""
        return self._packaged.entrypoint

    @property
    def version(self) -> FunctionVersion | None:
        """The registered version (registering on first access unless `register=no`)."""
        if self._version is None and self._options.register:
            self.register()
        return self._version

    def register(self) -> FunctionVersion:
        """Register with the current control plane; unchanged requests are not sent again."""
        client = current_client()
        key = (client.url, request_key(self._request))
        cache = registration_cache()
        version = cache.get(key)
        if version is None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", LancefnEnvironmentWarning)
                version = client.functions.register(self._request)
            for other in caught:  # anything else goes on as it came
                if not issubclass(other.category, LancefnEnvironmentWarning):
                    warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
            cache[key] = version
            _environment_warnings[key] = tuple(
                str(w.message) for w in caught if issubclass(w.category, LancefnEnvironmentWarning)
            )
        self._version = version
        self.environment_warnings = _environment_warnings.get(key, ())
        for text in self.environment_warnings:
            warnings.warn(LancefnEnvironmentWarning(text), stacklevel=2)
        return version

    def map_traceback(self, text: str) -> str:
        """Remote frames shown at the user's lines: the notebook cell's, or the .py file's (decorator)."""
        if self._cell_source is not None:
            return map_traceback(
                text, self._packaged, self._cell_source, line_offset=self._line_offset, where=self._where
            )
        filename = getattr(getattr(self._fn, "__code__", None), "co_filename", "<source>")
        return map_traceback(text, self._packaged, None, where=f'File "{filename}", line {{}}')

    def diff(self, old: str | None = None, new: str | None = None) -> VersionDiff:
        """What changed between two versions of this function (default: the last two); prefixes of 6+ chars work."""
        return diff_versions(self.name, old, new)

    def map_failure(self, message: str, traceback: str) -> tuple[str, str]:
        """(message, traceback) at the user's lines, the message said once (compiler errors are long)."""
        traceback = self.map_traceback(traceback)
        return say_once(self.map_traceback(message), traceback), traceback

    # -- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not inspect.isclass(self._fn):
            return self._fn(*args, **kwargs)
        if self._instance is None:
            instance: Any = self._fn()
            if callable(getattr(instance, "setup", None)):
                instance.setup()
            self._instance = instance  # only once setup() succeeded: a failed one runs again next call
        return self._instance(*args, **kwargs)

    def _call_signature(self) -> inspect.Signature:
        """The Python signature rows bind to: the function's, or a class entry's `__call__` without self."""
        if self._py_signature is None:  # cached: a map binds one row per item
            if inspect.isclass(self._fn):
                call = inspect.signature(self._fn.__call__)
                self._py_signature = call.replace(parameters=list(call.parameters.values())[1:])
            else:
                self._py_signature = inspect.signature(self._fn)
        return self._py_signature

    def _row(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        names = self._plain_names()
        if names is not None and not kwargs and len(args) == len(names):  # each parameter given, by position
            return dict(zip(names, args, strict=True))
        try:
            bound = self._call_signature().bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.name}(): {error}") from None
        # Omitted arguments with defaults stay out of the row: the worker applies the default.
        return dict(bound.arguments)

    def _plain_names(self) -> tuple[str, ...] | None:
        """The parameters' names when every one is a plain one without a default (a call giving each by position
        binds as ``zip`` would, without ``Signature.bind``'s cost per call); None otherwise."""
        if self._positional is _UNKNOWN:
            params = self._call_signature().parameters.values()
            plain = all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params)
            self._positional = tuple(p.name for p in params) if plain else None
        return cast("tuple[str, ...] | None", self._positional)

    def _single_parameter(self) -> str | None:
        """The name of the function's only parameter, when it has exactly one plain one."""
        params = list(self._call_signature().parameters.values())
        if len(params) == 1 and params[0].kind in (params[0].POSITIONAL_OR_KEYWORD, params[0].KEYWORD_ONLY):
            return params[0].name
        return None

    def parameter_defaults(self) -> dict[str, Any]:
        """Parameter defaults, to fill the Arrow column of a parameter only some rows of a map give."""
        return {n: p.default for n, p in self._call_signature().parameters.items() if p.default is not p.empty}

    def _init_values(self, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """``init=`` taken out of a call's keywords when the version is created with initialization values (a class
        entry's ``__init__`` arguments: LanceDB 0.40's ``signature.initialization``); else it is a parameter."""
        if not self._packaged.signature.initialization or "init" not in kwargs:
            return None
        return kwargs.pop("init")

    def _submit_rows(
        self, rows: list[dict[str, Any]], single: bool, table: Any = None, init: dict[str, Any] | None = None
    ) -> Job:
        version = registered_version(self)
        json_rows = None
        if table is None:
            json_rows, table = rows_payload(rows, self._packaged.signature, self.name, self.parameter_defaults())
        client = current_client()
        job_id, snapshot = run_job(client, version, json_rows, table, timeout_s=self.timeout_s, init=init)
        return Job(job_id, client=client, function=self, single=single, snapshot=snapshot)

    def _batch_table(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """A batched call's arguments (one batch per parameter) as the rows table of its rows
        (docs/ARCHITECTURE.md, "Batched functions")."""
        from lancefn_jupyter.wire import dataplane

        signature = self._packaged.signature
        try:
            return dataplane.batch_rows(
                self._row(args, kwargs),
                {p.name: p.arrow_type for p in signature.inputs},
                {p.name: p.form or "list" for p in signature.inputs},
                name=self.name,
            )
        except dataplane.DataPlaneError as error:
            raise TypeError(f"{self.name}(): {error}") from None

    def submit(self, *args: Any, **kwargs: Any) -> Job:
        """Run one call as a job; returns at once with a Job handle. A batched function's arguments are
        batches (one call over their rows) and the job's result is the batch result. ``init={...}``: a class
        entry's initialization values (each distinct set is its own instance on a worker)."""
        kwargs = dict(kwargs)
        init = self._init_values(kwargs)
        if self._packaged.signature.batched:
            return self._submit_rows([], single=False, table=self._batch_table(args, kwargs), init=init)
        return self._submit_rows([self._row(args, kwargs)], single=True, init=init)

    def item_row(self, item: Any) -> dict[str, Any]:
        """A map item as a row: a tuple → positional args, a dict → keyword args, else one arg."""
        if isinstance(item, tuple):
            return self._row(item, {})
        if [p.form for p in self._packaged.signature.inputs] == ["record_batch"]:
            if not isinstance(item, Mapping):  # a row of the RecordBatch: its columns' values
                raise TypeError(f"{self.name}.map() over a RecordBatch function takes dict rows, got {item!r}")
            return dict(item)
        if isinstance(item, Mapping):
            return self._row((), item)
        if (single := self._single_parameter()) is not None:
            return {single: item}  # one parameter: no signature binding per item
        return self._row((item,), {})

    def map(
        self,
        items: Iterable[Any],
        *,
        parallel: Any = 1,
        chunk_size: int | None = None,
        retries: int = 0,
        return_exceptions: bool = False,
        fresh: bool = False,
        column: str | list[str] | None = None,
        into: str | None = None,
        key: str | None = None,
        where: str | None = None,
        recompute: str = "missing",
        on_error: str = "fail",
        max_skip_fraction: float = 0.01,
        dry_run: bool = False,
        estimate: bool = False,
        init: dict[str, Any] | None = None,
    ) -> Job | Batch | Backfill | Estimate:
        """Run the function over every item.

        `parallel=1, chunk_size=None` (the default): one job, one row per item (a `Job`).
        `parallel="auto"` or N, a `chunk_size`, `retries`, or `fresh`: a batch of chunk jobs spread
        over the class's GPUs (a `Batch`; docs/ARCHITECTURE.md, "Batches"). A LanceDB table with
        `into=` is a backfill the control plane runs (a `Backfill` with `where`, `recompute`, `on_error`,
        `max_skip_fraction`; docs/ARCHITECTURE.md, "Backfills"); without `into`, a map over `column`.
        `dry_run=True` (or `estimate=True`): nothing runs; an `Estimate` of its rows, chunks, expected time and cost
        from the version's ended jobs (docs/ARCHITECTURE.md, "Cost").
        """
        if dry_run or estimate:
            from lancefn_jupyter.kernel.handles.batch import estimate_batch

            return estimate_batch(self, items, parallel="auto" if parallel == 1 else parallel, chunk_size=chunk_size)
        batch_options: dict[str, Any] = {
            "parallel": parallel,
            "chunk_size": chunk_size,
            "retries": retries,
            "return_exceptions": return_exceptions,
            "fresh": fresh,
        }
        if column is not None or into is not None or key is not None or _is_lance_table(items):
            from lancefn_jupyter.kernel.handles.table_map import map_table

            return map_table(
                self,
                items,
                column=column,
                into=into,
                key=key,
                where=where,
                recompute=recompute,
                on_error=on_error,
                max_skip_fraction=max_skip_fraction,
                init=init,
                **batch_options,
            )
        if parallel == 1 and chunk_size is None and not retries and not fresh:
            rows = [self.item_row(item) for item in items]
            if not rows:
                raise ValueError(f"{self.name}.map() needs at least one item")
            return self._submit_rows(rows, single=False, init=init)
        from lancefn_jupyter.kernel.handles.batch import start_batch

        return start_batch(self, items, **batch_options, init=init)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit, wait and return the result (raises the remote error, mapped to the cell).

        In a notebook, a job still going after ~2 s shows its live widget while this waits.
        """
        job = self.submit(*args, **kwargs)
        from lancefn_jupyter.kernel.widgets import use_widgets

        if use_widgets() and not job.wait(timeout=_SHOW_JOB_AFTER_S).done:
            from IPython.display import display as ipy_display

            ipy_display(job)
        return job.result()

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Run the packaged artifact in a subprocess: local GPU if usable, else numba's CUDA simulator."""
        from lancefn_jupyter.environments.request import EnvironmentRequest
        from lancefn_jupyter.kernel.handles.local_run import LocalRunError, run_local

        if self._packaged.signature.batched:
            json_rows, table = None, self._batch_table(args, kwargs)
        else:
            json_rows, table = rows_payload([self._row(args, kwargs)], self._packaged.signature, self.name)
        env = {**self._options.env_dict, **self._secret_env()}
        version = self._version.version if self._version else "local"
        try:
            run = run_local(
                self._packaged.source,
                self._packaged.entrypoint,
                f"<gpu_function {self.name}@{version}>",
                json_rows or [],
                signature=self._packaged.signature,
                arrow_rows=table,
                packages=self._request.runtime.environment.packages if self._request.runtime.environment else (),
                env=env,
                timeout_s=self.timeout_s,
                on_log=_echo_log,  # the function's prints show up live, as they would in the kernel
                state=self._request.runtime.state or "per_worker",
                environment=EnvironmentRequest.from_runtime(self._request.runtime.to_wire()),
                gpu=bool(self._request.runtime.resources and self._request.runtime.resources.num_gpus),
            )
        except LocalRunError as error:
            message, tb = self.map_failure(error.message, error.traceback or "")
            raise LancefnError(
                f"{self.name}.local() failed in phase {error.phase}: {message}"
                + missing_module_hint(error.message, self.root)
                + (f"\n\nTraceback (your code only):\n{tb}" if tb else "")
            ) from None
        self.last_local_device = run.device
        print(f"[lancefn] {self.name}.local() ran on {run.device}")
        return run.results[0]

    def _secret_env(self) -> dict[str, str]:
        """The bound secrets' values by variable, fetched with the connected key for this ``.local()`` run only (its
        worker's environment: never printed, never kept in the notebook); a missing one is an error naming it and how
        to create it (docs/ARCHITECTURE.md, "Secrets")."""
        bindings = self._request.secret_bindings
        if not bindings:
            return {}
        from lancefn_jupyter.kernel.client import ApiError

        try:
            return current_client().secrets.local_env([binding.to_wire() for binding in bindings])
        except ApiError as error:
            if error.status != 404:
                raise
            raise LancefnError(f"{self.name}.local(): {error.message}") from None

    def debug_row(self, row: dict[str, Any], commands: Sequence[str] = ()) -> Any:
        """A failed job's row again, here (docs/ARCHITECTURE.md, "Debugging a failure"): through ``.local()`` (the same
        artifact; the simulator where there is no GPU); when it fails there too, the row runs once more in this kernel
        and IPython's post-mortem debugger opens at the failing line (``commands`` first, as pdb's rc lines). Returns
        the row's result when it ran without error here."""
        from lancefn_jupyter.kernel.handles.debugging import post_mortem

        if self._packaged.signature.batched:
            raise LancefnError(
                f"{self.name} is a batched function: step into its failing rows with {self.name}.local(...) on them "
                "(job.failure.rows) and %debug; job.debug() re-runs one row of a per-row function"
            )
        try:
            result = self.local(**row)
        except LancefnError as error:
            print(f"[lancefn] the row fails here too: {error}\n[lancefn] stepping into it in this kernel")
        else:
            print(
                f"[lancefn] the failing row ran without error here (result: {short_repr(result)}): the failure "
                "depends on the remote machine (its GPU, its environment, the state of its warm worker); the remote "
                "locals are in job.failure.frames"
            )
            return result
        version = self._version.version if self._version else "local"
        post_mortem(
            self._packaged.source,
            self._packaged.entrypoint,
            f"<gpu_function {self.name}@{version}>",
            row,
            self._packaged.signature,
            commands,
            self._options.env_dict,
        )
        return None

    # -- display
    def card(self) -> tuple[str, str]:
        """(text, HTML) of the function card: version, digest, resources, environment, hardware."""
        runtime = self._request.runtime
        resources = runtime.resources
        env = runtime.environment
        packages = ", ".join(env.packages) if env and env.packages else "no packages"
        environment = f"{env.kind}: {packages}" if env else "-"
        if runtime.env:
            environment += f"; env: {', '.join(sorted(runtime.env))}"  # names only: values may be secrets
        if self._packaged.local_modules:
            environment += f"; local modules: {', '.join(self._packaged.local_modules)}"
        version = self._version
        note = "" if version is not None else "not registered (register=no): the request is in .registration_request"
        if version is not None and self.environment_warnings:
            note = "; ".join(f"warning: {text}" for text in self.environment_warnings)
        entry = ""
        if self._packaged.entry_is_class:
            entry = f"class {self.entrypoint}"
            if self._packaged.entry_has_setup:
                entry += f": setup once per {'job' if runtime.state == 'per_job' else 'worker'}"
        source = self._packaged.source.decode("utf-8")
        return display.function_card(
            name=self.name,
            version=version.version if version else None,
            digest=self._packaged.digest,
            runtime_kind=runtime.kind,
            num_gpus=resources.num_gpus if resources else 0,
            gpu_class=resources.gpu_class if resources else None,
            cpu=resources.cpu if resources else None,
            memory=resources.memory if resources else None,
            environment=environment,
            hardware=class_hardware(resources.gpu_class if resources else None) if version is not None else None,
            note=note,
            entry=entry,
            left_out=self._left_out_text(),
            batched=self._packaged.signature.batched,
            setup=display.setup_text(source, self.entrypoint, runtime.state, runtime.reuse_setup),
            secrets=", ".join(
                f"{b.secret_ref.name} as {b.variable}" if b.secret_ref.name != b.variable else b.variable
                for b in self._request.secret_bindings
                if b.secret_ref is not None
            ),
        )

    def _left_out_text(self) -> str:
        """The cell's statements not in the artifact, at notebook lines (as tracebacks number them)."""
        return "; ".join(
            f"line {line + self._line_offset}, {display.one_line(text)}" for line, text in self._packaged.left_out
        )

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from lancefn_jupyter.kernel.widgets import function_card_bundle

        return function_card_bundle(self)

    def __repr__(self) -> str:
        return self.card()[0]


class NotRegisteredError(LancefnError):
    """A job method was called on the handle of a `%%gpu_function` cell that was refused."""


class UnregisteredFunction:
    """What a refused `%%gpu_function` cell binds its entry name to (docs/user-guide.md, "When a cell is refused").

    The cell ran, so calling it runs the plain function in this kernel, as it would without the magic;
    `submit` / `map` / `remote` / `local` / `register` / `version` raise the registration error again
    instead of an AttributeError, so a stale name never looks like a GPU function.
    """

    def __init__(self, fn: Callable[..., Any], name: str, error: str):
        self.__wrapped__ = fn
        self.__name__ = name
        self.__doc__ = getattr(fn, "__doc__", None)
        self.error = error

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__wrapped__(*args, **kwargs)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise NotRegisteredError(f"{self.__name__} is not registered: {self.error}\nFix the cell and run it again.")

    submit = map = remote = local = register = _refuse

    @property
    def version(self) -> Any:
        return self._refuse()

    def __getattr__(self, attribute: str) -> Any:
        # Any other public GpuFunction attribute (.name, .artifact_source, …): the same error, not an
        # AttributeError. Private names stay AttributeErrors, as display and introspection expect.
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        return self._refuse()

    def __repr__(self) -> str:
        return f"{self.__name__}: not registered ({self.error}); fix the cell and run it again"


def bind_refused(namespace: dict, cell: str, options: FunctionOptions, error: str) -> UnregisteredFunction | None:
    """After a refused cell: bind its entry name (if the cell defined it) to an `UnregisteredFunction`."""
    name = entry_name(cell, options.name)
    if name is None:
        return None
    fn = namespace.get(name)
    if isinstance(fn, (GpuFunction, UnregisteredFunction)):
        fn = fn.__wrapped__
    if not callable(fn):
        return None
    handle = UnregisteredFunction(fn, name, error)
    namespace[name] = handle
    return handle


def function_from_cell(
    cell: str,
    namespace: Mapping[str, Any],
    options: FunctionOptions,
    *,
    line_offset: int = 0,
    root: str | None = None,
) -> GpuFunction:
    """Package an already-executed cell and build its handle (the magic's core, usable from Python).

    `line_offset` is how many notebook lines precede `cell`'s first line (remote tracebacks use it).
    `root` is the notebook's directory (default: the kernel's working directory, which Jupyter sets to
    it): modules the cell uses from files under it, and `options.include`, ship inside the artifact.
    """
    from lancefn_jupyter.kernel.local_modules import LocalModuleError, collect

    packaged = package_cell(cell, namespace, entry=options.name, batched=options.batched)
    root = root or os.getcwd()
    try:
        modules = collect(cell, namespace, packaged.captured, root, options.include)
    except LocalModuleError as error:
        raise PackagingError(str(error)) from None
    if modules:
        packaged = package_cell(cell, namespace, entry=options.name, modules=modules, batched=options.batched)
    fn = namespace[packaged.entrypoint]
    if isinstance(fn, GpuFunction):  # the cell's def ran, so this is only a stale handle if re-bound
        fn = fn.__wrapped__
    handle = GpuFunction(fn, packaged, options, cell_source=cell, line_offset=line_offset, root=root)
    if options.register:
        handle.register()
    return handle


def gpu_function(
    fn: Callable[..., Any] | None = None,
    *,
    num_gpus: int | None = None,
    gpu_class: str | None = None,
    cpu: float | str | None = None,
    memory: int | str | None = None,
    name: str | None = None,
    pip: Iterable[str] | str = (),
    conda: Iterable[str] | str = (),
    conda_channels: Iterable[str] | str = (),
    env: Mapping[str, str] | None = None,
    python_version: str | None = None,
    image: str | None = None,
    profile: str | None = None,
    register: bool = True,
    timeout_s: float | None = None,
    state: str | None = None,
    batched: bool | None = None,
    reuse_setup: bool | None = None,
    secrets: Iterable[Any] | Mapping[str, str] | str | None = None,
) -> GpuFunction | Callable[[Callable[..., Any]], GpuFunction]:
    """Decorator form of `%%gpu_function` for .py code; the same options, the same validation.

    It decorates a function, or a class entry (a class with `__call__`, docs/ARCHITECTURE.md, "Warm state")
    packaged from its source file.

    Registration is lazy here (first `.version`, `.submit`, `.map`, `.remote` or `.register()`), so
    importing a module never starts a server.
    """
    # Every keyword above is an option of the same name (the explicit signature is for help() and IDEs).
    given = {key: value for key, value in locals().items() if key != "fn"}
    options = build_options(**given, profiles=profiles())

    def wrap(function: Callable[..., Any]) -> GpuFunction:
        return GpuFunction(function, package_function(function, batched=options.batched), options)

    return wrap(fn) if fn is not None else wrap
