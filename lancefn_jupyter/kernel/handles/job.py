"""The job handle (`Job`: state, wait, result, cancel, logs) and the errors a job raises.

`f.submit(...)` and `f.map(...)` return a `Job`; `Job.attach(job_id)` re-attaches from any kernel.
While the kernel's event listener runs (client/listener.py), a handle's state stays current without
HTTP (docs/ARCHITECTURE.md, "Client and API (kernel side)").
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lancefn_jupyter.kernel.client import Client, LancefnError
from lancefn_jupyter.kernel.display.jobs import job_card, remote_locals_text
from lancefn_jupyter.kernel.display.live_logs import LiveLog
from lancefn_jupyter.kernel.handles.base import FunctionRef, RecordHandle, waiting
from lancefn_jupyter.kernel.session import current_client, listener, shared_home
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.frames import FAILING_ROWS_MAX_BYTES
from lancefn_jupyter.wire.models import TERMINAL_STATES, JobFailure, JobState, JobTimings, display_state
from lancefn_jupyter.wire.models import Job as JobRecord

__all__ = ["Job", "JobCancelled", "JobError", "JobTimedOut", "RemoteFunctionError", "missing_module_hint"]


LIVE_AFTER_S = 0.3  # a job still running after this long has its prints shown live, polled this often

_NO_MODULE = re.compile(r"No module named '([A-Za-z_][A-Za-z0-9_]*)")


def missing_module_hint(message: str, root: str | None) -> str:
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


def _listener_live() -> bool:
    return listener().is_live()


class Job(RecordHandle[JobRecord]):
    """A handle on one job: state, wait, results, cancel, logs. Cheap to create; safe to re-attach."""

    def __init__(
        self,
        job_id: str,
        *,
        client: Client | None = None,
        function: FunctionRef | None = None,
        single: bool = False,
        snapshot: JobRecord | None = None,
    ):
        self.job_id = job_id
        self.client = client or current_client()
        self.function = function  # maps remote tracebacks to the user's lines; None when attached
        self._single = single
        self._snapshot = snapshot
        self._arrow_results: Any = None
        # Held weakly; while the kernel's event listener runs, it keeps `state` current without HTTP. A job that came
        # back finished (a quick submit) has nothing left to hear, and its entry would stay in the listener for good.
        if snapshot is None or snapshot.job_state not in TERMINAL_STATES:
            listener().subscribe_job(job_id, self._update)

    @classmethod
    def attach(cls, job_id: str, *, client: Client | None = None) -> Job:
        """Re-attach to an existing job (e.g. after a kernel restart). `result()` returns the list of row results."""
        job = cls(job_id, client=client)
        job.refresh()
        return job

    def _describe(self) -> JobRecord:
        return self.client.jobs.describe(self.job_id)

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

    @property
    def timings(self) -> JobTimings | None:
        """Where the job's time went (docs/ARCHITECTURE.md, "Warm state"), once it ended on a worker.

        A `JobTimings` in milliseconds: `queued_ms`, `start_ms` (starting a worker; 0 when one was
        warm), `environment_ms`, `setup_ms` (executing the version's module and a class entry's
        `setup()`; 0 when warm), `run_ms`, and `cold` (a start or a setup was paid). None while the
        job is pending or running, and for a job cancelled before a worker took it.
        `lancefn_jupyter.kernel.display.timings.timings_text` says it in words
        ("cold start 1.2 s, setup 1.0 s", "warm").
        """
        snapshot = self.snapshot
        if snapshot.job_state not in TERMINAL_STATES and not _listener_live():
            snapshot = self.refresh()
        return snapshot.timings

    @property
    def failure(self) -> JobFailure | None:
        """Why the job failed (phase, message, traceback) and what reproduces it (docs/ARCHITECTURE.md, "Debugging a
        failure"): `failing_rows` (`(start, end)`: the failing rows in the job's rows), `rows` (those rows, when kept) and
        `frames` (per remote frame of the user's code: `function`, `line`, `locals` as short reprs). None unless it
        failed or timed out."""
        snapshot = self.snapshot
        if snapshot.job_state not in TERMINAL_STATES and not _listener_live():
            snapshot = self.refresh()
        return snapshot.failure

    def debug(self, commands: Sequence[str] = ()) -> Any:
        """Step into this failed job's failing row here: it runs again through `.local()` (the same artifact; the
        simulator where there is no GPU) and, failing here too, in this kernel under IPython's post-mortem debugger,
        stopped at the failing line; `commands` (e.g. `["p x", "q"]`) run first, as pdb's. The remote locals are
        printed first. Returns the row's result when it ran without error here."""
        failure = self.failure
        if failure is None or self.snapshot.job_state != JobState.FAILED:
            raise LancefnError(f"job {self.job_id} is {self.state}: only a failed job can be debugged")
        if failure.rows is None:
            span = "" if failure.failing_rows is None else " (rows {}…{})".format(*failure.failing_rows)
            raise LancefnError(
                f"job {self.job_id} failed in phase {failure.phase} but kept no failing row{span}: a row is kept "
                f"when the job's rows are JSON and the failing rows' JSON is at most {FAILING_ROWS_MAX_BYTES // 1024} "
                "KiB; call the function's .local(...) on the input yourself, then %debug"
            )
        if self.function is None:
            raise LancefnError(
                f"this handle of job {self.job_id} has no function (attached by id): use %gpu_debug {self.job_id}, "
                "which looks the job's version up"
            )
        if failure.frames:
            print(f"[lancefn] job {self.job_id} failed remotely; its locals there:\n{self._frames_text(self.snapshot)}")
        return self.function.debug_row(failure.rows[0], commands)

    def _frames_text(self, snapshot: JobRecord) -> str:
        """The remote frames' locals, at the user's lines where the function is known."""
        return remote_locals_text(snapshot, self.function.map_traceback if self.function is not None else None)

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the job ends (or `timeout` s). Ctrl-C stops waiting, not the job."""
        if self._snapshot is not None and self._snapshot.job_state in TERMINAL_STATES:
            return self  # a terminal job never changes: no round trip
        with waiting(
            f"Stopped waiting for job {self.job_id}; it keeps running on the control plane. "
            f"Cancel it with Job.attach({self.job_id!r}).cancel() or the Cancel button in %gpu_jobs."
        ):
            self._snapshot = self._wait_showing_logs(timeout)
        return self

    def _wait_showing_logs(self, timeout: float | None) -> JobRecord:
        """Wait; a job still running after ``LIVE_AFTER_S`` has its prints shown under the cell as they come, then
        until it ends (docs/ARCHITECTURE.md, "Live output"). A quicker job costs one request, as before."""
        deadline = None if timeout is None else time.monotonic() + timeout
        first = LIVE_AFTER_S if timeout is None else min(timeout, LIVE_AFTER_S)
        snapshot = self.client.jobs.wait(self.job_id, timeout=first)
        if snapshot.job_state in TERMINAL_STATES or (deadline is not None and time.monotonic() >= deadline):
            return snapshot
        live = LiveLog(self.job_id, self.client.jobs.log_entries)
        try:
            while True:
                live.pull()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return snapshot
                snapshot = self.client.jobs.wait(
                    self.job_id, timeout=LIVE_AFTER_S if left is None else min(left, LIVE_AFTER_S)
                )
                if snapshot.job_state in TERMINAL_STATES:
                    return snapshot
        finally:
            live.close()

    def _batched_form(self) -> str | None:
        """A batched version's output form: its job's result is then the batch in that form (docs/
        ARCHITECTURE.md, "Batched functions"); None for a per-row one, or a job attached without its function."""
        signature = self.function.signature if self.function is not None else None
        return signature.output.form if signature is not None and signature.batched else None

    def result(self, timeout: float | None = None) -> Any:
        """The function's return value (`submit`), or the list of values (`map`); a batched function's
        job: the batch result in its declared form (a list, an `(n, …)` ndarray, a `pyarrow.Array`). Raises on failure."""
        snapshot = self.snapshot
        if snapshot.job_state not in TERMINAL_STATES:
            snapshot = self.wait(timeout).snapshot
        if snapshot.job_state == JobState.DONE:
            results = snapshot.result
            if snapshot.result_format == "arrow":
                if self._arrow_results is None:  # fetched once: the file can be large
                    home = shared_home(self.client)
                    # Mapped, not copied, from the embedded server's file (immutable once renamed): in the
                    # home, or still staged in memory on its way there (docs/ARCHITECTURE.md, "Result staging").
                    table = None
                    name = f"{self.job_id}.arrow"
                    for local in (home / "data" / where / name for where in ("staged", "results")) if home else ():
                        try:
                            table = dataplane.read_ipc(local)
                            break
                        except (OSError, ValueError):  # moving, gone (retention) or unreadable: the server says why
                            continue
                    if table is None:
                        table = dataplane.read_ipc(self.client.jobs.result(self.job_id))
                    self._arrow_results = dataplane.decode_results(table, self._batched_form())
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
        if self.function is not None:
            hint = missing_module_hint(message, self.function.root)
            message, remote_tb = self.function.map_failure(message, remote_tb)
            message += hint
        text = f"job {self.job_id} ({ref}) failed in phase {phase}: {message}"
        if remote_tb:
            text += "\n\nRemote traceback (your code only):\n" + remote_tb
        if failure is not None and failure.frames:
            steps = " (job.debug() steps into the failing row here)" if failure.rows is not None else ""
            text += f"\n\nRemote locals{steps}:\n" + self._frames_text(snapshot)
        return RemoteFunctionError(text, snapshot, phase=phase, remote_traceback=remote_tb)

    def cancel(self) -> bool:
        """Cancel it (pending or running); True if this call cancelled it."""
        cancelled = self.client.jobs.cancel(self.job_id)
        self.refresh()
        return cancelled

    def logs(self, row: int | None = None) -> str:
        """The worker's captured stdout/stderr so far; `row=17`: only what the function printed for row 17 of the
        job's rows (docs/ARCHITECTURE.md, "Live output")."""
        offset, out = 0, []
        while True:
            lines, next_offset = self.client.jobs.logs(self.job_id, offset, row=row)
            out.extend(lines)
            if not lines or next_offset == offset:
                return "\n".join(out)
            offset = next_offset

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        from lancefn_jupyter.kernel.widgets import job_bundle

        return job_bundle(self)

    def __repr__(self) -> str:
        return job_card(self.snapshot)[0]
