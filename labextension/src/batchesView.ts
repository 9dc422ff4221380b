/**
 * The panel's "Batches" section: one row per recent batch, keyed by id and updated in place —
 * badge, function, progress over all rows, rows/s and time left, the chunk strip coloured by state,
 * the failed chunk with its message, and Cancel. Wording comes from ./batches.
 */

import { batchView, IBatch } from './batches';
import {
  cancelButton,
  cancelRow,
  el,
  ICancellableRow,
  progressMeter,
  setText,
  showCancel,
  syncRows
} from './dom';
import { stateBadge } from './format';

interface IBatchRow extends ICancellableRow {
  root: HTMLElement;
  badge: HTMLElement;
  title: HTMLElement;
  bar: HTMLElement;
  rows: HTMLElement;
  detail: HTMLElement;
  strip: HTMLElement;
  failure: HTMLElement;
  toggle: HTMLButtonElement;
}

export class BatchRows {
  constructor(
    private readonly section: HTMLElement,
    private readonly body: HTMLElement,
    private readonly count: HTMLElement,
    private readonly cancelBatch: (batchId: string) => Promise<void>,
    private readonly toggleBatch: (batchId: string, action: 'pause' | 'resume') => Promise<void>
  ) {}

  /** Shows `batches` (the section is hidden while there are none). */
  render(batches: readonly IBatch[], now: number): void {
    this.section.style.display = batches.length ? '' : 'none';
    const active = batches.filter(b => batchView(b, now).cancellable).length;
    setText(this.count, batches.length ? ` (${active} active)` : '');
    syncRows(
      this.body,
      this._rows,
      batches,
      b => b.batch_id,
      id => this._create(id),
      (row, batch) => this._update(row, batch, now)
    );
  }

  private _create(batchId: string): IBatchRow {
    const root = el('div', 'lf-job lf-batch');
    root.dataset.batchId = batchId;
    const line1 = el('div', 'lf-job-line');
    const badge = el('span', 'lf-badge');
    const title = el('span', 'lf-job-title');
    line1.append(badge, title);
    const { progress, bar, text: rows } = progressMeter();
    const detail = el('div', 'lf-job-line lf-job-meta lf-batch-detail');
    const strip = el('div', 'lf-batch-strip');
    const failure = el('div', 'lf-job-failure');
    const error = el('div', 'lf-error lf-job-error');
    const cancel = cancelButton('Cancel every chunk still pending or running');
    const toggle = el('button', 'lf-batch-toggle jp-mod-styled', 'Pause') as HTMLButtonElement;
    toggle.type = 'button';
    const row: IBatchRow = {
      toggle,
      root,
      badge,
      title,
      bar,
      rows,
      detail,
      strip,
      failure,
      cancel,
      error,
      cancelling: false
    };
    cancel.addEventListener('click', () => void cancelRow(row, () => this.cancelBatch(batchId)));
    toggle.addEventListener('click', () => {
      const action = toggle.dataset.action as 'pause' | 'resume';
      toggle.disabled = true;
      error.textContent = '';
      this.toggleBatch(batchId, action)
        .catch(err => {
          error.textContent = `${action} failed: ${(err as Error).message ?? String(err)}`;
          error.style.display = '';
        })
        .finally(() => {
          toggle.disabled = false;
        });
    });
    line1.append(toggle, cancel);
    root.append(line1, progress, detail, strip, failure, error);
    return row;
  }

  private _update(row: IBatchRow, batch: IBatch, now: number): void {
    const view = batchView(batch, now);
    const badge = stateBadge(view.badgeState);
    row.root.dataset.state = view.state;
    row.badge.className = badge.className;
    setText(row.badge, badge.label);
    setText(row.title, `batch ${view.title}`);
    row.title.title = batch.batch_id;
    row.bar.style.width = `${Math.round(100 * view.fraction)}%`;
    setText(row.rows, view.rowsText);
    setText(row.detail, view.detail);
    const key = view.cells.join(',');
    if (row.strip.dataset.cells !== key) {
      row.strip.dataset.cells = key;
      row.strip.textContent = '';
      for (const state of view.cells) {
        const cell = el('span', `lf-chunk lf-chunk-${state}`);
        cell.title = state;
        row.strip.appendChild(cell);
      }
    }
    setText(row.failure, view.failure);
    row.failure.style.display = view.failure ? '' : 'none';
    row.failure.title = batch.failure?.traceback ?? '';
    showCancel(row, view.cancellable);
    row.toggle.style.display = view.toggle ? '' : 'none';
    row.toggle.dataset.action = view.toggle ?? '';
    setText(row.toggle, view.toggle === 'resume' ? 'Resume' : 'Pause');
    row.toggle.title =
      view.toggle === 'resume'
        ? 'Go on where it stopped'
        : 'No new chunk starts; running ones finish';
    row.error.style.display = row.error.textContent ? '' : 'none';
  }

  private _rows = new Map<string, IBatchRow>();
}
