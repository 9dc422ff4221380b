"""The Python API behind the magics: connections, GPU function handles, job handles, profiles.

Everything a magic does is reachable from here, for scripts and tests:

    from lancefn_jupyter import gpu_function, connect, list_gpu_classes
    @gpu_function(num_gpus=1, pip=["numpy"])
    def double(x: float) -> float: ...
    double.submit(2.0).result()

Connection rule (docs/ARCHITECTURE.md, "Connection rule"): an explicit `connect(url, api_key)`, else `LANCEFN_URL`/`LANCEFN_API_KEY`,
else the embedded control plane under `$LANCEFN_HOME`, started on first use and reused afterwards
(the state lives in `session.py`; this module re-exports it).

Size: over 600 lines because `GpuFunction` and `Job` are the user's two handles and each method is
short; the next split along the seam is functions (`GpuFunction`, `gpu_function`, `lookup`) vs jobs.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

from . import dataplane, display
from .batch import Batch, BatchChunkError, BatchError
from .client import Client, Forbidden, LancefnError
from .models import (
    TERMINAL_STATES,
    FunctionRegistrationRequest,
    FunctionVersion,
    GpuClass,
    JobState,
    display_state,
)
from .models import (
    Job as JobRecord,
)
from .options import ComputeProfile, FunctionOptions, build_options, build_profile
from .packaging import PackagedFunction, PackagingError, entry_name, package_cell, package_function
from .session import ConnectionInfo, _session, connect, connection_info, current_client, stop_local, use_local  # noqa: F401  (ConnectionInfo: re-exported)
from .tracebacks import map_traceback

if TYPE_CHECKING:
    from .versions import VersionDiff, VersionHistory

__all__ = [
    "connect",
    "use_local",
    "stop_local",
    "current_client",
    "connection_info",
    "list_gpu_classes",
    "list_versions",
    "list_jobs",
    "gpu_profile",
    "add_profile",
    "profiles",
    "gpu_function",
    "function_from_cell",
    "GpuFunction",
    "UnregisteredFunction",
    "NotRegisteredError",
    "Job",
    "Batch",
    "BatchError",
    "BatchChunkError",
    "JobError",
    "RemoteFunctionError",
    "JobCancelled",
    "JobTimedOut",
    "lookup",
    "diff_versions",
    "version_history",
]


# ---------------------------------------------------------------------------------------- connection


def _gpu_class(name: Optional[str]) -> Optional[GpuClass]:
    """Hardware of a class for display; None when unknown or the key may not list classes."""
    name = name or "default"
    with _session.lock:
        if name not in _session.classes:
            try:
                _session.classes = {c.name: c for c in current_client().gpu.classes()}
            except Forbidden:
                return None
        return _session.classes.get(name)


# ------------------------------------------------------------------------------------ rich listings


class _Rendered(list):
    """A list of models that shows as a table (text and HTML) in notebooks, or as a live widget."""

    def __init__(
        self,
        items: Iterable[Any],
        render: Callable[[], tuple[str, str]],
        widget: Optional[Callable[[], Any]] = None,
    ):
        super().__init__(items)
        self._render = render
        self._make_widget = widget
        self._widget: Any = None

    def _repr_mimebundle_(self, include=None, exclude=None):
        if self._make_widget is not None:
            from .widgets import rich_bundle

            def make():
                if self._widget is None or getattr(self._widget, "comm", None) is None:
                    self._widget = self._make_widget()
                return self._widget

            return rich_bundle(make, self._render)
        text, markup = self._render()
        return {"text/plain": text, "text/html": markup}

    def __repr__(self) -> str:
        return self._render()[0]


def list_gpu_classes() -> list[GpuClass]:
    """The deployment's GPU classes (hardware), shown with live busy/free when displayed."""
    client = current_client()
    classes = client.gpu.classes()
    usage = client.gpu.usage()
    return _Rendered(
        classes,
        lambda: display.gpu_classes_table(classes, usage),
        widget=lambda: _widget("GpuClassesWidget", classes, usage, client=client),
    )


