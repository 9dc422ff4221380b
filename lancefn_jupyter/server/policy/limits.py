"""What one namespace may hold of a shared server (docs/ARCHITECTURE.md, "Scheduling", "Batches"): how long a job
may run (``--max-job-run-s``), and quotas on its unfinished jobs, batches and batch chunks. Pure: the counts are
passed in; each problem is a message naming the limit, the count and the flag to change."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_MAX_BATCHES",
    "DEFAULT_MAX_JOB_RUN_S",
    "DEFAULT_MAX_QUEUED_CHUNKS",
    "DEFAULT_MAX_QUEUED_JOBS",
    "MAX_JOB_RUN_FLAG",
    "Limits",
    "timed_out_message",
]

MAX_JOB_RUN_FLAG = "--max-job-run-s"
MAX_QUEUED_JOBS_FLAG = "--max-queued-jobs-per-namespace"
MAX_QUEUED_CHUNKS_FLAG = "--max-queued-chunks-per-namespace"
MAX_BATCHES_FLAG = "--max-batches-per-namespace"

# The defaults (the reasons are in docs/ARCHITECTURE.md, "Scheduling" and "Batches"): a day of GPU time for one job
# of a shared server (a longer one is cut into chunks, or the operator sets another limit); 20,000 unfinished jobs
# (twice the 10,000 a team queues in bench_scheduler); one batch of the largest size (MAX_CHUNKS), about 170 MB of
# the server's memory with its chunk jobs (bench_quotas); 1,000 batches.
DEFAULT_MAX_JOB_RUN_S = 24 * 3600.0
DEFAULT_MAX_QUEUED_JOBS = 20_000
DEFAULT_MAX_QUEUED_CHUNKS = 100_000
DEFAULT_MAX_BATCHES = 1_000

_ASK = "or ask the operator to raise"


@dataclass(frozen=True)
class Limits:
    """None: no limit."""

    max_job_run_s: float | None = None
    max_queued_jobs: int | None = None
    max_queued_chunks: int | None = None
    max_batches: int | None = None

    def timeout_problem(self, timeout_s: float | None) -> str | None:
        """Why a request's ``timeout_s`` is refused: it is longer than the server's maximum run time."""
        limit = self.max_job_run_s
        if timeout_s is None or limit is None or timeout_s <= limit:
            return None
        return (
            f"timeout_s={timeout_s:g} is longer than this server's maximum job run time of {limit:g} s "
            f"({MAX_JOB_RUN_FLAG}); ask for at most {limit:g} s, split the work into shorter jobs, {_ASK} {MAX_JOB_RUN_FLAG}"
        )

    def run_timeout(self, timeout_s: float | None) -> tuple[float | None, bool]:
        """The timeout a job runs with: its own ``timeout_s``, else (or when the limit is shorter: a limit lowered
        since the job was accepted) the server's maximum; and whether that maximum is the one in force."""
        limit = self.max_job_run_s
        if limit is not None and (timeout_s is None or timeout_s > limit):
            return limit, True
        return timeout_s, False

    def jobs_problem(self, namespace: str, unfinished: int) -> str | None:
        """Why one more job (not a batch's chunk) of ``namespace`` is refused, which has ``unfinished`` already."""
        limit = self.max_queued_jobs
        if limit is None or unfinished < limit:
            return None
        return (
            f"namespace {namespace!r} has {unfinished} unfinished jobs, the most it may have at once "
            f"({MAX_QUEUED_JOBS_FLAG} {limit}); wait for some to finish or cancel them, send many rows as one "
            f"batch (f.map), {_ASK} {MAX_QUEUED_JOBS_FLAG}"
        )

    def batch_problem(self, namespace: str, batches: int, chunks: int, more_chunks: int) -> str | None:
        """Why one more unfinished batch of ``more_chunks`` chunks (a new one, or one retried) of ``namespace`` is
        refused, which has ``batches`` unfinished batches (backfills included) holding ``chunks`` chunks."""
        if self.max_batches is not None and batches >= self.max_batches:
            return (
                f"namespace {namespace!r} has {batches} unfinished batches and backfills, the most it may have at once "
                f"({MAX_BATCHES_FLAG} {self.max_batches}); wait for one to finish or cancel one, "
                f"{_ASK} {MAX_BATCHES_FLAG}"
            )
        limit = self.max_queued_chunks
        if limit is None or chunks + more_chunks <= limit:
            return None
        return (
            f"namespace {namespace!r} has {chunks} chunks in unfinished batches and backfills; {more_chunks} more would "
            f"pass the limit of {limit} ({MAX_QUEUED_CHUNKS_FLAG}); wait for a batch to finish or cancel one, send "
            f"fewer chunks (a larger chunk_size), {_ASK} {MAX_QUEUED_CHUNKS_FLAG}"
        )


def timed_out_message(timeout_s: float, server_limit: bool, rows_done: int, rows_total: int) -> str:
    """A TIMED_OUT job's failure message: its own ``timeout_s``, or the server's maximum run time (``server_limit``)."""
    rows = f"({rows_done} of {rows_total} rows done)"
    if not server_limit:
        return f"the job ran longer than its timeout of {timeout_s:g} s and was stopped {rows}"
    return (
        f"the job ran longer than this server's maximum job run time of {timeout_s:g} s ({MAX_JOB_RUN_FLAG}) and was "
        f"stopped {rows}; split the work into shorter jobs (a batch's chunks each get the limit), {_ASK} "
        f"{MAX_JOB_RUN_FLAG}"
    )
