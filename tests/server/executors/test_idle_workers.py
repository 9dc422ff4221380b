"""Nothing idle holds resources: an idle warm worker retires after ``--worker-idle-s``, its teardown run
(docs/ARCHITECTURE.md, "Warm state")."""

from __future__ import annotations

import subprocess

from conftest import SERVER_CMD, register, registration_body
from helpers import submit, wait_done, wait_until

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