def list_versions(name: Optional[str] = None) -> list:
    """Registered function versions (with definitions), optionally of one name."""
    listings = list(current_client().functions.list(name, include_definition=True))
    rows = [(item.name, item.version, item.definition) for item in listings]
    return _Rendered(listings, lambda: display.versions_table(rows))


def list_jobs(*, state: Optional[str] = None, name: Optional[str] = None, limit: int = 50) -> list:
    """Recent `run_function` jobs, newest first."""
    client = current_client()
    jobs = client.jobs.list(state=state, name=name, job_type="run_function", limit=limit)
    batches = _recent_batches(client, name)
    if batches:  # batch rows above the jobs (their chunk jobs are among the jobs)
        from .batch_display import batches_table

        def render() -> tuple[str, str]:
            (bt, bh), (jt, jh) = batches_table(batches), display.jobs_table(jobs)
            return f"{bt}\n\n{jt}", bh + jh

        return _Rendered(jobs, render, widget=lambda: _jobs_with_batches(batches, state, name, limit, client))
    return _Rendered(
        jobs,
        lambda: display.jobs_table(jobs),
        widget=lambda: _widget("JobsDashboard", state=state, name=name, limit=limit, client=client),
    )


_BATCH_ROWS = 5  # recent batches `%gpu_jobs` shows


def _recent_batches(client: Client, name: Optional[str]) -> list:
    try:
        return client.batches.list(name=name, limit=_BATCH_ROWS)
    except LancefnError:  # a server without batches, or a key without the privilege
        return []


def _jobs_with_batches(batches: list, state: Optional[str], name: Optional[str], limit: int, client: Client) -> Any:
    import ipywidgets

    rows = [_widget("BatchWidget", batch.batch_id, client=client) for batch in batches]
    return ipywidgets.VBox([*rows, _widget("JobsDashboard", state=state, name=name, limit=limit, client=client)])


def _widget(kind: str, *args: Any, **kwargs: Any) -> Any:
    from . import widgets

    return getattr(widgets, kind)(*args, **kwargs)


# ------------------------------------------------------------------------------------------ profiles


def gpu_profile(name: str, **options: Any) -> ComputeProfile:
    """Define (or replace) a reusable compute profile; `gpu_function(profile=name)` uses it."""
    return add_profile(build_profile(name, **options))


def add_profile(profile: ComputeProfile) -> ComputeProfile:
    """Define (or replace) a profile already built (what `%gpu_profile NAME key=value…` does)."""
    _session.profiles[profile.name] = profile
    return profile


def profiles() -> dict[str, ComputeProfile]:
    return dict(_session.profiles)


# ------------------------------------------------------------------------------------------- errors


class JobError(LancefnError):
    """A job did not produce results."""

    def __init__(self, message: str, job: JobRecord):
        self.job = job
        self.job_id = job.job_id
        super().__init__(message)


class RemoteFunctionError(JobError):
    """The function raised (or failed to import/run); the traceback shows the cell's own lines."""

    def __init__(self, message: str, job: JobRecord, *, phase: str, remote_traceback: str):
        self.phase = phase
        self.remote_traceback = remote_traceback
        super().__init__(message, job)


class JobCancelled(JobError):
    pass


class JobTimedOut(JobError):
    pass


# -------------------------------------------------------------------------------------- job handles


def _listener_live() -> bool:
    from .widgets import get_listener

    return get_listener().is_live()


_SHOW_JOB_AFTER_S = 2.0  # ipyparallel's progress_after default: quick calls stay quiet
# `functions/run` holds its reply up to this long so a quick job comes back finished in that one
# round trip; short, so a loop of submits of long jobs barely waits (a queued job answers at once).
_SUBMIT_WAIT_S = 0.02


