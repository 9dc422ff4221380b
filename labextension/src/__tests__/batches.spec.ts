import { describe, expect, it } from 'vitest';

import { applyBatchEvent, batchView, IBatch, stripCells } from '../batches';

function batch(extra: Partial<IBatch> = {}): IBatch {
  return {
    batch_id: 'b1',
    batch_state: 'IN_PROGRESS',
    name: 'embed',
    version: 'v1',
    creation_ms: 1000,
    started_ms: 10_000,
    rows_total: 100,
    rows_done: 40,
    chunks_total: 5,
    chunk_counts: { DONE: 2, IN_PROGRESS: 2, PENDING: 1 },
    strip: 'ddrrp',
    revision: 3,
    ...extra
  };
}

describe('batch rows', () => {
  it('shows progress over all rows, rows/s, time left and the chunk strip', () => {
    const view = batchView(batch(), 14_000);
    expect(view.title).toBe('embed@v1');
    expect(view.state).toBe('running');
    expect(view.fraction).toBeCloseTo(0.4);
    expect(view.rowsText).toBe('40/100 rows');
    expect(view.detail).toBe(
      '2 finished, 2 running, 1 pending of 5 chunks · 10.0 rows/s · 6.0 s left'
    );
    expect(view.cells).toEqual(['finished', 'finished', 'running', 'running', 'pending']);
    expect(view.cancellable).toBe(true);
  });

  it('names the failed chunk and its rows', () => {
    const failed = batch({
      batch_state: 'FAILED',
      finished_ms: 20_000,
      strip: 'ddfdd',
      failure: {
        chunk: 2,
        row_start: 40,
        row_end: 60,
        phase: 'run',
        message: 'ValueError: bad row'
      }
    });
    const view = batchView(failed, 99_000);
    expect(view.failure).toBe('chunk 2 (rows 40–59) failed in run: ValueError: bad row');
    expect(view.detail).not.toContain('left');
    expect(view.cancellable).toBe(false);
  });

  it('says paused and offers Resume while paused, Pause while running, neither once ended', () => {
    const paused = batchView(batch({ paused: true }), 14_000);
    expect(paused.state).toBe('paused');
    expect(paused.badgeState).toBe('PAUSED');
    expect(paused.toggle).toBe('resume');
    expect(batchView(batch(), 14_000).toggle).toBe('pause');
    const ended = batchView(batch({ batch_state: 'DONE', paused: true }), 14_000);
    expect(ended.toggle).toBeNull();
    expect(ended.state).toBe('finished');
  });

  it('folds a long strip keeping the most urgent state of each cell', () => {
    const cells = stripCells('d'.repeat(100) + 'f' + 'd'.repeat(43), 48);
    expect(cells).toHaveLength(48);
    expect(cells.filter(c => c === 'failed')).toHaveLength(1);
  });

  it('applies events newest first and never goes back', () => {
    let list = applyBatchEvent([], batch());
    list = applyBatchEvent(list, batch({ batch_id: 'b2', creation_ms: 2000 }));
    expect(list.map(b => b.batch_id)).toEqual(['b2', 'b1']);
    list = applyBatchEvent(list, batch({ revision: 9, batch_state: 'DONE' }));
    list = applyBatchEvent(list, batch({ revision: 4 }));
    expect(list.find(b => b.batch_id === 'b1')?.batch_state).toBe('DONE');
  });
});
