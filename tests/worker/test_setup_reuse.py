"""Setup reuse in a real worker process (docs/ARCHITECTURE.md, "Setup reuse"): a task of another version with the
same setup digest runs on the live module, its changed definitions rebound; the plane's digest is checked."""

from __future__ import annotations

import os
import textwrap

import pytest

from lancefn_jupyter.worker.process import WorkerProcess, WorkerTask

CLASS = """
import os
with open({log!r}, "a") as out:
    out.write("module\\n")

def post(y):
    return y {post}

class Model:
    def setup(self):
        with open({log!r}, "a") as out:
            out.write("setup\\n")
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return post(x * {factor}) * 1000 + self.calls

    def pid(self):
        return os.getpid()
"""


def _task(source: str, version: str, digest: str | None = "D", **options) -> WorkerTask:
    return WorkerTask(
        f"t-{version}",
        textwrap.dedent(source).encode(),
        options.pop("entrypoint", "Model"),
        f"<gpu_function Model@{version}>",
        options.pop("rows", [{"x": 1}]),
        setup_digest=digest,
        **options,
    )


def _run(worker: WorkerProcess, task: WorkerTask) -> dict:
    worker.start_task(task)
    final = None
    for event in worker.events():
        final = event
    assert final is not None and final["event"] in ("result", "failed"), final
    return final


@pytest.fixture
def worker():
    w = WorkerProcess({**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    yield w
    w.kill()


def model(log, factor: int = 2, post: str = "+ 0") -> str:
    return CLASS.format(log=str(log), factor=factor, post=post)


def test_edits_of_call_run_on_the_live_instance_with_its_state(worker, tmp_path):
    log = tmp_path / "log"
    first = _run(worker, _task(model(log), "v1"))
    second = _run(worker, _task(model(log, factor=3), "v2"))
    third = _run(worker, _task(model(log, factor=3, post="+ 1"), "v3"))
    assert [first["results"], second["results"], third["results"]] == [[2001], [3002], [4003]]
    assert log.read_text().split() == ["module", "setup"]  # one module execution, one setup for three versions
    assert first["timings"]["setup_ms"] > 0 and "setup_reused" not in first["timings"]
    for final in (second, third):
        assert final["timings"]["setup_reused"] == 1 and final["timings"]["setup_ms"] == 0
        assert final["timings"]["rebind_ms"] > 0


def test_a_failure_in_rebound_code_names_the_new_versions_line(worker, tmp_path):
    log = tmp_path / "log"
    _run(worker, _task(model(log), "v1"))
    failed = _run(worker, _task(model(log, post="/ 0"), "v2"))
    assert failed["event"] == "failed" and failed["phase"] == "run"
    assert "ZeroDivisionError" in failed["message"]
    assert '"<gpu_function Model@v2>", line 7, in post' in failed["traceback"]


def test_another_digest_or_none_or_per_job_loads_afresh(worker, tmp_path):
    log = tmp_path / "log"
    _run(worker, _task(model(log), "v1"))
    assert _run(worker, _task(model(log, factor=3), "v2", digest="E"))["results"] == [3001]
    assert _run(worker, _task(model(log, factor=4), "v3", digest=None))["results"] == [4001]
    assert _run(worker, _task(model(log, factor=5), "v4", state="per_job"))["results"] == [5001]
    assert log.read_text().split() == ["module", "setup"] * 4


def test_the_worker_checks_the_setup_part_itself(worker, tmp_path):
    """A task whose digest claims reuse while its setup differs loads afresh: the plane's word is checked."""
    log = tmp_path / "log"
    _run(worker, _task(model(log), "v1"))
    changed = model(log).replace("self.calls = 0", "self.calls = 100")
    assert _run(worker, _task(changed, "v2"))["results"] == [2101]
    assert log.read_text().split() == ["module", "setup"] * 2


def test_a_function_entry_keeps_its_module_level_model(worker, tmp_path):
    log = tmp_path / "log"
    source = f"""
        with open({str(log)!r}, "a") as out:
            out.write("loaded\\n")
        MODEL = {{"w": 2}}
        seen = []

        def f(x: int) -> int:
            seen.append(x)
            return x * MODEL["w"] {{op}} len(seen)
        """
    finals = [
        _run(worker, _task(source.replace("{op}", op), f"v{i}", entrypoint="f", rows=[{"x": 5}]))
        for i, op in enumerate(["+", "-", "*"])
    ]
    assert [final["results"] for final in finals] == [[11], [8], [30]]
    assert log.read_text().split() == ["loaded"]


def test_zero_argument_super_in_a_rebound_method_sees_the_live_class(worker, tmp_path):
    source = """
        class Base:
            def __call__(self, x: int) -> int:
                return x

        class Model(Base):
            def __call__(self, x: int) -> int:
                return super().__call__(x) {op} 1
        """
    finals = [_run(worker, _task(source.replace("{op}", op), f"v{i}")) for i, op in enumerate(["+", "-"])]
    assert [final["results"] for final in finals] == [[2], [0]]
    assert finals[1]["timings"]["setup_reused"] == 1