class Job:
    """A handle on one job: state, wait, results, cancel, logs. Cheap to create; safe to re-attach."""

    def __init__(
        self,
        job_id: str,
        *,
        client: Optional[Client] = None,
        function: Optional["GpuFunction"] = None,
        single: bool = False,
        snapshot: Optional[JobRecord] = None,
    ):
        self.job_id = job_id
        self._client = client or current_client()
        self._function = function
        self._single = single
        self._snapshot = snapshot
        self._arrow_results: Optional[list] = None
        self._widget: Any = None
        # Held weakly; while the widgets' event listener runs, it keeps `state` current without HTTP.
        from .widgets import get_listener

        get_listener().subscribe_job(job_id, self._update)

    @classmethod
    def attach(cls, job_id: str, *, client: Optional[Client] = None) -> "Job":
        """Re-attach to an existing job (e.g. after a kernel restart). `result()` returns the list of row results."""
        job = cls(job_id, client=client)
        job.refresh()
        return job

    @property
    def snapshot(self) -> JobRecord:
        """The job as last seen (fetched if never seen)."""
        if self._snapshot is None:
            self.refresh()
        assert self._snapshot is not None
        return self._snapshot

    def refresh(self) -> JobRecord:
        self._snapshot = self._client.jobs.describe(self.job_id)
        return self._snapshot

    def _update(self, snapshot: JobRecord) -> None:
        """Newer state from elsewhere (the event listener); never goes backwards."""
        if self._snapshot is None or self._snapshot.job_state not in TERMINAL_STATES:
            self._snapshot = snapshot

    @property
    def state(self) -> str:
        """pending, running, finished, failed, cancelled or timed out (as of the last refresh)."""
        snapshot = self.snapshot
        if snapshot.job_state not in TERMINAL_STATES and not _listener_live():
            snapshot = self.refresh()
        return display_state(snapshot.job_state)

    @property
    def done(self) -> bool:
        return self.snapshot.job_state in TERMINAL_STATES

    def wait(self, timeout: Optional[float] = None) -> "Job":
        """Block until the job ends (or `timeout` s). Ctrl-C stops waiting, not the job."""
        if self._snapshot is not None and self._snapshot.job_state in TERMINAL_STATES:
            return self  # a terminal job never changes: no round trip
        try:
            self._snapshot = self._client.jobs.wait(self.job_id, timeout=timeout)
        except KeyboardInterrupt:
            print(
                f"Stopped waiting for job {self.job_id}; it keeps running on the control plane. "
                f"Cancel it with Job.attach({self.job_id!r}).cancel() or the Cancel button in %gpu_jobs.",
                file=sys.stderr,
            )
            raise
        return self

    def result(self, timeout: Optional[float] = None) -> Any:
        """The function's return value (`submit`), or the list of values (`map`); raises on failure."""
        snapshot = self.snapshot
        if snapshot.job_state not in TERMINAL_STATES:
            snapshot = self.wait(timeout).snapshot
        if snapshot.job_state == JobState.DONE:
            results = snapshot.result
            if snapshot.result_format == "arrow":
                if self._arrow_results is None:  # fetched once: the file can be large
                    home = _shared_home(self._client)
                    local = home / "data" / "results" / f"{self.job_id}.arrow" if home else None
                    # Mapped, not copied, from the embedded server's file (immutable once renamed).
                    try:
                        table = dataplane.read_ipc(local) if local is not None else None
                    except (OSError, ValueError):  # gone (retention) or unreadable: the server says why
                        table = None
                    if table is None:
                        table = dataplane.read_ipc(self._client.jobs.result(self.job_id))
                    self._arrow_results = dataplane.decode_results(table)
                results = self._arrow_results
            return results[0] if self._single and isinstance(results, list) and len(results) == 1 else results
        if snapshot.job_state not in TERMINAL_STATES:
            raise TimeoutError(f"job {self.job_id} is still {display_state(snapshot.job_state)} after {timeout}s")
        raise self._error(snapshot)

    def _error(self, snapshot: JobRecord) -> JobError:
        ref = f"{snapshot.spec.get('name', '?')}@{snapshot.spec.get('version', '?')}"
        if snapshot.job_state == JobState.CANCELLED:
            return JobCancelled(f"job {self.job_id} ({ref}) was cancelled", snapshot)
        failure = snapshot.failure
        if snapshot.job_state == JobState.TIMED_OUT:
            detail = f": {failure.message}" if failure else ""
            return JobTimedOut(f"job {self.job_id} ({ref}) timed out{detail}", snapshot)
        phase = failure.phase if failure else "unknown"
        message = failure.message if failure else "no failure details"
        remote_tb = (failure.traceback or "") if failure else ""
        if self._function is not None:
            hint = _missing_module_hint(message, self._function._root)
            message, remote_tb = self._function._map_failure(message, remote_tb)
            message += hint
        text = f"job {self.job_id} ({ref}) failed in phase {phase}: {message}"
        if remote_tb:
            text += "\n\nRemote traceback (your code only):\n" + remote_tb
        return RemoteFunctionError(text, snapshot, phase=phase, remote_traceback=remote_tb)

    def cancel(self) -> bool:
        """Cancel it (pending or running); True if this call cancelled it."""
        cancelled = self._client.jobs.cancel(self.job_id)
        self.refresh()
        return cancelled

    def logs(self) -> str:
        """The worker's captured stdout/stderr so far."""
        lines, offset, out = [], 0, []
        while True:
            lines, next_offset = self._client.jobs.logs(self.job_id, offset)
            out.extend(lines)
            if not lines or next_offset == offset:
                return "\n".join(out)
            offset = next_offset

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .widgets import job_bundle

        return job_bundle(self)

    def __repr__(self) -> str:
        return display.job_card(self.snapshot)[0]


