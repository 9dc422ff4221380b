"""Nothing idle holds resources: an idle warm worker retires after ``--worker-idle-s``, its teardown run
(docs/ARCHITECTURE.md, "Warm state")."""

from __future__ import annotations

import subprocess
import time

from conftest import SERVER_CMD, register, registration_body
from helpers import hold_version, submit, wait_done, wait_until

TORN = """
class torn:
    def __call__(self, path: str) -> str:
        self.path = path
        import os
        return str(os.getpid())

    def teardown(self):
        open(self.path, "w").write("torn down")
"""


def test_an_idle_worker_retires_after_its_idle_time_and_its_teardown_runs(control_plane_factory, tmp_path):
    cp = control_plane_factory(args=["--worker-idle-s", "1"])
    marks = tmp_path / "marks"
    marks.touch()
    marks.chmod(0o666)  # the worker may run as another user
    tmp_path.chmod(0o777)
    body = registration_body(
        "torn", source=TORN, entrypoint="torn", inputs=(("path", "utf8", False),), output_type="utf8"
    )
    with cp.http() as http:
        version = register(http, body)
        first = wait_done(http, submit(http, "torn", version["version"], [{"path": str(marks)}]))
        assert first["job_state"] == "DONE", first
        wait_until(lambda: marks.read_text() == "torn down", "the idle worker's teardown")
        again = wait_done(http, submit(http, "torn", version["version"], [{"path": str(marks)}]))
    assert again["result"] != first["result"]  # a fresh worker: the idle one retired


def test_a_bad_idle_time_is_refused(tmp_path):
    done = subprocess.run(
        [*SERVER_CMD, "--home", str(tmp_path), "--worker-idle-s", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "--worker-idle-s must be a number of seconds > 0" in done.stderr


def test_the_usage_says_when_each_idle_warm_worker_of_a_class_retires(control_plane_factory, tmp_path):
    """`GET /v1/gpu/usage` (and the `usage` event the panel reads): per class, each idle worker that holds a
    version retires `--worker-idle-s` after its last job (a fresh spare is no warm worker); none before a job."""
    from lancefn_jupyter.wire.models import GpuUsage

    cp = control_plane_factory(args=["--worker-idle-s", "300"])
    done = tmp_path / "done"
    done.touch()

    def retire_ms(http) -> tuple[int, ...]:
        (usage,) = [GpuUsage.from_wire(c) for c in http.get("/v1/gpu/usage").json()["classes"]]
        return usage.warm_retire_ms

    with cp.http() as http:
        assert retire_ms(http) == ()
        ends = []
        for name in ("hold", "hold_too"):  # two functions, each leaves its own worker idle
            version = hold_version(http, name, 1)
            before = int(time.time() * 1000)
            assert wait_done(http, submit(http, name, version, [{"path": str(done)}]))["job_state"] == "DONE"
            ends.append((before, int(time.time() * 1000) + 1))
        retiring = retire_ms(http)
    assert len(retiring) == 2 and list(retiring) == sorted(retiring), retiring
    for at, (before, after) in zip(retiring, ends, strict=True):
        assert before + 300_000 <= at <= after + 300_000, (at, before, after)
