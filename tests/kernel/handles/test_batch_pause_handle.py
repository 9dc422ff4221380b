"""`Batch.pause()` / `resume()` from the kernel (docs/ARCHITECTURE.md, "Batches": pause): the card says paused."""

from __future__ import annotations

from pathlib import Path

from helpers import gated, wait_until

from lancefn_jupyter.kernel import api
from lancefn_jupyter.kernel.display.batch import batch_card


def test_pause_and_resume_a_batch_from_the_kernel(control_plane, tmp_path):
    api.connect(control_plane.url, control_plane.api_key)
    gate = str(tmp_path / "gate")
    fn = api.gpu_function(num_gpus=1)(gated)
    batch = fn.map([(gate, v) for v in range(3)], chunk_size=1, parallel=2, fresh=True)
    wait_until(lambda: batch.refresh().chunk_counts.get("IN_PROGRESS") == 2, "two chunks run")
    assert batch.pause() is True and batch.pause() is False
    assert batch.state == "paused"
    Path(gate).touch()
    wait_until(lambda: batch.refresh().chunk_counts.get("DONE") == 2, "the running chunks end")
    snapshot = batch.refresh()
    assert snapshot.paused and snapshot.chunk_counts == {"DONE": 2, "PENDING": 1}
    assert "paused" in batch_card(snapshot)[0]
    assert batch.resume() is True
    assert batch.result() == [gated(gate, v) for v in range(3)]
    assert batch.resume() is False and batch.state == "finished"