# --------------------------------------------------------------------------------- function handles


_NO_MODULE = re.compile(r"No module named '([A-Za-z_][A-Za-z0-9_]*)")


def _missing_module_hint(message: str, root: Optional[str]) -> str:
    """For `No module named 'X'`: say whether X is a file next to the notebook that was not shipped."""
    match = _NO_MODULE.search(message)
    if match is None or root is None:
        return ""
    name = match.group(1)
    for candidate in (Path(root) / f"{name}.py", Path(root) / name):
        if candidate.exists():
            return (
                f". Note: {name!r} is a local module ({candidate.name} next to the notebook) that was not "
                f"shipped with this version, so no package needs declaring: import it in the cell, or add "
                f"include={candidate.name} to %%gpu_function, and run the cell again"
            )
    return f". {name!r} is not a file next to the notebook, so it is a package to declare (pip=/conda=)"


def _is_lance_table(items: Any) -> bool:
    return type(items).__module__.startswith("lancedb")


def _echo_log(stream: str, lines: list[str]) -> None:
    print("\n".join(lines), file=sys.stderr if stream == "stderr" else sys.stdout)


def _request_key(request: FunctionRegistrationRequest) -> str:
    return hashlib.sha256(request.to_canonical_json().encode()).hexdigest()


def _to_json_value(value: Any, where: str) -> Any:
    """Arguments travel as JSON; numpy values are converted, anything else is refused up front."""
    if hasattr(value, "tolist") and callable(value.tolist):
        value = value.tolist()
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"argument {where} cannot be sent to a GPU function job ({error}); pass JSON values "
            "(numbers, strings, bools, None, lists and dicts of them)"
        ) from None
    return value


def _rows_payload(
    rows: list[dict[str, Any]], signature: Any, name: str, defaults: Optional[Mapping[str, Any]] = None
) -> tuple[Optional[list[dict[str, Any]]], Any]:
    """(JSON rows, None) or (None, Arrow table of the rows): Arrow when a parameter or the return
    is an array / Arrow type, or a value JSON cannot carry (NaN, ±Inf); JSON for small plain rows."""
    types = {p.name: p.arrow_type for p in signature.inputs}
    if not dataplane.uses_data_plane(types.values(), signature.output.arrow_type):
        try:
            return [{k: _to_json_value(v, f"{k!r} of {name}") for k, v in row.items()} for row in rows], None
        except TypeError as json_error:
            try:
                return None, dataplane.encode_rows(rows, types, name=name, defaults=defaults)
            except (dataplane.DataPlaneError, ImportError):
                raise json_error from None
    try:
        return None, dataplane.encode_rows(rows, types, name=name, defaults=defaults)
    except dataplane.DataPlaneError as error:
        raise TypeError(f"{name}(): {error}") from None


def _shared_home(client: Client) -> Optional[Path]:
    """The embedded server's home when `client` talks to it: Arrow rows and results are then
    handed over as files in ``$HOME/data`` instead of bytes over HTTP (docs/ARCHITECTURE.md)."""
    info = _session.info
    if info is None or not info.embedded or not info.home or client is not _session.client:
        return None
    return Path(info.home)


