/**
 * Plain-DOM pieces the panel's sections share: element creation, text updates that leave an
 * unchanged node alone, keyed rows updated in place, progress meters and the Cancel button's state.
 */

export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

export function setText(node: HTMLElement, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

/**
 * Makes `body` show one row per item, in order: rows are kept in `rows` by key and updated in place
 * (so a button under the pointer is never replaced), new ones created, and anything else in `body`
 * (placeholders, rows of items no longer listed) removed.
 */
export function syncRows<T, R extends { root: HTMLElement }>(
  body: HTMLElement,
  rows: Map<string, R>,
  items: readonly T[],
  key: (item: T) => string,
  create: (key: string) => R,
  update: (row: R, item: T) => void
): void {
  const wanted = new Set(items.map(key));
  for (const [id, row] of rows) {
    if (!wanted.has(id)) {
      row.root.remove();
      rows.delete(id);
    }
  }
  const roots = new Set<Element>(Array.from(rows.values(), row => row.root));
  for (const child of Array.from(body.children)) {
    if (!roots.has(child)) {
      child.remove();
    }
  }
  items.forEach((item, index) => {
    const id = key(item);
    let row = rows.get(id);
    if (!row) {
      row = create(id);
      rows.set(id, row);
    }
    update(row, item);
    if (body.children[index] !== row.root) {
      body.insertBefore(row.root, body.children[index] ?? null);
    }
  });
}

/** A progress meter (`progress`) whose fill (`bar`) is sized to the fraction done, and its text. */
export function progressMeter(): { progress: HTMLElement; bar: HTMLElement; text: HTMLElement } {
  const progress = el('div', 'lf-job-progress');
  const meter = el('div', 'lf-meter');
  const bar = el('div', 'lf-meter-fill');
  meter.appendChild(bar);
  const text = el('span', 'lf-progress-text');
  progress.append(meter, text);
  return { progress, bar, text };
}

/** A row with a Cancel button and an error line under it. */
export interface ICancellableRow {
  cancel: HTMLButtonElement;
  error: HTMLElement;
  /** A cancel request is in flight (the button stays disabled until it fails or the row ends). */
  cancelling: boolean;
}

export function cancelButton(title?: string): HTMLButtonElement {
  const cancel = el('button', 'lf-job-cancel jp-mod-styled jp-mod-warn', 'Cancel');
  cancel.type = 'button';
  if (title) {
    cancel.title = title;
  }
  return cancel;
}

/** Shows Cancel while the row can be cancelled; disabled while a request is in flight. */
export function showCancel(row: ICancellableRow, cancellable: boolean): void {
  row.cancel.style.display = cancellable ? '' : 'none';
  row.cancel.disabled = row.cancelling;
  if (!cancellable) {
    row.cancelling = false;
  }
}

/** Sends a cancel request for the row; a failure re-enables the button and is shown under the row. */
export async function cancelRow(row: ICancellableRow, request: () => Promise<void>): Promise<void> {
  row.cancelling = true;
  row.cancel.disabled = true;
  row.error.textContent = '';
  row.error.style.display = 'none';
  try {
    await request();
  } catch (err) {
    row.cancelling = false;
    row.cancel.disabled = false;
    row.error.textContent = `cancel failed: ${(err as Error).message ?? String(err)}`;
    row.error.style.display = '';
  }
}
