"""`Batch.pause()` / `resume()` from the kernel and the batch widget's Pause/Resume button (docs/ARCHITECTURE.md,
"Batches": pause): the card, the widget and `%gpu_jobs` say paused."""

from __future__ import annotations

from pathlib import Path

from helpers import gated, wait_until

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.display.batch import batch_card, batches_table
from lancefn_jupyter.kernel.widgets import BatchWidget


def test_pause_and_resume_a_batch_from_the_kernel_and_its_widget(control_plane, tmp_path):
    api.connect(control_plane.url, control_plane.api_key)
    gate = str(tmp_path / "gate")
    fn = api.gpu_function(num_gpus=1)(gated)
    batch = fn.map([(gate, v) for v in range(3)], chunk_size=1, parallel=2, fresh=True)
    widget = BatchWidget(batch.batch_id, function=fn)
    wait_until(lambda: batch.refresh().chunk_counts.get("IN_PROGRESS") == 2, "two chunks run")
    assert widget.pause_button.description == "Pause"
    assert batch.pause() is True and batch.pause() is False
    assert batch.state == "paused"
    wait_until(lambda: widget.state == "paused", "the widget hears of it")
    assert widget.pause_button.description == "Resume" and "paused" in widget.badge.value
    Path(gate).touch()
    wait_until(lambda: batch.refresh().chunk_counts.get("DONE") == 2, "the running chunks end")
    snapshot = batch.refresh()
    assert snapshot.paused and snapshot.chunk_counts == {"DONE": 2, "PENDING": 1}
    assert "paused" in batch_card(snapshot)[0] and "paused" in batches_table([snapshot])[0]
    assert widget.resume() is True  # the button's action
    assert batch.result() == [gated(gate, v) for v in range(3)]
    assert batch.resume() is False and batch.state == "finished"
    wait_until(lambda: widget.state == "finished", "the widget ends")
    assert widget.pause_button.layout.display == "none"