class GpuFunction:
    """A registered (or registrable) function version that still calls the local function.

    `f(x)` runs in this kernel; `f.submit(x)` / `f.map(xs)` / `f.remote(x)` run as jobs on the control
    plane; `f.local(x)` runs the packaged artifact in a subprocess on a local GPU or the CUDA simulator.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        packaged: PackagedFunction,
        options: FunctionOptions,
        *,
        cell_source: Optional[str] = None,
        line_offset: int = 0,
        root: Optional[str] = None,
    ):
        self._fn = fn
        self._root = root  # the notebook's directory, for the missing-local-module hint
        self._packaged = packaged
        self._options = options
        self._cell_source = cell_source
        # Notebook line of the packaged text's line 0 (the magic line, plus any blank lines IPython dropped).
        self._line_offset = line_offset
        self._version: Optional[FunctionVersion] = None
        self._line_label = "cell line {}"  # looked-up handles name the artifact's lines instead
        self._py_signature: Optional[inspect.Signature] = None
        self.timeout_s: Optional[float] = options.timeout_s
        self.last_local_device: Optional[str] = None
        self.name = options.name or packaged.entrypoint
        self._request = FunctionRegistrationRequest(
            name=self.name,
            artifact=packaged.artifact_request(),
            signature=packaged.signature,
            runtime=options.runtime(f"{sys.version_info.major}.{sys.version_info.minor}"),
        )
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", self.name)

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
    def version(self) -> Optional[FunctionVersion]:
        """The registered version (registering on first access unless `register=no`)."""
        if self._version is None and self._options.register:
            self.register()
        return self._version

    def register(self) -> FunctionVersion:
        """Register with the current control plane; unchanged requests are not sent again."""
        client = current_client()
        key = (client.url, _request_key(self._request))
        version = _session.registered.get(key)
        if version is None:
            version = client.functions.register(self._request)
            _session.registered[key] = version
        self._version = version
        return version

    def _map_traceback(self, text: str) -> str:
        """Remote frames shown at the user's lines: the notebook cell's, or the .py file's (decorator)."""
        if self._cell_source is not None:
            return map_traceback(
                text, self._packaged, self._cell_source, line_offset=self._line_offset, where=self._line_label
            )
        filename = getattr(getattr(self._fn, "__code__", None), "co_filename", "<source>")
        return map_traceback(text, self._packaged, None, where=f'File "{filename}", line {{}}')

    def diff(self, old: Optional[str] = None, new: Optional[str] = None) -> "VersionDiff":
        """What changed between two versions of this function (default: the last two); prefixes of 6+ chars work."""
        return diff_versions(self.name, old, new)

    def _map_failure(self, message: str, traceback: str) -> tuple[str, str]:
        """(message, traceback) at the user's lines, the message said once (compiler errors are long)."""
        from .tracebacks import say_once

        traceback = self._map_traceback(traceback)
        return say_once(self._map_traceback(message), traceback), traceback

    # -- calling
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def _row(self, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        try:
            if self._py_signature is None:  # cached: a map binds one row per item
                self._py_signature = inspect.signature(self._fn)
            bound = self._py_signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self.name}(): {error}") from None
        # Omitted arguments with defaults stay out of the row: the worker applies the default.
        return dict(bound.arguments)

    def _single_parameter(self) -> Optional[str]:
        """The name of the function's only parameter, when it has exactly one plain one."""
        if self._py_signature is None:
            self._py_signature = inspect.signature(self._fn)
        params = list(self._py_signature.parameters.values())
        if len(params) == 1 and params[0].kind in (params[0].POSITIONAL_OR_KEYWORD, params[0].KEYWORD_ONLY):
            return params[0].name
        return None

    def _defaults(self) -> dict[str, Any]:
        """Parameter defaults, to fill the Arrow column of a parameter only some rows of a map give."""
        if self._py_signature is None:
            self._py_signature = inspect.signature(self._fn)
        return {n: p.default for n, p in self._py_signature.parameters.items() if p.default is not p.empty}

    def _submit_rows(self, rows: list[dict[str, Any]], single: bool) -> Job:
        version = self.version
        if version is None:
            raise LancefnError(f"{self.name} was defined with register=no; call {self.name}.register() first")
        json_rows, table = _rows_payload(rows, self._packaged.signature, self.name, self._defaults())
        client = current_client()
        if table is None:
            snapshot = client.functions.run_job(
                version.name, version.version, json_rows, timeout_s=self.timeout_s, wait_s=_SUBMIT_WAIT_S
            )
            return Job(snapshot.job_id, client=client, function=self, single=single, snapshot=snapshot)
        if (home := _shared_home(client)) is not None:
            name = f"{uuid.uuid4().hex}.arrow"
            dataplane.write_ipc_file(home / "data" / "uploads" / name, table, durable=False)
            job_id = client.functions.run(version.name, version.version, None, timeout_s=self.timeout_s, rows_file=name)
        else:
            job_id = client.functions.run(
                version.name, version.version, None, timeout_s=self.timeout_s, arrow=dataplane.to_ipc_bytes(table)
            )
        return Job(job_id, client=client, function=self, single=single)

    def submit(self, *args: Any, **kwargs: Any) -> Job:
        """Run one call as a job; returns at once with a Job handle."""
        return self._submit_rows([self._row(args, kwargs)], single=True)

    def _item_row(self, item: Any) -> dict[str, Any]:
        """A map item as a row: a tuple → positional args, a dict → keyword args, else one arg."""
        if isinstance(item, tuple):
            return self._row(item, {})
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
        chunk_size: Optional[int] = None,
        retries: int = 0,
        return_exceptions: bool = False,
        fresh: bool = False,
        column: Optional[str] = None,
        into: Optional[str] = None,
        key: Optional[str] = None,
    ) -> Any:
        """Run the function over every item.

        `parallel=1, chunk_size=None` (the default): one job, one row per item (a `Job`).
        `parallel="auto"` or N, a `chunk_size`, `retries`, or `fresh`: a batch of chunk jobs spread
        over the class's GPUs (a `Batch`; docs/ARCHITECTURE.md, "Batches"). A LanceDB table with
        `column=` reads that column; `into=` writes the results back as a new column (rows matched on `key`,
        default `column`).
        """
        if column is not None or into is not None or key is not None or _is_lance_table(items):
            from .tables import map_table

            return map_table(
                self,
                items,
                column=column,
                into=into,
                key=key,
                parallel=parallel,
                chunk_size=chunk_size,
                retries=retries,
                return_exceptions=return_exceptions,
                fresh=fresh,
            )
        if parallel == 1 and chunk_size is None and not retries and not fresh:
            rows = [self._item_row(item) for item in items]
            if not rows:
                raise ValueError(f"{self.name}.map() needs at least one item")
            return self._submit_rows(rows, single=False)
        from .batch import start_batch

        return start_batch(
            self,
            items,
            parallel=parallel,
            chunk_size=chunk_size,
            retries=retries,
            return_exceptions=return_exceptions,
            fresh=fresh,
        )

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit, wait and return the result (raises the remote error, mapped to the cell).

        In a notebook, a job still going after ~2 s shows its live widget while this waits.
        """
        job = self.submit(*args, **kwargs)
        from .widgets import use_widgets

        if use_widgets() and not job.wait(timeout=_SHOW_JOB_AFTER_S).done:
            from IPython.display import display as ipy_display

            ipy_display(job)
        return job.result()

    def local(self, *args: Any, **kwargs: Any) -> Any:
        """Run the packaged artifact in a subprocess: local GPU if usable, else numba's CUDA simulator."""
        from .local import LocalRunError, run_local

        json_rows, table = _rows_payload([self._row(args, kwargs)], self._packaged.signature, self.name)
        env = self._options.env_dict
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
            )
        except LocalRunError as error:
            message, tb = self._map_failure(error.message, error.traceback or "")
            raise LancefnError(
                f"{self.name}.local() failed in phase {error.phase}: {message}"
                + _missing_module_hint(error.message, self._root)
                + (f"\n\nTraceback (your code only):\n{tb}" if tb else "")
            ) from None
        self.last_local_device = run.device
        print(f"[lancefn] {self.name}.local() ran on {run.device}")
        return run.results[0]

    # -- display
    def _card(self) -> tuple[str, str]:
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
        return display.function_card(
            name=self.name,
            version=version.version if version else None,
            digest=self._packaged.digest,
            runtime_kind=runtime.kind,
            num_gpus=resources.num_gpus if resources else 0,
            gpu_class=resources.gpu_class if resources else None,
            environment=environment,
            hardware=_gpu_class(resources.gpu_class if resources else None) if version is not None else None,
            note=note,
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        from .widgets import function_card_bundle

        return function_card_bundle(self)

    def __repr__(self) -> str:
        return self._card()[0]


class NotRegisteredError(LancefnError):
    """A job method was called on the handle of a `%%gpu_function` cell that was refused."""


class UnregisteredFunction:
    """What a refused `%%gpu_function` cell binds its entry name to (README, "When a cell is refused").

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


def bind_refused(namespace: dict, cell: str, options: FunctionOptions, error: str) -> Optional[UnregisteredFunction]:
    """After a refused cell: bind its entry name (if the cell defined it) to an `UnregisteredFunction`."""
    name = entry_name(cell, options.name)
    fn = namespace.get(name) if name else None
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
    root: Optional[str] = None,
) -> GpuFunction:
    """Package an already-executed cell and build its handle (the magic's core, usable from Python).

    `line_offset` is how many notebook lines precede `cell`'s first line (remote tracebacks use it).
    `root` is the notebook's directory (default: the kernel's working directory, which Jupyter sets to
    it): modules the cell uses from files under it, and `options.include`, ship inside the artifact.
    """
    from .local_modules import LocalModuleError, collect

    packaged = package_cell(cell, namespace, entry=options.name)
    root = root or os.getcwd()
    try:
        modules = collect(cell, namespace, packaged.captured, root, options.include)
    except LocalModuleError as error:
        raise PackagingError(str(error)) from None
    if modules:
        packaged = package_cell(cell, namespace, entry=options.name, modules=modules)
    fn = namespace[packaged.entrypoint]
    if isinstance(fn, GpuFunction):  # the cell's def ran, so this is only a stale handle if re-bound
        fn = fn.__wrapped__
    handle = GpuFunction(fn, packaged, options, cell_source=cell, line_offset=line_offset, root=root)
    if options.register:
        handle.register()
    return handle


def gpu_function(
    fn: Optional[Callable[..., Any]] = None,
    *,
    num_gpus: Optional[int] = None,
    gpu_class: Optional[str] = None,
    name: Optional[str] = None,
    pip: Iterable[str] | str = (),
    conda: Iterable[str] | str = (),
    conda_channels: Iterable[str] | str = (),
    env: Optional[Mapping[str, str]] = None,
    python_version: Optional[str] = None,
    image: Optional[str] = None,
    profile: Optional[str] = None,
    register: bool = True,
    timeout_s: Optional[float] = None,
):
    """Decorator form of `%%gpu_function` for .py code; the same options, the same validation.

    Registration is lazy here (first `.version`, `.submit`, `.map`, `.remote` or `.register()`), so
    importing a module never starts a server.
    """
    options = build_options(
        num_gpus=num_gpus,
        gpu_class=gpu_class,
        name=name,
        pip=pip,
        conda=conda,
        conda_channels=conda_channels,
        env=env,
        python_version=python_version,
        image=image,
        profile=profile,
        register=register,
        timeout_s=timeout_s,
        profiles=_session.profiles,
    )

    def wrap(function: Callable[..., Any]) -> GpuFunction:
        return GpuFunction(function, package_function(function), options)

    return wrap(fn) if fn is not None else wrap


# ------------------------------------------------------------------------- versions from anywhere


def _registered_versions(client: Client, name: str) -> list[FunctionVersion]:
    """Live versions of `name` with definitions, registration order (oldest first)."""
    return [item.definition for item in client.functions.list(name, include_definition=True) if item.definition]


def _pick_version(name: str, prefix: Optional[str], known: list[FunctionVersion]) -> FunctionVersion:
    from .versions import resolve_version

    version = resolve_version(name, prefix, [fv.version for fv in known])
    return next(fv for fv in known if fv.version == version)


def _looked_up_stub(fv: FunctionVersion) -> Callable[..., Any]:
    """Stands in for the Python function, which lives in another process: it carries the signature
    (so `submit`/`map` bind arguments as usual) and says what to call instead."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise LancefnError(
            f"{fv.name}@{fv.version} was looked up from the control plane, so its Python function is not "
            f"in this process; call .local(...), .remote(...), .submit(...) or .map(...)"
        )

    stub.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in fv.signature.inputs]
    )
    stub.__name__ = stub.__qualname__ = fv.artifact.entrypoint
    return stub


