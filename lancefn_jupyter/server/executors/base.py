"""Executor interface: the one seam between the control plane and whatever runs workers.

The core (``server/plane.py``) decides *where* a job runs (class + devices, via the pure
scheduler) and hands the executor a fully resolved :class:`TaskSpec`.  The executor only
runs it and reports back through :class:`ExecutorCallbacks`, from any thread it likes; the
core is thread-safe and ignores callbacks for jobs that are already terminal (cancel races).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lancefn_jupyter.server.policy.resources import NO_REQUEST, ResourceRequest
from lancefn_jupyter.wire.task_models import TaskData  # an empty one is the default

if TYPE_CHECKING:  # avoid importing pydantic models just to type-annotate the interface
    import asyncio

    from lancefn_jupyter.environments.builders import BuildUser
    from lancefn_jupyter.environments.cache import Environment
    from lancefn_jupyter.environments.request import EnvironmentRequest
    from lancefn_jupyter.server.executors.table_agent import TableAgents
    from lancefn_jupyter.wire.backfill_models import TableSlice
    from lancefn_jupyter.wire.models import JobFailure

__all__ = ["REDACTED", "Executor", "ExecutorCallbacks", "InlineRun", "TaskSpec", "redact_env"]

REDACTED = "<redacted>"
# Shorter values are flags ("1", "on") rather than secrets, and replacing them would garble text.
_MIN_SECRET_CHARS = 4


def redact_env(text: str, envs: Iterable[Mapping[str, str]]) -> str:
    """``text`` with every value of the given function ``env`` mappings replaced by ``<redacted>``.

    Error messages and Ray's own log lines may quote a task's environment (a failed
    ``runtime_env`` setup prints it); function env values must never be echoed.
    """
    values = {value for env in envs for value in env.values() if len(value) >= _MIN_SECRET_CHARS}
    for value in sorted(values, key=len, reverse=True):  # longest first: one may contain another
        text = text.replace(value, REDACTED)
    return text


@dataclass(frozen=True)
class TaskSpec:
    """Everything an executor needs to run one job; no lookups back into the core."""

    job_id: str
    name: str
    version: str
    artifact: bytes
    entrypoint: str
    rows: list[dict]
    devices: tuple[str, ...]  # device ids chosen by the scheduler ("0", "1", … or "sim0", …)
    simulated: bool  # True → run with NUMBA_ENABLE_CUDASIM=1 instead of real GPUs
    gpu_class: str | None  # None for CPU functions (runtime kind "python")
    num_gpus: int  # 0 for CPU functions
    env: dict[str, str]  # the function's runtime env; never logged
    packages: tuple[str, ...]  # declared pip/conda packages that must be importable
    timeout_s: float | None
    # The owning namespace: a worker process (or Ray actor) only ever serves one (namespace, name, version).
    namespace: str = "default"
    # The Arrow data plane's worker-protocol fields (input_types, output_type, result_file,
    # rows_file when the rows are an Arrow file and ``rows`` is empty, rows_total); see
    # docs/ARCHITECTURE.md "Worker protocol".  Empty: plain JSON rows and results, as before.
    data: TaskData = field(default_factory=TaskData)
    # How long the module's state lives on a worker: "per_worker" (executed once, kept for the
    # worker's life) or "per_job" (docs/ARCHITECTURE.md, "Warm state").
    state: str = "per_worker"
    # What the version asks of its Python (docs/ARCHITECTURE.md, "Environments"); None: no environment named.
    environment: EnvironmentRequest | None = None
    # The environment the plane built for it (``builds_environments`` executors): its workers start
    # ``venv.python``; None: the control plane's own interpreter.
    venv: Environment | None = None
    # A backfill chunk's rows are a slice of a Lance table instead of ``rows`` / ``rows_file``
    # (docs/ARCHITECTURE.md, "Backfills"); the local executor reads it into ``data.rows_file`` off the job
    # table's lock, a Ray task reads it in the Ray worker.
    table_slice: TableSlice | None = None
    # ``timeout_s`` is the server's maximum job run time (``--max-job-run-s``), not one the job asked for: its
    # TIMED_OUT message names the flag (docs/ARCHITECTURE.md, "Scheduling").
    timeout_limit: bool = False
    # The host CPU and memory its worker is given and held to (docs/ARCHITECTURE.md, "Compute resources").
    resources: ResourceRequest = NO_REQUEST
    # The version's setup digest (docs/ARCHITECTURE.md, "Setup reuse"): an idle worker of another version of the same
    # (namespace, name) with the same digest may run it, rebinding its code; None: a worker of its own only.
    setup_digest: str | None = None

    @property
    def rows_total(self) -> int:
        return len(self.rows) if self.data.rows_total is None else self.data.rows_total


class ExecutorCallbacks(Protocol):
    """Implemented by the core; executors call these from their own threads."""

    def task_started(self, job_id: str, *, devices: tuple[str, ...], node: str | None) -> None: ...

    def task_progress(self, job_id: str, rows_done: int) -> None: ...

    # ``rows``: each line's row in the job's rows (None: printed outside a row), when the worker tagged them
    def task_log(
        self, job_id: str, stream: str, lines: list[str], rows: Sequence[int | None] | None = None
    ) -> None: ...

    # ``timings``: the job's ``start_ms``/``setup_ms``/``run_ms`` (and ``cold``) as the executor and
    # worker measured them (docs/ARCHITECTURE.md, "Warm state"); None when no worker ran it.
    def task_succeeded(
        self, job_id: str, results: list | Mapping[str, Any], *, timings: Mapping[str, Any] | None = None
    ) -> None: ...  # JSON results or an Arrow result-file reference

    def task_failed(
        self, job_id: str, failure: JobFailure, *, timings: Mapping[str, Any] | None = None
    ) -> None:  # phase "timeout" → TIMED_OUT
        ...

    def hold_now(self) -> Callable[[], None] | None:
        """The core's locks (the job table's, the store's) taken only if they are free now, for reports made on the
        event loop, which never waits (``InlineRun.follow_on_loop``): their release, or None when either is busy."""
        ...

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The server's event loop, where an executor may read its workers' events (the Ray bridge's); None when
        there is none (the core runs without a server)."""
        ...

    def usage_changed(self) -> None:
        """The executor's part of ``/v1/gpu/usage`` changed (its capacity, nodes, idle warm workers): a ``usage``
        event goes out. Callable with or without the core's locks."""
        ...


