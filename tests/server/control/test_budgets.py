"""A namespace's daily budget (docs/ARCHITECTURE.md, "Budgets"): past it, its new jobs wait saying which budget and
when it resets; another namespace's run on; the admin sees every namespace's spend."""

from __future__ import annotations

import pytest
from conftest import register, registration_body
from helpers import api_keys_toml, describe, submit, wait_done, wait_until

# A GPU-second costs 1 EUR.
CLASSES = """
[[gpu_classes]]
name = "default"
simulated = 2
price_per_gpu_hour = 3600
currency = "EUR"
"""
KEY_A, KEY_B = "team-a-key-0001-aaaa", "team-b-key-0001-bbbb"
KEYS = api_keys_toml(
    {"name": "a", "key": KEY_A, "privileges": ["functions", "jobs"], "max_cost_per_day": 0.05},
    {"name": "b", "key": KEY_B, "privileges": ["functions", "jobs"], "max_gpu_hours_per_day": 10},
)
NAP = "def nap(s: float) -> float:\n    import time\n    time.sleep(s)\n    return s\n"


@pytest.fixture(scope="module")
def cp(module_control_plane_factory):
    return module_control_plane_factory(CLASSES, api_keys=KEYS)


def _nap(http) -> str:
    body = registration_body(
        "nap", source=NAP, entrypoint="nap", inputs=(("s", "float64", False),), output_type="float64"
    )
    return register(http, body)["version"]


def test_past_its_budget_a_namespaces_new_jobs_wait_saying_when_it_resets(cp):
    with cp.http(KEY_A) as a, cp.http(KEY_B) as b, cp.http() as admin:
        version_a, version_b = _nap(a), _nap(b)
        spent = wait_done(a, submit(a, "nap", version_a, [{"s": 0.1}]))
        assert spent["job_state"] == "DONE" and spent["usage"]["cost"] >= 0.1
        waiting = submit(a, "nap", version_a, [{"s": 0.0}])
        placement = wait_until(
            lambda: describe(a, waiting)["placement"].get("pending_reason") and describe(a, waiting)["placement"],
            "the budget's reason",
        )
        other = wait_done(b, submit(b, "nap", version_b, [{"s": 0.0}]))
        spend = admin.get("/v1/jobs/usage", params={"by": "namespace", "since": "1d"}).json()
        own = a.get("/v1/jobs/usage", params={"by": "namespace"}).json()
        a.post("/v1/jobs/cancel", json={"job_id": waiting})
    reason = placement["pending_reason"]
    assert reason.startswith("over budget: namespace 'a' used "), reason
    assert "of its 0.05 cost today (max_cost_per_day); new jobs wait until it resets at 00:00 UTC (in " in reason
    assert placement["waiting_on_capacity"] is True
    assert other["job_state"] == "DONE"  # another namespace is not held up
    assert {row["key"] for row in spend["rows"]} == {"a", "b"}  # the admin sees every namespace
    assert [row["key"] for row in own["rows"]] == ["a"]  # a team its own


def test_a_bad_budget_in_the_key_file_is_refused(control_plane_factory):
    keys = api_keys_toml({"name": "c", "key": "team-c-key-0001-cccc", "privileges": ["jobs"], "max_cost_per_day": -1})
    cp = control_plane_factory(api_keys=keys, start=False)
    with pytest.raises(RuntimeError, match="max_cost_per_day.*must be a number > 0"):
        cp.start()