def lookup(ref: str) -> GpuFunction:
    """A handle on a registered version from any kernel or script: `lookup("name")` (newest) or
    `lookup("name@1a2b3c")` (a unique version prefix of 6+ characters).

    It has `submit`, `map`, `remote`, `local`, `version`, `diff` and the card. Env values are secrets the
    control plane never returns: `.local()` takes each env name's value from this process's environment.
    """
    from .versions import parse_ref

    name, prefix = parse_ref(ref)
    client = current_client()
    fv = _pick_version(name, prefix, _registered_versions(client, name))
    source = client.functions.artifact(fv.name, fv.version)
    text = source.decode("utf-8")
    packaged = PackagedFunction(
        source=source,
        digest=fv.artifact.digest,
        entrypoint=fv.artifact.entrypoint,
        signature=fv.signature,
        line_map={i: i for i in range(1, text.count("\n") + 2)},  # the artifact is the user's text here
    )
    runtime, resources = fv.runtime, fv.runtime.resources
    environment = runtime.environment
    packages = tuple(environment.packages) if environment else ()
    options = build_options(
        name=fv.name,
        num_gpus=resources.num_gpus if resources else None,
        gpu_class=resources.gpu_class if resources else None,
        pip=packages if environment is None or environment.kind == "pip" else (),
        conda=packages if environment is not None and environment.kind == "conda" else (),
        conda_channels=tuple(environment.channels) if environment else (),
        image=environment.image if environment else None,
        python_version=runtime.python_version,
        env={key: os.environ[key] for key in (runtime.env or {}) if key in os.environ},
    )
    handle = GpuFunction(_looked_up_stub(fv), packaged, options, cell_source=text)
    handle._line_label = f"line {{}} of {fv.name}@{fv.version[:8]}'s source"
    # The registered request (env values redacted): `register()` finds the version here and sends nothing.
    handle._request = FunctionRegistrationRequest(
        name=fv.name, artifact=packaged.artifact_request(), signature=fv.signature, runtime=runtime
    )
    _session.registered[(client.url, _request_key(handle._request))] = fv
    handle._version = fv
    return handle


