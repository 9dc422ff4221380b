/**
 * The panel's "Batches" section: one row per recent batch, keyed by id and updated in place —
 * badge, function, progress over all rows, rows/s and time left, the chunk strip coloured by state,
 * the failed chunk with its message, and Cancel. Wording comes from ./batches.
 */

import { batchView, IBatch } from './batches';
import { stateBadge } from './format';

interface IBatchRow {
  root: HTMLElement;
  badge: HTMLElement;
  title: HTMLElement;
  bar: HTMLElement;
  rows: HTMLElement;
  detail: HTMLElement;
  strip: HTMLElement;
  failure: HTMLElement;
  cancel: HTMLButtonElement;
  error: HTMLElement;
  cancelling: boolean;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

export class BatchRows {
  constructor(
    private readonly section: HTMLElement,
    private readonly body: HTMLElement,
    private readonly count: HTMLElement,
    private readonly cancelBatch: (batchId: string) => Promise<void>
  ) {}

  /** Shows `batches` (the section is hidden while there are none). */
  render(batches: readonly IBatch[], now: number): void {
    this.section.style.display = batches.length ? '' : 'none';
    const active = batches.filter(b => batchView(b, now).cancellable).length;
    setText(this.count, batches.length ? ` (${active} active)` : '');
    const wanted = new Set(batches.map(b => b.batch_id));
    for (const [id, row] of this._rows) {
      if (!wanted.has(id)) {
        row.root.remove();
        this._rows.delete(id);
      }
    }
    batches.forEach((batch, index) => {
      let row = this._rows.get(batch.batch_id);
      if (!row) {
        row = this._create(batch.batch_id);
        this._rows.set(batch.batch_id, row);
      }
      this._update(row, batch, now);
      if (this.body.children[index] !== row.root) {
        this.body.insertBefore(row.root, this.body.children[index] ?? null);
      }
    });
  }

  private _create(batchId: string): IBatchRow {
    const root = el('div', 'lf-job lf-batch');
    root.dataset.batchId = batchId;
    const line1 = el('div', 'lf-job-line');
    const badge = el('span', 'lf-badge');
    const title = el('span', 'lf-job-title');
    line1.append(badge, title);
    const progress = el('div', 'lf-job-progress');
    const meter = el('div', 'lf-meter');
    const bar = el('div', 'lf-meter-fill');
    meter.appendChild(bar);
    const rows = el('span', 'lf-progress-text');
    progress.append(meter, rows);
    const detail = el('div', 'lf-job-line lf-job-meta lf-batch-detail');
    const strip = el('div', 'lf-batch-strip');
    const failure = el('div', 'lf-job-failure');
    const error = el('div', 'lf-error lf-job-error');
    const cancel = el('button', 'lf-job-cancel jp-mod-styled jp-mod-warn', 'Cancel');
    cancel.type = 'button';
    cancel.title = 'Cancel every chunk still pending or running';
    const row: IBatchRow = {
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
    cancel.addEventListener('click', () => void this._cancel(row, batchId));
    line1.append(cancel);
    root.append(line1, progress, detail, strip, failure, error);
    return row;
  }

  private _update(row: IBatchRow, batch: IBatch, now: number): void {
    const view = batchView(batch, now);
    const badge = stateBadge(batch.batch_state);
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
    row.cancel.style.display = view.cancellable ? '' : 'none';
    row.cancel.disabled = row.cancelling;
    if (!view.cancellable) {
      row.cancelling = false;
    }
    row.error.style.display = row.error.textContent ? '' : 'none';
  }

  private async _cancel(row: IBatchRow, batchId: string): Promise<void> {
    row.cancelling = true;
    row.cancel.disabled = true;
    row.error.textContent = '';
    try {
      await this.cancelBatch(batchId);
    } catch (err) {
      row.cancelling = false;
      row.cancel.disabled = false;
      row.error.textContent = `cancel failed: ${(err as Error).message ?? String(err)}`;
      row.error.style.display = '';
    }
  }

  private _rows = new Map<string, IBatchRow>();
}
