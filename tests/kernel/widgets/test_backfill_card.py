"""A backfill's card (display/batch.py, docs/ARCHITECTURE.md "Backfills"): rows written and skipped, the first
skipped rows' messages with how to read the rest, and a failed commit; a batch that is no backfill shows none
of it. Built from wire models, no server."""

from __future__ import annotations

import pytest
from helpers import batch_record

from lancefn_jupyter.kernel.display.batch import SKIPPED_SHOWN, batch_card, batches_table
from lancefn_jupyter.wire.batch_models import BackfillError, Batch, BatchBackfill

pytestmark = pytest.mark.unit


def batch(*, skipped: int = 0, on_error: str = "skip", written: int = 998, commit_failure: str | None = None) -> Batch:
    backfill = BatchBackfill(
        table_uri="/data/lance/docs.lance",
        table_version=3,
        into="embedding",
        version_column="embedding__lancefn_version",
        columns={"text": "text"},
        on_error=on_error,
        rows_skipped=skipped,
        rows_written=written,
        commit_failure=commit_failure,
    )
    ended = {"started_ms": 0, "finished_ms": 2000, "rows_total": 1000, "rows_done": 1000, "chunks_total": 1}
    return batch_record(name="Embed", version="5c1e", chunk_counts={"DONE": 1}, strip="d", backfill=backfill, **ended)


def error(offset: int) -> BackfillError:
    return BackfillError(
        row_id=offset, fragment=0, offset=offset, message="ValueError: empty text", version="5c1e", chunk=0
    )


def test_a_backfill_card_says_rows_written_skipped_and_the_first_messages():
    text, markup = batch_card(batch(skipped=1), skipped=[error(17)])
    assert "backfill of 'embedding': 998/1,000 rows written · 1 row skipped" in text
    assert "skipped row 17 (fragment 0, offset 17): ValueError: empty text" in text
    assert "1 row skipped" in markup and "skipped row 17" in markup
    assert "more: backfill.errors()" not in text

    many = [error(i) for i in range(10)]
    text, _ = batch_card(batch(skipped=10), skipped=many)
    assert "10 rows skipped" in text
    assert text.count("skipped row ") == SKIPPED_SHOWN
    assert f"… {10 - SKIPPED_SHOWN} rows more: backfill.errors() lists every one" in text


def test_a_card_without_skips_a_failed_commit_and_a_plain_batch():
    text, _ = batch_card(batch(on_error="fail", written=1000))
    assert "1,000/1,000 rows written" in text and "skipped" not in text
    text, _ = batch_card(batch(written=0, commit_failure="fragment 0 was compacted"))
    assert "0/1,000 rows written · 0 rows skipped · commit failed: fragment 0 was compacted" in text
    plain = batch().model_copy(update={"backfill": None})
    assert "rows written" not in batch_card(plain)[0]
    table, _ = batches_table([batch(skipped=2)])
    assert "1000/1000 · 2 skipped" in table