def version_history(name: str, *, limit: int = 50) -> "VersionHistory":
    """`%gpu_versions NAME`: the newest `limit` versions, newest first, each with its one-line change
    and lookup snippet (one request: the control plane reads the artifacts)."""
    from .client import NotFound
    from .versions import HistoryRow, VersionHistory, resolve_version

    try:
        functions = current_client().functions.history(name, limit=limit)
    except NotFound:
        resolve_version(name, None, [])  # raises the kernel's wording: "no function named …"
    rows = [
        HistoryRow(name, r["version"], r.get("created_at", ""), r.get("change", ""), r.get("snippet", ""))
        for f in functions
        if f["name"] == name
        for r in f["versions"]
    ]
    return VersionHistory(name, rows)


def diff_versions(name: str, old: Optional[str] = None, new: Optional[str] = None) -> "VersionDiff":
    """Source diff and runtime differences between two versions of `name`.

    Default: the newest version against the one before; with only `old`, `old` against the newest.
    Versions may be unique prefixes of 6+ characters.
    """
    from .versions import diff_pair
    from .versions import diff_versions as diff

    client = current_client()
    known = {fv.version: fv for fv in _registered_versions(client, name)}
    old_id, new_id = diff_pair(name, list(known), old, new)
    sources = [client.functions.artifact(name, v).decode("utf-8") for v in (old_id, new_id)]
    return diff(known[old_id], known[new_id], *sources)
