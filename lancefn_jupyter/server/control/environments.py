"""The plane's environment stage (docs/ARCHITECTURE.md, "Environments"): before a job is queued for devices,
its version's environment must be ready.  Runs in the control plane, with the job table's lock held, except
the builds, which run on a thread each (one per cache key) and take the lock to report.

For executors that build environments (``Executor.builds_environments``: local), a job is *admitted*:

- refused (``executor.environment_problem``) → the machine fails it in phase ``environment`` at once;
- ready (no environment needed, or the cache has it) → queued as before, its environment leased until it ends
  (one lease per environment for all of the plane's active jobs of it, closed when the last one ends:
  :meth:`EnvironmentStage.forget`, a journal forgetter; a lease per job would cost a file descriptor per queued
  job);
- else it waits here, PENDING and in no device queue (no GPU is held), while one build per key runs
  (``EnvironmentCache.ensure``), whose output lines go to every waiting job's logs (stream ``system``,
  ``[env] ``); built → the machine queues the jobs (FIFO among themselves), leased; failed →
  each fails in phase ``environment`` with the build's message.  No failure is kept: the next job builds again.

Executors that do not build (Ray) only get the refusal check.  The refusal check also refuses pip entries that
are not requirements, and direct references where the server does not allow them (a version registered before
the rule).  A namespace's environments are built as the user its workers run as
(``Executor.environment_builder``), which is part of the key.  The decision for a version (its request, the
refusal, whether it needs a build and its key) is made once and kept (``_plans``), so a version without
packages costs one dictionary lookup per job.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lancefn_jupyter.environments.request import EnvironmentRequest
from lancefn_jupyter.environments.requirements import pip_problem
from lancefn_jupyter.server.control.catalog import stored_definition, stored_version
from lancefn_jupyter.server.control.jobtable import JobTable
from lancefn_jupyter.server.control.journal import JobJournal
from lancefn_jupyter.server.control.states import PENDING
from lancefn_jupyter.server.control.vault import SecretVault
from lancefn_jupyter.server.storage.store import JobRecord, Store
from lancefn_jupyter.wire.models import JobFailure, SecretBinding

if TYPE_CHECKING:
    from lancefn_jupyter.environments.builders import BuildUser
    from lancefn_jupyter.environments.cache import Environment, EnvironmentCache

__all__ = ["Admission", "EnvironmentStage"]

log = logging.getLogger("lancefn.server")

LOG_PREFIX = "[env] "
_PLANS_KEPT = 1024  # versions whose decision is kept (a version's definition never changes)
REFRESH_S = 10.0  # while a build runs, its waiting jobs' events say how long so far this often

# (namespace, name, version)
_Owner = tuple[str, str, str]


@dataclass(frozen=True)
class _Plan:
    """What a version's jobs need, decided once: refused, nothing (``key`` None), or the environment ``key``."""

    request: EnvironmentRequest | None
    problem: str | None = None
    key: str | None = None
    gpu: bool = False  # a GPU function: an environment of another Python gets the GPU stack (numba-cuda)
    builder: BuildUser | None = None  # whom it is built as (None: the server's user)
    transient: bool = False  # the decision failed on an error of ours: ask again for the next version
    secrets: tuple[SecretBinding, ...] = ()  # the version's bound secrets: each must exist when a job is admitted


@dataclass(frozen=True)
class Admission:
    """The stage's answer for one job (computed before the table's lock is taken: it may touch the cache).

    ``ready``: queue it (with ``venv``/``lease`` when it runs in a built environment); ``problem``: fail it;
    else it must wait for the build of ``plan.key``."""

    plan: _Plan
    ready: bool
    venv: Environment | None = None
    lease: int | None = None
    since: float = field(default_factory=time.monotonic)  # when it was asked: a waiting job's wait starts then

    @property
    def problem(self) -> str | None:
        return self.plan.problem