class InlineRun(Protocol):
    """A launched task that the thread which launched it runs itself (``Executor.launch_inline``)."""

    def run(self, deadline: float) -> None:
        """Run it until it ends or ``deadline`` (``time.monotonic()``) passes; then the executor follows it on."""

    def leave_to_executor(self) -> None:
        """Not run here after all: the executor runs it as any launched task."""

    def follow_on_loop(self, deadline: float) -> None:
        """(On the event loop, the core's locks held.) Start it here and follow it on the loop, reporting as the
        core's locks allow (``ExecutorCallbacks.hold_now``); what could wait goes to the executor's own threads, as
        it does once ``deadline`` (``time.monotonic()``) passes. Never waits."""


class Executor(ABC):
    """Runs tasks; never decides placement (the core's scheduler does)."""

    name: str
    # True: the executor queues and places jobs itself (Ray: the cluster decides where and when).
    # The core then launches every job at once without picking devices, keeps it PENDING until
    # ``task_started``, and reports ``capacity()`` as the GPUs per class in ``/v1/gpu/usage``.
    owns_queue: bool = False
    # True (local): the plane builds a version's environment in its cache before placing its jobs, and hands it
    # as ``TaskSpec.venv``. False (Ray): the executor's cluster builds it (docs/ARCHITECTURE.md, "Environments").
    builds_environments: bool = False
    # Who reads a team's backfill slice on a shared server (a slice that names its table ``root``), set by the plane
    # (docs/ARCHITECTURE.md, "Backfills", "Which tables"); None: no such slice reaches this executor.
    table_agents: TableAgents | None = None

    @abstractmethod
    def start(self, callbacks: ExecutorCallbacks) -> None:
        """Called once before any launch; keep ``callbacks`` for reporting."""

    @abstractmethod
    def launch(self, task: TaskSpec) -> None:
        """Start running ``task``; must not block on the task itself, nor on I/O or a lock held across either: the
        event loop launches the jobs it queues (``Intake.admit_on_loop``)."""

    def launch_inline(self, task: TaskSpec) -> InlineRun | None:
        """Launch ``task`` for the calling thread to run (``InlineRun.run``) when that is quick to start (a warm
        worker of its version is idle on its devices), so a quick job's inline wait needs no other thread; None:
        not launched (call :meth:`launch`). The caller must run what it gets, or leave it to the executor."""
        return None

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Stop the job's worker if any; the core has already marked it CANCELLED."""

    def capacity(self) -> dict[str, int] | None:
        """GPUs per class when the executor knows better than the config (Ray); else None."""
        return None

    def pending_reason(self, gpu_class: str | None, num_gpus: int) -> str | None:
        """Why a job of this shape cannot start now although its class allows it (Ray: no node
        is big enough); None when it simply waits its turn."""
        return None

    def scaling(self) -> dict[str, dict[str, int]] | None:
        """Per class an autoscaler scales: ``nodes_up``, ``nodes_starting``, ``nodes_max`` (shown in
        ``/v1/gpu/usage``), and ``next_up_ms`` (epoch ms) while a node starts and its start can be told from recent
        ones; None when no class scales."""
        return None

    def limit_namespaces(self, caps: Mapping[str, int]) -> None:
        """Namespace → the most GPUs it may hold at once (``max_gpus``, "Scheduling"), set by the plane: an executor
        that asks a cluster for capacity asks for no more than that."""
        return None

    def environment_problem(self, request: EnvironmentRequest) -> str | None:
        """Why this executor cannot honour ``request`` (a registration warning; its jobs fail in phase
        ``environment`` with it), or None. Must be quick: it is asked on registration."""
        return None

    def environment_builder(self, namespace: str) -> BuildUser | None:
        """Whom the plane builds ``namespace``'s environments as (``builds_environments`` executors): the user its
        workers run as when that is not the server's (docs/ARCHITECTURE.md, "Environments"); None: the server's
        own user. May raise (no uid left for the namespace)."""
        return None

    def idle_retire_ms(self, class_of: Mapping[str, str]) -> list[tuple[str, int]]:
        """Each idle worker that holds a version: its GPU class and when it retires unused (epoch ms), for the
        usage's ``warm_retire_ms``; ``class_of``: device id → class, for executors that place on device sets; []
        when unknown."""
        return []

    def warm_devices(self, namespace: str, name: str, version: str) -> list[tuple[str, ...]]:
        """Device sets whose idle worker already holds this version (its module executed), so the
        scheduler can prefer them (docs/ARCHITECTURE.md, "Warm state"); [] when unknown."""
        return []

    @abstractmethod
    def shutdown(self) -> None:
        """Stop all workers; called once on server shutdown."""
