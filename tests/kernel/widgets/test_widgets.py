"""Live widgets against a real control plane on 127.0.0.1 (issue 4).

Jobs run functions that wait for a file the test creates ("gates"), so every state a widget shows
is reached when the test says so, never by timing. Waits are bounded polls of widget values (the
listener thread updates them); nothing asserts on elapsed time.
"""

from __future__ import annotations

import gc
import html
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import ipywidgets
import pytest
from helpers import DEADLINE_S, wait_until

import lancefn_jupyter.kernel.session as session_module
import lancefn_jupyter.kernel.widgets as widgets_module
from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.client.events import Event
from lancefn_jupyter.kernel.client.listener import EventListener, queue_positions
from lancefn_jupyter.kernel.display.timings import format_ms
from lancefn_jupyter.kernel.session import _session as kernel_session  # tests reset the kernel's state
from lancefn_jupyter.kernel.widgets import (
    WIDGET_VIEW_MIME,
    FunctionCardWidget,
    GpuClassesWidget,
    JobsDashboard,
    JobWidget,
    get_listener,
    job_widget,
    running_threads,
    set_widgets,
    stop_listener,
)
from lancefn_jupyter.server.control.callbacks import PROGRESS_EVENT_INTERVAL_S

TWO_CLASSES = """
[[gpu_classes]]
name = "default"
gpu_model = "Simulated A100"
gpu_memory_bytes = 42949672960
max_gpu_count_per_worker = 2
node_selector = { "cloud.google.com/gke-accelerator" = "nvidia-tesla-a100" }
simulated = 2

[[gpu_classes]]
name = "big"
resource_name = "example.com/gpu"
gpu_model = "Simulated H100"
gpu_memory_bytes = 85899345920
max_gpu_count_per_worker = 4
simulated = 4
"""