@dataclass(eq=False)
class _Build:
    key: str
    request: EnvironmentRequest
    gpu: bool
    builder: BuildUser | None
    started: float = field(default_factory=time.monotonic)
    waiters: dict[str, tuple[JobRecord, float]] = field(default_factory=dict)  # job id → (job, joined at), FIFO
    lines: list[str] = field(default_factory=list)  # its output so far, for jobs that join late

    def reason(self) -> str:
        return f"building environment ({self.request.describe()}, {time.monotonic() - self.started:.0f} s so far)"


class EnvironmentStage:
    def __init__(
        self,
        table: JobTable,
        *,
        store: Store,
        journal: JobJournal,
        cache: EnvironmentCache | None,
        allow_direct_references: bool = True,
        secrets: SecretVault | None = None,
    ):
        """``allow_direct_references``: pip entries ``NAME @ URL`` are built (a server of one namespace, or
        ``--allow-direct-references``); else refused. ``secrets``: whose bound secrets a job's admission checks."""
        self.table, self.store, self.journal, self.cache = table, store, journal, cache
        self.secrets = secrets
        self.allow_direct_references = allow_direct_references
        # The machine's, bound by the plane: queue built jobs (lock held), fail a job in phase "environment".
        self.enqueue: Callable[[list[JobRecord]], None] = lambda recs: None
        self.fail: Callable[[JobRecord, JobFailure], None] = lambda rec, failure: None
        self._plans: OrderedDict[_Owner, _Plan] = OrderedDict()
        self._plans_lock = threading.Lock()
        self._by_request: dict[tuple[EnvironmentRequest, bool, BuildUser | None], _Plan] = {}  # oldest first
        self._builds: dict[str, _Build] = {}  # key → the build under way
        self._waiting: dict[str, _Build] = {}  # job id → the build it waits for
        self._held: dict[str, Environment] = {}  # job id → the environment it runs in (leased)
        self._leases: dict[str, list[int]] = {}  # key → [the plane's lease fd, active jobs of it]
        # key → the environment last found or built: a job of it takes a lease (which fails once it was evicted)
        # without asking the cache to look it up (that re-derives the key: milliseconds per job).
        self._known: dict[str, Environment] = {}
        self._closed = False

    # ------------------------------------------------------------------ decisions

    def problem(self, request: EnvironmentRequest) -> str | None:
        """A pip entry this server does not install, else the executor's refusal of ``request`` (a registration
        warning), or None; an executor error is none."""
        entries = pip_problem(request.pip, direct_references=self.allow_direct_references)
        if entries is not None:
            return entries
        executor = self.table.executor
        if executor is None:
            return None
        try:
            return executor.environment_problem(request)
        except Exception:
            log.exception("executor.environment_problem(%r) failed; treating it as no problem", request)
            return None

    def request(self, rec: JobRecord) -> EnvironmentRequest | None:
        """The job's version's ``EnvironmentRequest`` (None: its runtime names no environment nor Python)."""
        return self._plan(rec).request

    def plain(self, rec: JobRecord) -> bool:
        """Whether the job's version is known to need no environment: its admission then reads nothing (the event
        loop may ask it, ``Intake.admit_on_loop``). A version not decided yet is not known to."""
        with self._plans_lock:
            plan = self._plans.get((rec.namespace, rec.spec.get("name", ""), rec.spec.get("version", "")))
        return plan is not None and plan.key is None and plan.problem is None

    def _plan(self, rec: JobRecord) -> _Plan:
        owner = (rec.namespace, rec.spec.get("name", ""), rec.spec.get("version", ""))
        with self._plans_lock:
            plan = self._plans.get(owner)
            if plan is not None:
                self._plans.move_to_end(owner)
                return plan
        plan = self._decide(owner)
        row = self.store.get_version(*owner[1:], owner[0])
        if row is not None and (bindings := stored_version(row.definition).secret_bindings):
            plan = dataclasses.replace(plan, secrets=bindings)  # per version: plans are shared across versions
        with self._plans_lock:
            self._plans[owner] = plan
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return plan

    def _decide(self, owner: _Owner) -> _Plan:
        """A version's plan: from its definition, and decided once per (request, gpu, builder): versions of the
        same environment (a notebook's edits) share the decision, so a new one costs no cache work."""
        namespace, name, version = owner
        row = self.store.get_version(name, version, namespace)
        if row is None:  # the launch says so; nothing to prepare
            return _Plan(None)
        definition = stored_definition(row.definition)
        runtime = definition.get("runtime") or {}
        if not runtime.get("environment") and not runtime.get("python_version"):
            return _Plan(None)
        request = EnvironmentRequest.from_runtime(runtime, definition.get("environment_digest") or "")
        gpu = bool((runtime.get("resources") or {}).get("num_gpus"))
        try:
            builder = self._builder(namespace)
        except Exception as error:  # no uid left for the namespace: its jobs fail until the operator widens the range
            return _Plan(request, problem=str(error), transient=True)
        with self._plans_lock:
            known = self._by_request.get((request, gpu, builder))
        if known is not None:
            return known
        plan = self._decide_request(request, gpu, builder, f"{name}@{version}")
        if plan.transient:
            return plan
        with self._plans_lock:
            self._by_request[(request, gpu, builder)] = plan
            while len(self._by_request) > _PLANS_KEPT:
                self._by_request.pop(next(iter(self._by_request)))
        return plan

    def _builder(self, namespace: str) -> BuildUser | None:
        """Whom the namespace's environments are built as: its workers' user when the plane builds them."""
        executor = self.table.executor
        if self.cache is None or executor is None or not executor.builds_environments:
            return None
        return executor.environment_builder(namespace)

    def _decide_request(self, request: EnvironmentRequest, gpu: bool, builder: BuildUser | None, what: str) -> _Plan:
        problem = self.problem(request)
        if problem:
            return _Plan(request, problem=problem)
        executor, cache = self.table.executor, self.cache
        if cache is None or executor is None or not executor.builds_environments:
            return _Plan(request)
        try:
            if not cache.needs_build(request):
                return _Plan(request)
            return _Plan(request, key=cache.key(request, gpu=gpu, builder=builder), gpu=gpu, builder=builder)
        except Exception as error:
            log.exception("deciding the environment of %s failed", what)
            return _Plan(
                request,
                problem=f"the control plane could not prepare this version's environment: {error}",
                transient=True,
            )

    def admission(self, rec: JobRecord) -> Admission:
        """What to do with a job of ``rec``'s version now (call without the table's lock: it may read the cache).
        A ready job's lease is the caller's to :meth:`hold` or :meth:`close`."""
        since = time.monotonic()
        plan = self._plan(rec)  # the first job of a version decides it (the cache reads the base's packages)
        if plan.secrets and self.secrets and (missing := self.secrets.missing(rec.namespace, plan.secrets)):
            return Admission(_Plan(plan.request, problem=missing), ready=False)  # fails at once ("Secrets")
        if plan.problem is not None or plan.key is None:
            return Admission(plan, ready=plan.problem is None)
        assert self.cache is not None and plan.request is not None  # a key comes from the cache
        env = self._known.get(plan.key)
        if env is not None and plan.key in self._leases:  # leased for other jobs now: it cannot be evicted
            return Admission(plan, ready=True, venv=env)
        try:
            lease = self.cache.lease(env) if env is not None else None
            if lease is None:  # not known here, or evicted since
                env = self.cache.lookup(plan.request, gpu=plan.gpu, builder=plan.builder)
                lease = self.cache.lease(env) if env is not None else None
            if env is not None and lease is not None:
                self._known[plan.key] = env
            else:
                self._known.pop(plan.key, None)
        except Exception:
            log.exception("looking up environment %s failed; building it", plan.key)
            return Admission(plan, ready=False, since=since)
        if env is None or lease is None:
            return Admission(plan, ready=False, since=since)
        return Admission(plan, ready=True, venv=env, lease=lease)

    # ------------------------------------------------------------ held environments

    def hold(self, rec: JobRecord, admission: Admission) -> bool:
        """A ready job is queued: its environment (``venv``) stays leased until it ends (lock held). True when
        the admission's lease was taken over (kept for the environment's jobs, or closed as a spare)."""
        if admission.venv is None:
            return False
        if not self._lease_for(rec, admission.venv, admission.lease):
            self._held[rec.job_id] = admission.venv  # its worker's own lease says it is gone: run it again
        return True

    def _lease_for(self, rec: JobRecord, env: Environment, lease: int | None) -> bool:
        """Count ``rec`` among ``env``'s leased jobs (``lease``: a descriptor the caller took, or None). False when
        no lease could be had (evicted meanwhile)."""
        entry = self._leases.get(env.key)
        if entry is not None:
            entry[1] += 1
            if lease is not None:
                _close(lease)  # one is held already
        else:
            if lease is None:
                assert self.cache is not None
                # The jobs that held it ended since the admission (a rare race): lease it again. Evicted in between
                # (rarer still): the worker's own lease then fails and the job says to run it again.
                lease = self.cache.lease(env)
                if lease is None:
                    return False
            self._leases[env.key] = [lease, 1]
        self._held[rec.job_id] = env
        return True

    @staticmethod
    def close(admission: Admission) -> None:
        """Give up an admission's lease (its job was not queued after all)."""
        if admission.lease is not None:
            _close(admission.lease)

    def venv(self, job_id: str) -> Environment | None:
        return self._held.get(job_id)

    def waiting(self, job_id: str) -> bool:
        """The job waits for its environment here (it holds no place in a device queue)."""
        return job_id in self._waiting

    def forget(self, job_id: str) -> None:
        """The job ended (a journal forgetter): it stops waiting, and its lease is closed."""
        build = self._waiting.pop(job_id, None)
        if build is not None:
            build.waiters.pop(job_id, None)
        self.table.environment_waits.pop(job_id, None)
        env = self._held.pop(job_id, None)
        entry = self._leases.get(env.key) if env is not None else None
        if env is not None and entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self._leases[env.key]
                _close(entry[0])

    # ------------------------------------------------------------------ builds

    def stage(self, rec: JobRecord, admission: Admission) -> None:
        """Make ``rec`` wait for its environment (lock held; the job is in the table and the store): it joins
        the build of its key, started now if none is under way.  The caller publishes its event."""
        plan = admission.plan
        assert plan.key is not None and plan.request is not None
        build = self._builds.get(plan.key)
        start = build is None
        if build is None:
            build = self._builds[plan.key] = _Build(plan.key, plan.request, plan.gpu, plan.builder)
        build.waiters[rec.job_id] = (rec, min(admission.since, time.monotonic()))
        self._waiting[rec.job_id] = build
        self.table.environment_waits[rec.job_id] = build.reason
        packages = ", ".join(plan.request.packages) or "no packages"
        python = f", Python {plan.request.python_version}" if plan.request.python_version else ""
        first = [f"{LOG_PREFIX}{'building' if start else 'waiting for'} the environment ({packages}{python})"]
        self.journal.append_log(rec, "system", first + build.lines)
        if start:
            threading.Thread(
                target=self._build, args=(build,), name=f"lancefn-env-{plan.key[:12]}", daemon=True
            ).start()

    def _build(self, build: _Build) -> None:
        """One build (its own thread): ``cache.ensure``, then queue or fail every job waiting for it."""
        assert self.cache is not None  # only a plan with a key gets here
        env: Environment | None = None
        failure: str | None = None
        done = threading.Event()
        threading.Thread(target=self._refresh, args=(build, done), name="lancefn-env-refresh", daemon=True).start()
        try:
            env = self.cache.ensure(
                build.request, log=lambda lines: self._output(build, lines), gpu=build.gpu, builder=build.builder
            )
        except Exception as error:  # EnvironmentFailure: uv's lines in its message; anything else: say what
            from lancefn_jupyter.environments.cache import EnvironmentFailure

            failure = (
                str(error) if isinstance(error, EnvironmentFailure) else f"building the environment failed: {error}"
            )
            if not isinstance(error, EnvironmentFailure):
                log.exception("building environment %s failed", build.key)
        finally:
            done.set()
        with self.table.lock:
            self._builds.pop(build.key, None)
            waiters = list(build.waiters.values())
            for rec, _ in waiters:
                self._waiting.pop(rec.job_id, None)
                self.table.environment_waits.pop(rec.job_id, None)
            if self._closed:
                return  # stopping: the jobs stay PENDING in the store and are staged again on the next start
            try:
                self._built(build, waiters, env, failure)
            except Exception:  # never leave a job waiting for nothing: fail what is still waiting and queued nowhere
                log.exception("finishing environment %s's build failed", build.key)
                for rec, _ in waiters:
                    self._unstick(rec)

    def _unstick(self, rec: JobRecord) -> None:
        table = self.table
        if rec.job_id not in table.active or table.scheduler.is_pending(rec.job_id) or rec.devices:
            return
        if rec.job_id in self._waiting or rec.state != PENDING:
            return
        try:
            failure = JobFailure(
                phase="environment",
                message="the control plane could not queue this job once its environment was ready; see the "
                "server log, and run it again",
                retryable=True,
            )
            self.fail(rec, failure)
        except Exception:
            log.exception("could not fail job %s either", rec.job_id)

    def _built(
        self, build: _Build, waiters: list[tuple[JobRecord, float]], env: Environment | None, failure: str | None
    ) -> None:
        elapsed = time.monotonic() - build.started
        live = [(rec, joined) for rec, joined in waiters if rec.job_id in self.table.active]
        if failure is not None:
            lines = [f"{LOG_PREFIX}the environment could not be built ({elapsed:.1f} s)"]
            for rec, _ in live:
                self.journal.append_log(rec, "system", lines)
                self.fail(rec, JobFailure(phase="environment", message=failure))
            return
        now = time.monotonic()
        if env is not None:
            self._known[build.key] = env
        ready: list[JobRecord] = []
        for rec, joined in live:
            if env is not None and not self._lease_for(rec, env, None):
                # Evicted between its build and now (a tiny cache): build it again.
                self.stage(rec, Admission(self._plan(rec), ready=False))
                continue
            rec.environment_ms = (now - joined) * 1000.0
            where = f": {env.path}" if env is not None else ""
            self.journal.append_log(rec, "system", [f"{LOG_PREFIX}environment ready in {elapsed:.1f} s{where}"])
            ready.append(rec)
        if ready:
            self.enqueue(ready)

    def _refresh(self, build: _Build, done: threading.Event) -> None:
        """Every ``REFRESH_S`` while ``build`` runs: a job event for each job waiting on it, whose pending reason
        says how long the build has taken so far (UIs that follow events show it)."""
        while not done.wait(REFRESH_S):
            with self.table.lock:
                if done.is_set() or self._closed:
                    return
                for rec, _ in list(build.waiters.values()):
                    if rec.job_id in self.table.active:
                        try:
                            self.journal.persist(rec, new=False)
                        except Exception:  # a full disk: the next refresh or the outcome says it
                            log.debug("could not refresh job %s's pending reason", rec.job_id, exc_info=True)

    def _output(self, build: _Build, lines: list[str]) -> None:
        """A build's output lines (its thread): into the logs of every job waiting for it."""
        prefixed = [LOG_PREFIX + line.rstrip("\n") for line in lines]
        with self.table.lock:
            build.lines.extend(prefixed)
            del build.lines[: max(0, len(build.lines) - 2000)]  # what a late joiner is shown: the last lines
            for rec, _ in list(build.waiters.values()):
                try:
                    self.journal.append_log(rec, "system", prefixed)
                except Exception:  # a full disk drops log lines; the build goes on
                    log.debug("could not log environment output for job %s", rec.job_id, exc_info=True)

    def shutdown(self) -> None:
        """The plane stops: builds still under way report nothing more; leases close with the process."""
        with self.table.lock:
            self._closed = True


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
