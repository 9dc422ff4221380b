"""What a job held and cost, and the sums of it (docs/ARCHITECTURE.md, "Cost"), through a real server."""

from __future__ import annotations

import re

import pytest
from conftest import register, registration_body
from helpers import describe, kernel_shell, submit, wait_done, wait_until
from IPython.core.error import UsageError

# An hour of a GPU for 3600 EUR: a GPU-second is 1 EUR; a CPU-second 0.1 EUR.
CLASSES = """
[[gpu_classes]]
name = "default"
simulated = 2
cpu_per_gpu = 1
price_per_gpu_hour = 3600
price_per_cpu_hour = 360
currency = "EUR"
"""

NAP = """
def nap(s: float) -> float:
    import time
    time.sleep(s)
    return s
"""


@pytest.fixture(scope="module")
def cp(module_control_plane_factory):
    return module_control_plane_factory(CLASSES)


def _nap(http, num_gpus: int = 1, **resources: str) -> dict:
    body = registration_body(
        "nap", source=NAP, entrypoint="nap", inputs=(("s", "float64", False),), output_type="float64"
    )
    body["runtime"]["resources"].update(num_gpus=num_gpus, **resources)
    return register(http, body)


def test_a_jobs_cost_is_its_held_seconds_times_its_classs_prices(cp):
    with cp.http() as http:
        version = _nap(http, num_gpus=2, cpu="500m")
        job = wait_done(http, submit(http, "nap", version["version"], [{"s": 0.3}]))
    usage = job["usage"]
    held = usage["held_s"]
    assert held >= 0.3
    assert held == pytest.approx((job["finished_ms"] - job["started_ms"] + job["timings"]["start_ms"]) / 1000, abs=2e-3)
    assert usage["gpu_seconds"] == pytest.approx(2 * held, abs=2e-3)
    assert usage["cpu_seconds"] == pytest.approx(0.5 * held, abs=2e-3)
    assert usage["cost"] == pytest.approx(2 * held + 0.1 * 0.5 * held, abs=1e-2)
    assert usage["currency"] == "EUR"


def test_usage_sums_per_namespace_version_and_day(cp):
    with cp.http() as http:
        version = _nap(http)
        jobs = [wait_done(http, submit(http, "nap", version["version"], [{"s": 0.05}])) for _ in range(3)]
        by_version = http.get("/v1/jobs/usage", params={"by": "version"}).json()
        by_namespace = http.get("/v1/jobs/usage", params={"by": "namespace", "since": "1d"}).json()
        by_day = http.get("/v1/jobs/usage", params={"by": "day"}).json()
        bad_by = http.get("/v1/jobs/usage", params={"by": "team"})
        bad_since = http.get("/v1/jobs/usage", params={"since": "yesterday"})
    (row,) = [r for r in by_version["rows"] if r["key"] == f"default/nap@{version['version']}"]
    assert row["jobs"] == 3
    assert row["cost"] == pytest.approx(sum(job["usage"]["cost"] for job in jobs), abs=1e-4)
    (everything,) = by_namespace["rows"]
    assert everything["key"] == "default" and everything["jobs"] >= 3
    assert everything["cost"] == pytest.approx(sum(r["cost"] for r in by_version["rows"]), abs=1e-4)
    assert sum(r["jobs"] for r in by_day["rows"]) == everything["jobs"]
    assert bad_by.status_code == 400 and "by=namespace" in bad_by.json()["error"]["message"]
    assert bad_since.status_code == 400 and "since=7d" in bad_since.json()["error"]["message"]


def test_the_magics_show_cost(cp):
    for shell in kernel_shell(cp):
        shell.run_cell_magic("gpu_function", "name=priced", "def priced(x: int) -> int:\n    return x\n")
        job = shell.user_ns["priced"].submit(1)
        job.result()
        text = repr(job)
        assert job.snapshot.usage is not None and job.snapshot.usage.currency == "EUR"
        assert " · €" in text, text  # "warm, ran 1 ms · €0.021"
        table = shell.run_line_magic("gpu_usage", "by=version since=1d")
        assert any(row["key"].startswith("default/priced@") for row in table)
        assert "GPU usage by version" in repr(table) and "€" in repr(table)
        with pytest.raises(UsageError, match="by=namespace"):
            shell.run_line_magic("gpu_usage", "by=team")
        with pytest.raises(UsageError, match="usage: %gpu_usage"):
            shell.run_line_magic("gpu_usage", "bogus")


