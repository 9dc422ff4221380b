/**
 * Batches in the side panel: pure data and wording (unit-tested in src/__tests__/batches.spec.ts).
 *
 * A batch is one `f.map(..., parallel=…)` fanned out as chunk jobs (docs/ARCHITECTURE.md,
 * "Batches"). The panel lists recent batches from `batches/list` and keeps them current with the
 * stream's `batch` events (live only, no id: every (re)open of the stream refetches the list).
 */

import { displayState, formatElapsed } from './format';
import { isTerminal } from './wire';

export interface IBatchFailure {
  chunk: number;
  row_start: number;
  row_end: number;
  phase?: string;
  message?: string;
  traceback?: string | null;
}

export interface IBatch {
  batch_id: string;
  batch_state: string;
  name?: string;
  version?: string;
  creation_ms?: number;
  started_ms?: number | null;
  finished_ms?: number | null;
  rows_total?: number;
  rows_done?: number;
  chunks_total?: number;
  chunk_counts?: Record<string, number>;
  strip?: string;
  revision?: number;
  failure?: IBatchFailure | null;
  /** No new chunk starts until it is resumed (docs/ARCHITECTURE.md, "Batches": pause). */
  paused?: boolean;
}

/** The strip letters (one per chunk) and the state each stands for. */
export const STRIP_STATES: Record<string, string> = {
  p: 'pending',
  r: 'running',
  d: 'finished',
  f: 'failed',
  c: 'cancelled'
};

/** A cell of a folded strip shows the most urgent state among its chunks. */
const PRIORITY = 'fcrpd';

/** The strip as at most `width` cells (state names), folding long strips. */
export function stripCells(strip: string, width = 48): string[] {
  let letters = strip;
  if (strip.length > width) {
    const size = Math.ceil(strip.length / width);
    const cells: string[] = [];
    for (let start = 0; start < strip.length; start += size) {
      const part = strip.slice(start, start + size);
      cells.push([...PRIORITY].find(letter => part.includes(letter)) ?? 'p');
    }
    letters = cells.join('');
  }
  return [...letters].map(letter => STRIP_STATES[letter] ?? 'pending');
}

/** Rows per second since the first chunk started, and the time left at that rate (ms). */
export function batchRate(
  batch: IBatch,
  nowMs: number
): { rate: number | null; leftMs: number | null } {
  const done = batch.rows_done ?? 0;
  if (batch.started_ms === null || batch.started_ms === undefined || !done) {
    return { rate: null, leftMs: null };
  }
  const end = batch.finished_ms ?? nowMs;
  const rate = done / Math.max((end - batch.started_ms) / 1000, 0.001);
  const left = isTerminal(batch.batch_state)
    ? null
    : (((batch.rows_total ?? 0) - done) / rate) * 1000;
  return { rate, leftMs: left };
}

export interface IBatchView {
  title: string;
  state: string;
  fraction: number;
  rowsText: string;
  /** "12 finished, 2 running, 6 pending of 20 chunks · 210.0 rows/s · 2.0 s left" */
  detail: string;
  cells: string[];
  failure: string;
  cancellable: boolean;
  /** The state its badge shows: PAUSED while paused, else the batch's state. */
  badgeState: string;
  /** What its Pause/Resume button does now; null once the batch ended. */
  toggle: 'pause' | 'resume' | null;
}

/** Everything a batch row shows. */
export function batchView(batch: IBatch, nowMs: number): IBatchView {
  const total = batch.rows_total ?? 0;
  const done = batch.rows_done ?? 0;
  const counts = batch.chunk_counts ?? {};
  const names: [string, string][] = [
    ['DONE', 'finished'],
    ['IN_PROGRESS', 'running'],
    ['PENDING', 'pending'],
    ['FAILED', 'failed'],
    ['CANCELLED', 'cancelled']
  ];
  const parts = names
    .filter(([key]) => counts[key])
    .map(([key, label]) => `${counts[key]} ${label}`);
  let detail = `${parts.join(', ')} of ${batch.chunks_total ?? 0} chunks`;
  const { rate, leftMs } = batchRate(batch, nowMs);
  if (rate !== null) {
    detail += ` · ${rate.toFixed(1)} rows/s`;
  }
  if (leftMs !== null) {
    detail += ` · ${formatElapsed(leftMs)} left`;
  }
  const f = batch.failure;
  const ended = isTerminal(batch.batch_state);
  const paused = !ended && Boolean(batch.paused);
  return {
    title: batch.name ? `${batch.name}@${batch.version ?? '?'}` : batch.batch_id,
    state: paused ? 'paused' : displayState(batch.batch_state),
    fraction: total ? Math.max(0, Math.min(1, done / total)) : 0,
    rowsText: `${done}/${total} rows`,
    detail,
    cells: stripCells(batch.strip ?? ''),
    failure: f
      ? `chunk ${f.chunk} (rows ${f.row_start}–${f.row_end - 1}) failed${f.phase ? ` in ${f.phase}` : ''}: ${f.message ?? ''}`
      : '',
    cancellable: !ended,
    badgeState: paused ? 'PAUSED' : batch.batch_state,
    toggle: ended ? null : paused ? 'resume' : 'pause'
  };
}

/** Merge one batch (an event or a describe) into the list, newest first; never goes back in revision. */
export function applyBatchEvent(batches: readonly IBatch[], batch: IBatch, limit = 10): IBatch[] {
  const next = batches.slice();
  const index = next.findIndex(b => b.batch_id === batch.batch_id);
  if (index >= 0) {
    const current = next[index];
    if (
      (current.revision ?? 0) > (batch.revision ?? 0) ||
      (isTerminal(current.batch_state) && !isTerminal(batch.batch_state))
    ) {
      return next;
    }
    next[index] = batch;
  } else {
    next.push(batch);
  }
  next.sort((a, b) => (b.creation_ms ?? 0) - (a.creation_ms ?? 0));
  return next.slice(0, Math.max(1, limit));
}