def wait_for_file(path: str) -> str:
    import os
    import time

    print("waiting for", path, flush=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    return path


def talk_until(path: str, n: int) -> int:
    import os
    import time

    for i in range(3):
        print(f"line {i}", flush=True)
    os.write(2, b"warn\n")
    while not os.path.exists(path):
        time.sleep(0.01)
    for i in range(n):
        print(f"flood {i}")
    print("bye", flush=True)
    return n


def explode(value: int) -> int:
    if value > 2:
        raise ValueError(f"value {value} is too big")
    return value


def table_rows(markup: str) -> dict[str, list[str]]:
    """`<tr><td>…` rows of an HTML table, keyed by their first cell."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", markup):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        if cells:
            rows[cells[0]] = cells
    return rows


def status_text(widget: JobWidget) -> str:
    return widget.status.value


@pytest.fixture
def fresh_listener():
    """Each test gets its own kernel-wide listener; none survives the test."""
    stop_listener()
    session_module._listener = None
    set_widgets(None)
    yield
    stop_listener()
    session_module._listener = None
    set_widgets(None)
    ipywidgets.Widget.close_all()


@pytest.fixture
def cp(control_plane_factory, fresh_listener):
    cp = control_plane_factory(gpu_classes=TWO_CLASSES)
    kernel_session.registered.clear()
    api.connect(cp.url, cp.api_key)
    return cp


@pytest.fixture
def gate_fn(cp):
    return api.gpu_function(num_gpus=1)(wait_for_file)


@pytest.fixture
def gates(tmp_path):
    class Gates:
        def __getitem__(self, name) -> str:
            return str(tmp_path / f"gate-{name}")

        def open(self, name) -> None:
            Path(self[name]).touch()

    return Gates()


def badge_history(widget: JobWidget) -> list[str]:
    """The states the badge shows, in order, recorded from now on (starting with the current one)."""
    seen = [widget.state]
    lock = threading.Lock()

    def record(change):
        text = change["new"]
        state = next(
            s for s in ("pending", "running", "finished", "failed", "cancelled", "timed out") if f">{s}<" in text
        )
        with lock:
            if seen[-1] != state:
                seen.append(state)

    widget.badge.observe(record, names="value")
    return seen


# ------------------------------------------------------------------------------ pure


def test_queue_events_move_shown_pending_jobs_and_keep_expected_starts_they_do_not_name():
    # Another namespace's job is null: it counts for positions but names nothing.
    assert queue_positions({"classes": {"default": ["a", None, "c"], "big": ["x"]}}) == {"a": 1, "c": 3, "x": 1}
    assert queue_positions({"classes": None}) == {}

    class Seen:
        def __init__(self):
            self.jobs = []

        def job(self, job):
            self.jobs.append(job)

    def pending(job_id, position, start=None):
        placement = {"gpu_class": "default", "queue_position": position, "expected_start_ms": start}
        job = {"job_id": job_id, "job_type": "run_function", "job_state": "PENDING", "creation_ms": 1}
        return {**job, "placement": placement, "progress": {"rows_done": 0, "rows_total": 1}}

    listener, seen = EventListener(lambda: None), Seen()  # not started: events are fed to it directly
    listener.subscribe_job("c", seen.job)
    listener._dispatch(Event(event="job", data=pending("c", 3, start=5000), id=1))
    assert [j.placement.queue_position for j in seen.jobs] == [3]
    # b started (c moves up) with no job event of c's own; this event names no expected starts.
    listener._dispatch(Event(event="queue", data={"classes": {"default": ["a", "c"]}}, id=None))
    assert (seen.jobs[-1].placement.queue_position, seen.jobs[-1].placement.expected_start_ms) == (2, 5000)
    listener._dispatch(Event(event="queue", data={"classes": {"default": ["a", "c"]}}, id=None))
    assert len(seen.jobs) == 2  # nothing moved: nothing re-delivered
    listener._dispatch(Event(event="queue", data={"classes": {"default": ["c"]}, "expected_start_ms": {"c": 7000}}))
    assert (seen.jobs[-1].placement.queue_position, seen.jobs[-1].placement.expected_start_ms) == (1, 7000)
    assert seen.jobs[-1].job_id == "c" and seen.jobs[-1].job_state == "PENDING"


# ------------------------------------------------------------------------ job widget


def test_job_widget_follows_pending_running_finished_with_queue_positions(cp, gate_fn, gates):
    jobs = [gate_fn.submit(gates[i]) for i in range(4)]  # 2 simulated GPUs: 2 run, 2 wait
    widgets = [JobWidget(job.job_id) for job in jobs]
    assert get_listener().wait_connected(DEADLINE_S)
    first, _, third, fourth = widgets
    wait_until(lambda: first.state == "running", "job 0 running")
    assert "running on default [sim" in status_text(first)
    assert third.state == "pending" and fourth.state == "pending"
    assert "waiting for GPU capacity in class default, position 1" in status_text(third)
    assert "waiting for GPU capacity in class default, position 2" in status_text(fourth)
    history = badge_history(third)

    gates.open(0)  # job 0 finishes, job 2 takes its GPU, job 3 moves up
    wait_until(lambda: first.state == "finished", "job 0 finished")
    wait_until(lambda: third.state == "running", "job 2 running")
    wait_until(lambda: "position 1" in status_text(fourth), "job 3 at position 1")
    assert first.progress.value == first.progress.max == 1 and first.progress_label.value == "1/1 rows (100%)"
    assert first.cancel_button.disabled and not third.cancel_button.disabled

    for i in range(1, 4):
        gates.open(i)
    for widget in widgets:
        wait_until(lambda w=widget: w.state == "finished", f"{widget.job_id} finished")
    assert history == ["pending", "running", "finished"]
    assert all(w.progress.value == w.progress.max and w.progress.bar_style == "success" for w in widgets)
    assert [job.result() for job in jobs] == [gates[i] for i in range(4)]


def test_finished_jobs_say_cold_then_warm(cp, gate_fn, gates):
    """Issue 24 end to end: the control plane's `Job.timings` (once a job ended on a worker) shows in the
    widget, the handle, `%gpu_jobs` and the dashboard. A new version's first job paid a start or a setup;
    the next one found its worker idle on the same GPU: warm."""
    gates.open("first")
    gates.open("second")
    first = gate_fn.submit(gates["first"])
    widget = JobWidget(first.job_id)
    wait_until(lambda: widget.state == "finished", "first job finished")
    wait_until(lambda: widget.timings.layout.display is None, "the first job's timings shown")
    assert re.search(r">(cold start|environment|setup) [^<]*, ran [^<]+<", widget.timings.value), widget.timings.value
    assert first.wait().timings is not None and first.timings.cold
    second = gate_fn.submit(gates["second"])
    assert second.wait().timings is not None and not second.timings.cold
    assert ">warm, ran " in JobWidget(second.job_id).timings.value
    assert repr(second).endswith(f" · warm, ran {format_ms(second.timings.run_ms)}")
    rows = {line.split()[0]: line for line in repr(api.list_jobs()).splitlines()[2:]}
    assert re.search(r"  warm$|  warm  ", rows[second.job_id]) and "cold" not in rows[second.job_id]
    dashboard = JobsDashboard()
    assert dashboard.rows[second.job_id].detail_cell.value.endswith("· warm</span>")


def test_map_job_progress_bar_follows_rows(cp, gate_fn, gates):
    job = gate_fn.map([gates[f"row{i}"] for i in range(3)])
    widget = JobWidget(job.job_id)
    wait_until(lambda: widget.state == "running", "map job running")
    assert (widget.progress.value, widget.progress.max) == (0, 3)
    for i in range(3):
        # The server coalesces progress events (at most one per PROGRESS_EVENT_INTERVAL_S per job; a held
        # count follows when the window ends), so spacing rows by more than the window makes every
        # count its own event, which is what this test checks.
        time.sleep(PROGRESS_EVENT_INTERVAL_S * 1.5)
        gates.open(f"row{i}")
        wait_until(lambda i=i: widget.progress.value == i + 1, f"{i + 1} rows done")
        assert widget.progress_label.value.startswith(f"{i + 1}/3 rows")
    wait_until(lambda: widget.state == "finished", "map job finished")
    assert widget.progress_label.value == "3/3 rows (100%)"


def test_failed_and_timed_out_jobs_show_readable_errors(cp, gates):
    failing = api.gpu_function(num_gpus=1)(explode)
    job = failing.map([1, 2, 3])
    widget = JobWidget(job.job_id, function=failing)
    wait_until(lambda: widget.state == "failed", "job failed")
    assert "failed in phase run" in status_text(widget)
    assert widget.error.layout.display is None and "value 3 is too big" in widget.error.value
    assert "remote locals — job.debug() steps into the failing row here" in widget.error.value
    assert "value = 3" in widget.error.value  # the failing row's local, as the remote frame held it
    assert widget.progress.bar_style == "danger" and widget.cancel_button.disabled

    slow = api.gpu_function(num_gpus=1, timeout_s=0.5)(wait_for_file)
    late = slow.submit(gates["never"])
    late_widget = JobWidget(late.job_id)
    wait_until(lambda: late_widget.state == "timed out", "job timed out")
    assert "timeout" in late_widget.error.value


def test_cancel_button_cancels_pending_job(cp, gate_fn, gates):
    running = [gate_fn.submit(gates[i]) for i in range(2)]
    pending = gate_fn.submit(gates["p"])
    widget = JobWidget(pending.job_id)
    assert widget.state == "pending" and not widget.cancel_button.disabled
    widget.cancel_button.click()  # what the frontend's click runs in the kernel
    assert widget.state == "cancelled" and widget.cancel_button.disabled
    assert pending.refresh().job_state == "CANCELLED"
    # A running job is cancelled from its widget too; its GPU is freed.
    first = JobWidget(running[0].job_id)
    first.cancel_button.click()
    assert first.state == "cancelled"
    assert running[0].refresh().job_state == "CANCELLED"
    gates.open(1)
    assert running[1].wait(DEADLINE_S).snapshot.job_state == "DONE"


def test_logs_toggle_shows_worker_output(cp, gate_fn, gates):
    job = gate_fn.submit(gates["log"])
    widget = JobWidget(job.job_id)
    assert widget.logs_view.layout.display == "none"
    widget.logs_button.value = True
    assert widget.logs_view.layout.display is None
    wait_until(lambda: "waiting for " + gates["log"] in widget.logs_view.value, "the worker's print in the log view")
    gates.open("log")
    wait_until(lambda: widget.state == "finished", "finished")
    widget.logs_button.value = False
    assert widget.logs_view.layout.display == "none"


def shown_lines(widget: JobWidget, stream: str) -> list[str]:
    """The lines the widget's output area shows on one stream, in order."""
    text = "".join(entry["text"] for entry in widget.output.outputs if entry["name"] == stream)
    return text.splitlines()


def test_job_widget_shows_prints_live_in_order_stderr_apart_and_a_flood_cut_short(cp, gates):
    talk = api.gpu_function(num_gpus=1)(talk_until)
    job = talk.submit(gates["talk"], 250)
    widget = JobWidget(job.job_id)
    wait_until(lambda: shown_lines(widget, "stderr") == ["warn"], "the job's stderr line, while it runs")
    wait_until(lambda: len(shown_lines(widget, "stdout")) == 3, "the job's first lines, while it runs")
    assert shown_lines(widget, "stdout") == ["line 0", "line 1", "line 2"]
    assert widget.state == "running"  # shown while the job runs, not after it ended
    gates.open("talk")
    wait_until(lambda: any("more" in line for line in shown_lines(widget, "stdout")), "the count of lines not shown")
    assert widget.state == "finished"
    assert shown_lines(widget, "stdout") == [
        "line 0",
        "line 1",
        "line 2",
        *(f"flood {i}" for i in range(196)),  # 200 lines of the job shown, both streams together
        "[lancefn] 55 lines more — job.logs()",
    ]
    assert shown_lines(widget, "stderr") == ["warn"]
    stored = job.logs().splitlines()  # nothing lost in the stored log
    assert len(stored) == 255 and stored[-251:] == [*(f"flood {i}" for i in range(250)), "bye"]


# ----------------------------------------------------------------------- reprs


def test_repr_mimebundles_have_widget_view_and_fallbacks(cp, gate_fn, gates):
    job = gate_fn.submit(gates["repr"])
    widget = JobWidget(job.job_id)
    bundle = widget._repr_mimebundle_()
    assert set(bundle) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}
    assert bundle[WIDGET_VIEW_MIME]["model_id"] == widget.model_id
    assert job.job_id in bundle["text/plain"] and "lancefn-state" in bundle["text/html"]

    others = [
        GpuClassesWidget(),
        JobsDashboard(),
        FunctionCardWidget(gate_fn),
    ]
    for other in others:
        bundle = other._repr_mimebundle_()
        assert set(bundle) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}, type(other)
    assert "Simulated A100" in others[0]._repr_mimebundle_()["text/plain"]
    assert job.job_id in others[1]._repr_mimebundle_()["text/plain"]
    assert gate_fn.version.version in others[2]._repr_mimebundle_()["text/plain"]

    # Handles: a widget where a frontend can show one, text + HTML otherwise.
    set_widgets(True)
    assert set(job._repr_mimebundle_()) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}
    assert (
        job._repr_mimebundle_()[WIDGET_VIEW_MIME]["model_id"] == job._repr_mimebundle_()[WIDGET_VIEW_MIME]["model_id"]
    )
    assert set(gate_fn._repr_mimebundle_()) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}
    assert set(api.list_gpu_classes()._repr_mimebundle_()) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}
    assert set(api.list_jobs()._repr_mimebundle_()) == {WIDGET_VIEW_MIME, "text/plain", "text/html"}
    set_widgets(None)  # auto: this test process is no kernel, so no widget
    for shown in (job, gate_fn, api.list_gpu_classes(), api.list_jobs()):
        assert set(shown._repr_mimebundle_()) == {"text/plain", "text/html"}
    gates.open("repr")