def test_a_dry_run_estimates_rows_chunks_time_and_cost_from_the_versions_history(cp):
    cell = "import time\n\ndef pace(x: int) -> int:\n    time.sleep(0.01)\n    return x\n"
    for shell in kernel_shell(cp):
        shell.run_cell_magic("gpu_function", "name=pace", cell)
        pace = shell.user_ns["pace"]
        before = pace.map(list(range(128)), chunk_size=2, dry_run=True)
        assert (before.rows, before.chunks, before.based_on, before.expected_s) == (128, 64, 0, None)
        assert "no estimate yet" in repr(before)
        history = pace.map(list(range(16)), chunk_size=2)  # 8 chunk jobs of history
        history.result()
        estimate = pace.map(list(range(128)), chunk_size=2, estimate=True)
        with cp.http() as http:
            (past,) = [
                row
                for row in http.get("/v1/jobs/usage", params={"by": "version"}).json()["rows"]
                if row["key"].endswith(f"/pace@{pace.version.version}")
            ]
            ran = http.post("/v1/batches/describe", json={"batch_id": history.batch_id}).json()
            (its,) = [
                row
                for row in http.get("/v1/jobs/usage", params={"by": "batch"}).json()["rows"]
                if row["key"] == history.batch_id
            ]
    assert (estimate.rows, estimate.chunks, estimate.at_once, estimate.based_on) == (128, 64, 2, 8)
    warm = 1 - past["start_s"] / past["held_s"]  # worker starts left out of the rate per row
    per_row_s = warm * past["held_s"] / past["rows"]
    assert estimate.cost == pytest.approx(past["cost"] * warm / past["rows"] * 128)
    # Each wave also pays what the history's batch spent per wave beyond running its chunks: its wall time less its
    # two workers' starts, over its 4 waves, less a chunk's run.
    wall_s = (ran["finished_ms"] - ran["started_ms"]) / 1000 - its["start_s"] / 2
    gap_s = max(0.0, wall_s / 4 - 2 * per_row_s)
    assert estimate.expected_s == pytest.approx(32 * (2 * per_row_s + gap_s))  # 32 waves of 2 rows
    assert estimate.currency == "EUR" and "€" in repr(estimate) and "from 8 earlier jobs" in repr(estimate)


GATED = (
    "def gated(path: str) -> str:\n"
    "    import os, time\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.01)\n"
    "    return path\n"
)


def test_a_batch_widget_says_what_was_spent_and_about_how_long_and_how_much_is_left(cp, tmp_path):
    """Spent so far is the sum of the ended chunk jobs' costs (the batch's `usage`); the rest is the rows' rate so far
    and the cost per row so far times the rows left; once the batch ended only what it spent is said."""
    from lancefn_jupyter.kernel.display.timings import format_money
    from lancefn_jupyter.kernel.widgets import BatchWidget, get_listener

    done, gate = tmp_path / "done", tmp_path / "gate"
    done.touch()
    tmp_path.chmod(0o777)  # the worker may run as another user
    for shell in kernel_shell(cp):
        shell.run_cell_magic("gpu_function", "name=gated", GATED)
        batch = shell.user_ns["gated"].map([str(done), str(done), str(gate), str(gate)], chunk_size=1, parallel=1)
        widget = BatchWidget(batch.batch_id)
        assert get_listener().wait_connected(60)  # the batch's later events reach the widget
        # Two chunks ended and the widget has the batch's start with them (the rate needs it): what is left is said
        wait_until(
            lambda w=widget: (
                w.snapshot.usage is not None and w.snapshot.usage.rows == 2 and " left · " in w.progress_label.value
            ),
            "two chunks ended and what is left said",
        )
        running = widget.snapshot
        label = widget.progress_label.value
        gate.touch()
        batch.result()
        wait_until(lambda w=widget: w.state == "finished", "the batch finished")
        ended = widget.snapshot
        with cp.http() as http:
            chunks = http.post("/v1/batches/describe", json={"batch_id": batch.batch_id, "include_chunks": True})
            costs = [describe(http, c["job_id"])["usage"]["cost"] for c in chunks.json()["chunks"]]
        final = widget.progress_label.value
        widget.close()
    spent = running.usage.cost
    assert running.usage.currency == "EUR" and spent > 0
    per_row_left = format_money(spent / 2 * 2, "EUR")  # two rows left
    assert re.search(
        rf"· about \d+ (s|min|h) and {re.escape(per_row_left)} left · {re.escape(format_money(spent, 'EUR'))} spent",
        label,
    ), label
    assert ended.usage.rows == 4 and ended.usage.cost == pytest.approx(sum(costs), abs=1e-5)
    money = format_money(ended.usage.cost, "EUR")
    assert re.search(rf"of 4 chunks · [\d.,]+ rows/s · {re.escape(money)} spent$", final), final
