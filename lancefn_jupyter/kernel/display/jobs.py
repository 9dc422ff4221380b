"""Jobs with how they started — cold or warm (display/timings.py) — pure; runs in the kernel: the `%gpu_jobs`
table (what the jobs dashboard falls back to, and what `list_jobs` shows without widgets) and a job's card (what a
`Job` handle and the job widget fall back to)."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable

from lancefn_jupyter.kernel.display import cards
from lancefn_jupyter.kernel.display.cards import (
    format_elapsed,
    function_ref,
    job_elapsed_s,
    queue_text,
    render_table,
    result_text,
)
from lancefn_jupyter.kernel.display.timings import job_timings_text
from lancefn_jupyter.wire.frames import frames_text
from lancefn_jupyter.wire.models import Job, JobState, display_state

__all__ = ["JOBS_COLUMNS", "job_card", "jobs_table", "remote_locals_text"]

JOBS_COLUMNS = (
    "job",
    "function",
    "state",
    "class",
    "GPUs",
    "devices",
    "queue",
    "progress",
    "elapsed",
    "start",  # "cold start 1.2 s, setup 1.0 s", "warm", or empty (no timings yet)
    "error",
    "result",
)


def jobs_table(jobs: Iterable[Job]) -> tuple[str, str]:
    """(text, HTML) of the jobs, a row each, in the order given."""
    rows = []
    for job in jobs:
        p = job.placement
        queue = queue_text(p) if job.job_state == JobState.PENDING else ""
        elapsed = job_elapsed_s(job)
        rows.append(
            [
                job.job_id,
                function_ref(job),
                display_state(job.job_state),
                p.gpu_class or "cpu",
                str(p.num_gpus),
                ",".join(p.devices),
                queue,
                f"{job.progress.rows_done}/{job.progress.rows_total}",
                format_elapsed(elapsed) if elapsed is not None else "",
                job_timings_text(job),
                f"{job.failure.phase}: {job.failure.message}" if job.failure else "",
                result_text(job),
            ]
        )
    return render_table(JOBS_COLUMNS, rows, title="GPU jobs")


def job_card(job: Job) -> tuple[str, str]:
    """(text, HTML) of one job: `cards.job_card`, then cold or warm and the run time once it ended on a worker."""
    text, markup = cards.job_card(job)
    timings = job_timings_text(job, run=True)
    if timings:
        text += f" · {timings}"
        markup += f"<div class='lancefn lancefn-job-timings'>{html.escape(timings)}</div>"
    return text, markup


def remote_locals_text(job: Job, map_traceback: Callable[[str], str] | None = None) -> str:
    """A failed job's remote frames and their locals (docs/ARCHITECTURE.md, "Debugging a failure"), each frame's line
    at the user's line by ``map_traceback`` (the function's) when given; "" when the failure kept none."""
    failure = job.failure
    if failure is None or not failure.frames:
        return ""
    if map_traceback is None:
        return frames_text(failure.frames)
    artifact = f"<gpu_function {job.spec.get('name', '?')}@{job.spec.get('version', '?')}>"
    # The mapped reference alone: the mapper follows it with the user's line, which would read as a local.
    return frames_text(
        failure.frames, where=lambda line: map_traceback(f'File "{artifact}", line {line}').splitlines()[0].strip()
    )