def test_without_ipywidgets_everything_shows_as_text_and_html(cp, gate_fn, gates, monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` now fails
    monkeypatch.setenv("LANCEFN_WIDGETS", "1")  # even when asked for widgets
    job = gate_fn.submit(gates["plain"])
    for shown in (job, gate_fn, api.list_gpu_classes(), api.list_jobs()):
        bundle = shown._repr_mimebundle_()
        assert set(bundle) == {"text/plain", "text/html"}
    assert job.job_id in job._repr_mimebundle_()["text/plain"]
    assert "lancefn-state" in job._repr_mimebundle_()["text/html"]
    assert job not in widgets_module._shown and not get_listener().running
    gates.open("plain")


# ---------------------------------------------------------------- other widgets


def test_gpu_classes_widget_shows_hardware_and_live_usage(cp, gate_fn, gates):
    widget = GpuClassesWidget()
    text = widget._fallback()[0]
    for expected in (
        "Simulated A100",
        "40 GiB",
        "Simulated H100",
        "80 GiB",
        "example.com/gpu",
        "nvidia.com/gpu",
        "cloud.google.com/gke-accelerator=nvidia-tesla-a100",
    ):
        assert expected in text, expected
    rows = table_rows(widget.table.value)
    assert rows["default"] == [
        "default",
        "Simulated A100",
        "40 GiB",
        "2",
        "nvidia.com/gpu",
        "cloud.google.com/gke-accelerator=nvidia-tesla-a100",
        "0",
        "2/2",
        "0/0",
        "-",  # no host CPU or memory configured
    ]
    assert rows["big"] == [
        "big",
        "Simulated H100",
        "80 GiB",
        "4",
        "example.com/gpu",
        "-",
        "0",
        "4/4",
        "0/0",
        "-",
    ]

    jobs = [gate_fn.submit(gates[i]) for i in range(3)]
    wait_until(
        lambda: table_rows(widget.table.value)["default"][6:9] == ["2", "0/2", "2/1"], "usage: 2 busy, 1 pending"
    )
    for i in range(3):
        gates.open(i)
    for job in jobs:
        job.wait(DEADLINE_S)
    wait_until(lambda: table_rows(widget.table.value)["default"][6:9] == ["0", "2/2", "0/0"], "usage back to idle")
    assert widget.usage["default"].gpus_busy == 0


def test_jobs_dashboard_live_rows_filters_and_cancel(cp, gate_fn, gates):
    before = gate_fn.submit(gates["old"])
    dashboard = JobsDashboard()
    assert [j.job_id for j in dashboard.visible_jobs()] == [before.job_id]  # existing jobs from REST
    wait_until(lambda: dashboard.rows[before.job_id].job.job_state == "IN_PROGRESS", "first job running")
    later = [gate_fn.submit(gates[i]) for i in range(2)]  # one runs, one waits
    wait_until(lambda: len(dashboard.visible_jobs()) == 3, "new jobs appear live")
    shown = [j.job_id for j in dashboard.visible_jobs()]
    assert set(shown) == {later[1].job_id, later[0].job_id, before.job_id} and shown[-1] == before.job_id
    waiting = dashboard.rows[later[1].job_id]
    wait_until(lambda: "waiting for default, position 1" in waiting.placement_cell.value, "queue position shown")
    assert ">pending<" in waiting.state_cell.value
    # The other new job has a GPU, but its worker may still be starting: the filter below counts it as running.
    wait_until(lambda: dashboard.rows[later[0].job_id].job.job_state == "IN_PROGRESS", "second job running")
    assert len(dashboard.grid.children) == 7 * 4  # header + 3 rows of 7 cells

    dashboard.state_filter.value = "PENDING"
    assert [j.job_id for j in dashboard.visible_jobs()] == [later[1].job_id]
    assert len(dashboard.grid.children) == 7 * 2
    dashboard.state_filter.value = ""
    dashboard.name_filter.value = "no_such_function"
    assert dashboard.visible_jobs() == []
    dashboard.name_filter.value = "wait_for"
    assert len(dashboard.visible_jobs()) == 3
    assert "wait_for_file" in dashboard.name_filter.options

    waiting.cancel_button.click()
    assert ">cancelled<" in waiting.state_cell.value and waiting.cancel_button.disabled
    assert later[1].refresh().job_state == "CANCELLED"
    gates.open("old")
    gates.open(0)
    wait_until(
        lambda: all(">finished<" in dashboard.rows[j.job_id].state_cell.value for j in (before, later[0])),
        "dashboard rows finished",
    )
    assert dashboard.rows[before.job_id].progress.value == 1
    assert "1 cancelled" in dashboard.summary.value and "2 finished" in dashboard.summary.value


def test_function_card_widget_shows_version_and_class_hardware(cp, gate_fn, gates):
    card = FunctionCardWidget(gate_fn)
    version = gate_fn.version
    text = card._fallback()[0]
    for expected in (
        "GPU function wait_for_file",
        version.version,
        version.artifact.digest[:19],
        "python_v2",
        "1 GPU of class default",
        "pip: no packages",
        "Simulated A100, 40 GiB, up to 2 GPUs/worker",
    ):
        assert expected in text, expected
    assert "0 busy, 2 free of 2 GPUs" in card.usage_label.value
    job = gate_fn.submit(gates["card"])
    wait_until(lambda: "1 busy, 1 free of 2 GPUs; 1 running" in card.usage_label.value, "card usage live")
    gates.open("card")
    job.wait(DEADLINE_S)
    wait_until(lambda: "0 busy, 2 free" in card.usage_label.value, "card usage idle")


# ------------------------------------------------------------------- the listener


def test_job_handle_state_is_live_without_http(cp, gate_fn, gates):
    watcher = JobWidget(gate_fn.submit(gates["w"]).job_id)  # starts the listener
    assert get_listener().wait_connected(DEADLINE_S)
    job = gate_fn.submit(gates["live"])
    assert job.state in ("pending", "running")  # one REST read (never seen before)

    def no_http():
        raise AssertionError("Job.state asked over HTTP although the listener is live")

    job.refresh = no_http
    gates.open("live")
    wait_until(lambda: job.state == "finished", "job.state from the event stream")
    gates.open("w")
    wait_until(lambda: watcher.done, "watcher done")


def test_attach_and_dashboard_show_existing_jobs_after_kernel_restart(cp, gate_fn, gates):
    running = gate_fn.submit(gates["r"]).job_id
    gate_fn.submit(gates["s"])
    pending = gate_fn.submit(gates["t"]).job_id
    # "Kernel restart": a new process has a new client, no handles and no listener.
    stop_listener()
    session_module._listener = None
    api.connect(cp.url, cp.api_key)
    job = api.Job.attach(pending)
    assert job.state == "pending"
    set_widgets(True)
    bundle = job._repr_mimebundle_()
    widget = job_widget(job)
    assert bundle[WIDGET_VIEW_MIME]["model_id"] == widget.model_id
    assert "position 1" in status_text(widget)
    dashboard = JobsDashboard()
    assert {running, pending} <= {j.job_id for j in dashboard.visible_jobs()}
    gates.open("r")
    wait_until(lambda: widget.state == "running", "attached job runs live")
    wait_until(lambda: ">finished<" in dashboard.rows[running].state_cell.value, "dashboard live after restart")
    for name in ("s", "t"):
        gates.open(name)
    wait_until(lambda: widget.state == "finished", "attached job finished")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_listener_resumes_after_server_sigkill_and_restart(control_plane_factory, fresh_listener, gates):
    cp = control_plane_factory(gpu_classes=TWO_CLASSES, args=["--port", str(_free_port())])
    kernel_session.registered.clear()
    api.connect(cp.url, cp.api_key)
    fn = api.gpu_function(num_gpus=1)(wait_for_file)
    classes = GpuClassesWidget()  # starts the listener before the job exists, so it sees its events
    listener = get_listener()
    assert listener.wait_connected(DEADLINE_S)
    job = fn.submit(gates["k"])
    widget = JobWidget(job.job_id)
    wait_until(lambda: widget.state == "running", "running before the kill")
    wait_until(lambda: table_rows(classes.table.value)["default"][6] == "1", "usage seen")
    history = badge_history(widget)
    connects, last_id = listener.connects, listener.last_event_id
    assert last_id is not None

    cp.kill()
    wait_until(lambda: not listener.connected, "listener notices the server is gone")
    url = cp.url
    cp.start()  # same home, same port: the job is re-queued and started again
    assert cp.url == url
    wait_until(lambda: listener.connects > connects, "listener reconnected")
    assert listener.resumes >= 1  # with Last-Event-ID: the re-queue happened while we were away
    wait_until(lambda: history[-1] == "running" and "pending" in history, "re-queued then running again")
    gates.open("k")
    wait_until(lambda: widget.state == "finished", "finished after the restart")
    assert history == ["running", "pending", "running", "finished"]
    assert listener.failures >= 1 and len(running_threads()) == 2


def test_listener_follows_a_new_connection(control_plane_factory, fresh_listener, gates):
    cp = control_plane_factory(gpu_classes=TWO_CLASSES)
    kernel_session.registered.clear()
    api.connect(cp.url, cp.api_key)
    fn = api.gpu_function(num_gpus=1)(wait_for_file)
    job = fn.submit(gates["n"])
    widget = JobWidget(job.job_id)
    listener = get_listener()
    wait_until(lambda: widget.state == "running", "running")
    cp.kill()
    cp.start()  # a new port this time: `%lancefn connect NEW_URL`
    api.connect(cp.url, cp.api_key)
    wait_until(
        lambda: listener.connected and listener._stream_client is kernel_session.client, "stream on the new client"
    )
    gates.open("n")
    wait_until(lambda: widget.state == "finished", "finished, seen through the new connection")


def test_stop_listener_leaves_no_thread_and_unload_stops_it(cp, gate_fn, gates):
    widget = JobWidget(gate_fn.submit(gates["stop"]).job_id)
    assert get_listener().wait_connected(DEADLINE_S)
    assert {t.name for t in running_threads()} == {"lancefn-events", "lancefn-widgets-ticker"}
    stop_listener()
    assert running_threads() == [] and not get_listener().running
    # A new widget starts it again; unloading the extension stops it.
    JobWidget(widget.job_id)
    assert len(running_threads()) == 2
    from IPython.core.interactiveshell import InteractiveShell

    import lancefn_jupyter

    lancefn_jupyter.unload_ipython_extension(InteractiveShell.instance())
    assert running_threads() == []
    gates.open("stop")


def test_closed_widgets_and_dropped_jobs_are_unsubscribed(cp, gate_fn, gates):
    listener = get_listener()
    job = gate_fn.submit(gates["gc"])
    base = listener.subscriber_count()  # the Job handle's own subscription
    widgets = [JobWidget(job.job_id), GpuClassesWidget(), JobsDashboard(), FunctionCardWidget(gate_fn)]
    assert listener.subscriber_count() > base
    for widget in widgets:
        widget.close()
    del widgets, widget
    gc.collect()
    assert listener.subscriber_count() == base
    del job
    gc.collect()
    assert listener.subscriber_count() == base - 1
    # The listener holds widgets weakly: one that only ipywidgets' own close() released (so our
    # unsubscribe never ran) is collected and silently drops out as well.
    classes = GpuClassesWidget()
    assert listener.subscriber_count() == base
    ipywidgets.VBox.close(classes)
    del classes
    gc.collect()
    assert listener.subscriber_count() == base - 1
    gates.open("gc")


# ------------------------------------------------------------------------------ the team dashboard


def test_team_dashboard_shows_classes_batches_jobs_and_failures_live(cp, gate_fn, gates):
    from lancefn_jupyter.kernel.dashboards import team_dashboard

    dashboard = team_dashboard(batches_limit=2)
    assert "control plane " + cp.url in dashboard.heading.value
    assert isinstance(dashboard.classes, GpuClassesWidget) and "Simulated H100" in dashboard.classes.table.value
    assert dashboard.batch_rows == {} and dashboard.failures.state_filter.value == "FAILED"
    # Sections without content say so, never a bare heading or header row.
    assert "no batches yet" in dashboard.no_batches.value and dashboard.no_batches.layout.display != "none"
    for section, empty in ((dashboard.jobs, "no jobs yet"), (dashboard.failures, "no failed jobs yet")):
        assert empty in section.empty.value and section.grid.layout.display == "none"
        assert re.search(r">0 shown</span>", section.summary.value), section.summary.value
    widths = dashboard.jobs.grid.layout.grid_template_columns
    assert "auto" not in widths and "1fr" not in widths  # columns keep their widths as rows change
    done = gate_fn.submit(gates["done"])
    gates.open("done")
    wait_until(
        lambda: (
            done.job_id in dashboard.jobs.rows and ">finished<" in dashboard.jobs.rows[done.job_id].state_cell.value
        ),
        "a job finished",
    )
    # A finished job is not a failure: the failures' counts count failures only.
    assert re.search(r">0 shown</span>", dashboard.failures.summary.value), dashboard.failures.summary.value
    running = gate_fn.submit(gates["a"])
    wait_until(lambda: running.job_id in dashboard.jobs.rows, "a new job appears live")
    failing = api.gpu_function(num_gpus=1)(explode).submit(3)  # on the other GPU
    wait_until(lambda: failing.job_id in dashboard.failures.rows, "a failure is listed")
    assert [j.job_id for j in dashboard.failures.visible_jobs()] == [failing.job_id]
    assert re.search(r">1 shown · 1 failed</span>", dashboard.failures.summary.value), dashboard.failures.summary.value
    assert dashboard.failures.empty.value == "" and dashboard.failures.grid.layout.display == "grid"
    # Three batches (distinct inputs: a repeated map is the same batch) started after the dashboard was built.
    batches = [gate_fn.map([gates[f"b{i}"]] * 2, parallel=2) for i in range(3)]
    wait_until(lambda: set(dashboard.batch_rows) == {b.batch_id for b in batches[1:]}, "the 2 newest batches shown")
    assert dashboard.no_batches.layout.display == "none"
    assert [row.batch_id for row in dashboard.batches.children] == [batches[2].batch_id, batches[1].batch_id]
    # A late event of the batch pushed off the bottom (events of several batches interleave) leaves the rows be.
    dashboard._on_batch(dashboard._client.batches.describe(batches[0].batch_id))
    assert [row.batch_id for row in dashboard.batches.children] == [batches[2].batch_id, batches[1].batch_id]
    assert running.job_id not in dashboard.failures.rows and running.job_id in dashboard.jobs.rows
    for name in ("a", "b0", "b1", "b2"):
        gates.open(name)
    wait_until(lambda: ">finished<" in dashboard.jobs.rows[running.job_id].state_cell.value, "the job finishes")
    # The jobs' counts add up to the rows shown.
    shown = dashboard.jobs.visible_jobs()
    counts = re.findall(r"(\d+) (?:running|pending|finished|failed|cancelled|timed out)", dashboard.jobs.summary.value)
    assert sum(map(int, counts)) == len(shown) and f">{len(shown)} shown" in dashboard.jobs.summary.value
    dashboard.close()


def test_dashboard_command_serves_the_shipped_notebook_on_localhost(monkeypatch):
    import importlib.util
    import json

    from lancefn_jupyter.kernel.dashboards import cli

    notebook = json.loads(cli.NOTEBOOK.read_text())
    assert [cell["cell_type"] for cell in notebook["cells"]] == ["code"]  # thin: the logic is in dashboards/team.py
    assert "team_dashboard()" in "".join(notebook["cells"][0]["source"])
    assert cli.voila_argv(9000) == [
        str(cli.NOTEBOOK),
        "--port=9000",
        "--Voila.ip=127.0.0.1",
        "--KernelManager.transport=ipc",  # the kernel's sockets in Voilà's private directory, not on TCP
        "--PasswordIdentityProvider.allow_password_change=False",  # the login page writes no config file
        "--no-browser",
    ]
    assert "--no-browser" not in cli.voila_argv(9000, open_browser=True)
    with pytest.raises(SystemExit) as bad_port:
        cli.main(["--port", "70000"])
    assert bad_port.value.code == 2
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as missing:
        cli.main([])
    assert missing.value.code == cli.MISSING_VOILA  # says: pip install 'lancefn-jupyter[dashboard]'
    # Only the command runs Voilà: importing the dashboards (as the kernel does) loads neither it nor widgets.
    probe = (
        "import sys, lancefn_jupyter.kernel.dashboards.cli; print(sorted({'voila', 'ipywidgets'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_dashboard_command_logins_urls_and_refusals(monkeypatch, tmp_path, capsys):
    """The pure parts of the dashboard's login (the served command is tested in tests/jupyter), and each way of
    giving a token that is refused before anything is served, with what to change."""
    from lancefn_jupyter.kernel.dashboards import cli

    assert cli.dashboard_url(8866, "a/b c") == "http://127.0.0.1:8866/?token=a%2Fb%20c"
    assert cli.dashboard_url(8866, "") == "http://127.0.0.1:8866/"  # --no-auth
    assert cli.without_token("/", "token=secret") == "/"
    assert cli.without_token("/", "template=lab&token=secret&theme=dark") == "/?template=lab&theme=dark"
    page = cli.redirect_page("http://127.0.0.1:8866/?token=a&b")
    assert 'content="0;url=http://127.0.0.1:8866/?token=a&amp;b"' in page
    assert "127.0.0.1:9000 — every local user and every job — can act with this dashboard's key" in (
        cli.no_auth_warning(9000)
    )
    assert cli.checked_token("  0123456789abcdef\n", "x") == "0123456789abcdef"

    def refused(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit:
            cli.main(list(argv))
        assert exit.value.code == 2
        return capsys.readouterr().err

    monkeypatch.setenv(cli.TOKEN_ENV, "short")
    assert f"{cli.TOKEN_ENV} holds 5 characters; a dashboard token needs at least 16" in refused()
    assert f"--no-auth and {cli.TOKEN_ENV} contradict each other" in refused("--no-auth")
    token_file = tmp_path / "token"
    token_file.write_text("0123456789abcdef0123\n")
    assert "both give a token" in refused("--token-file", str(token_file))
    monkeypatch.delenv(cli.TOKEN_ENV)
    token_file.chmod(0o644)
    assert f"mode 644); fix it with: chmod 600 {token_file}" in refused("--token-file", str(token_file))
    assert "not allowed with argument" in refused("--token-file", str(token_file), "--no-auth")
    assert "cannot read --token-file" in refused("--token-file", str(tmp_path / "absent"))
