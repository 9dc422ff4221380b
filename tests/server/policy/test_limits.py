"""The server-wide limits (docs/ARCHITECTURE.md, "Scheduling", "Batches"): a job's run time against
``--max-job-run-s``, and each namespace's quotas on unfinished jobs, batches and chunks. Pure: counts are passed in."""

from __future__ import annotations

import pytest

from lancefn_jupyter.server.policy.limits import Limits, timed_out_message

pytestmark = pytest.mark.unit


def test_a_job_without_timeout_gets_the_maximum_and_a_longer_one_is_refused_naming_the_flag():
    limits = Limits(max_job_run_s=60)
    assert limits.run_timeout(None) == (60, True)
    assert limits.run_timeout(30) == (30, False)  # within the limit: the job's own, as before
    assert limits.run_timeout(90) == (60, True)  # accepted before the limit was lowered: capped at launch
    assert limits.timeout_problem(None) is None and limits.timeout_problem(60) is None
    problem = limits.timeout_problem(61)
    assert problem is not None and "timeout_s=61 is longer than this server's maximum job run time of 60 s" in problem
    assert "(--max-job-run-s)" in problem
    assert Limits().run_timeout(None) == (None, False) and Limits().timeout_problem(1e9) is None


def test_timed_out_messages_name_whose_limit_it_was():
    assert (
        timed_out_message(1.5, False, 2, 10)
        == "the job ran longer than its timeout of 1.5 s and was stopped (2 of 10 rows done)"
    )
    message = timed_out_message(60, True, 0, 1)
    assert message.startswith("the job ran longer than this server's maximum job run time of 60 s (--max-job-run-s)")
    assert "(0 of 1 rows done)" in message


def test_queued_jobs_past_the_quota_are_refused_naming_the_count_and_the_flag():
    limits = Limits(max_queued_jobs=3)
    assert limits.jobs_problem("a", 2) is None
    problem = limits.jobs_problem("a", 3)
    assert problem is not None
    assert "namespace 'a' has 3 unfinished jobs" in problem and "(--max-queued-jobs-per-namespace 3)" in problem
    assert Limits().jobs_problem("a", 10**9) is None


def test_batches_and_chunks_past_their_quotas_are_refused_naming_the_count_and_the_flag():
    limits = Limits(max_batches=2, max_queued_chunks=100)
    assert limits.batch_problem("a", 1, 60, 40) is None  # exactly at the chunk quota
    batches = limits.batch_problem("a", 2, 10, 1)
    assert batches is not None
    assert "has 2 unfinished batches and backfills" in batches and "(--max-batches-per-namespace 2)" in batches
    chunks = limits.batch_problem("a", 1, 60, 41)
    assert chunks is not None
    assert "has 60 chunks in unfinished batches and backfills; 41 more would pass the limit of 100" in chunks
    assert "(--max-queued-chunks-per-namespace)" in chunks
    assert Limits().batch_problem("a", 10**6, 10**9, 10**5) is None
