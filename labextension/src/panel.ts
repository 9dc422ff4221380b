/**
 * The "GPU Functions" side panel: a Lumino widget rendered with plain DOM (no React, no extra
 * bundle weight). All wording and numbers come from the pure helpers in ./format, ./timings and ./reducers;
 * this file only places them (with ./dom). Job rows are keyed by job id and updated in place, so a Cancel button under the
 * pointer is never replaced while the list ticks.
 */

import { LabIcon } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { BatchRows } from './batchesView';
import { IPanelState, LiveConnection } from './connection';
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
import {
  attachSnippet,
  canCancel,
  diffText,
  failureText,
  formatElapsed,
  jobElapsedMs,
  jobPlacementText,
  jobTitle,
  lookupSnippet,
  progressOf,
  queueText,
  resultText,
  showNamespaces,
  stateBadge
} from './format';
import { classRows, groupFunctions, listedJobs } from './reducers';
import { jobTimingsText, timingsBreakdown } from './timings';
import { IJob, isTerminal } from './wire';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M7 7h10v10H7z" opacity=".35"/>
    <path d="M9 2h2v3H9zM13 2h2v3h-2zM9 19h2v3H9zM13 19h2v3h-2zM2 9h3v2H2zM2 13h3v2H2zM19 9h3v2h-3zM19 13h3v2h-3z"/>
    <path d="M5 5h14v14H5zm2 2v10h10V7z"/>
  </g>
</svg>`;

/**
 * The jobs section's empty text. It also says where the panel lives in each front end, for a user who
 * closed it: JupyterLab's left sidebar (chip icon) or Notebook 7's View → Left Sidebar menu.
 */
export const NO_JOBS_TEXT =
  'No jobs yet. Submit one with f.submit(x) in a notebook. ' +
  'This panel: the chip icon in the left sidebar (JupyterLab), ' +
  'View → Left Sidebar → Show GPU Functions (Notebook 7), or the palette: Open GPU Functions Panel.';

export const gpuIcon = new LabIcon({ name: 'lancefn-jupyter:gpu', svgstr: GPU_SVG });

/**
 * Shows a section's error, or (with nothing to list) its empty text, in place of its content;
 * says whether it did. Before the first connection the empty text is a dash.
 */
function placeholder(
  body: HTMLElement,
  state: Readonly<IPanelState>,
  error: string | null | undefined,
  count: number,
  emptyText: string
): boolean {
  if (!error && count > 0) {
    return false;
  }
  body.textContent = '';
  const connected = state.status.kind === 'connected';
  body.appendChild(
    error ? el('div', 'lf-error', error) : el('div', 'lf-empty', connected ? emptyText : '—')
  );
  return true;
}

interface IJobRow extends ICancellableRow {
  root: HTMLElement;
  badge: HTMLElement;
  title: HTMLElement;
  namespace: HTMLElement;
  elapsed: HTMLElement;
  placement: HTMLElement;
  queue: HTMLElement;
  timings: HTMLElement;
  progress: HTMLElement;
  progressBar: HTMLElement;
  progressText: HTMLElement;
  failure: HTMLElement;
  insert: HTMLButtonElement;
}

/**
 * Puts a code cell into the user's current notebook (below the active cell) and returns whether
 * there was a notebook to put it in. Provided by the plugin when the notebook tracker exists.
 */
export type CodeInserter = (code: string) => boolean;

export class GpuFunctionsPanel extends Widget {
  constructor(
    readonly connection: LiveConnection,
    private readonly _insertCode: CodeInserter | null = null
  ) {
    super();
    this.id = 'lancefn-gpu-functions';
    this.addClass('lf-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU Functions';

    const header = el('div', 'lf-header');
    header.appendChild(el('h2', 'lf-title', 'GPU Functions'));
    this._status = el('div', 'lf-status');
    this._statusText = el('span', 'lf-status-text');
    this._retry = el('button', 'lf-retry jp-mod-styled', 'Retry now');
    this._retry.type = 'button';
    this._retry.addEventListener('click', () => this.connection.retryNow());
    this._status.append(this._statusText, this._retry);
    header.appendChild(this._status);

    const classes = this._section('GPU classes', 'lf-classes');
    this._classesBody = classes.body;
    const batches = this._section('Batches', 'lf-batches');
    this._batches = new BatchRows(
      batches.root,
      batches.body,
      batches.count,
      id => this.connection.cancelBatch(id),
      (id, action) => this.connection.toggleBatch(id, action)
    );
    const jobs = this._section('Jobs', 'lf-jobs');
    this._jobsBody = jobs.body;
    this._jobsCount = jobs.count;
    const functions = this._section('Functions', 'lf-functions');
    this._functionsBody = functions.body;
    this._functionsCount = functions.count;

    // The header sits above a scrolling body (never sticky over it), so it can cover no row however far
    // the body scrolls or a diff grows.
    const body = el('div', 'lf-body');
    body.append(classes.root, batches.root, jobs.root, functions.root);
    this.node.append(header, body);
    this._unsubscribe = this.connection.subscribe(state => this._render(state));
    this._render(this.connection.state);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._stopTicker();
    this._unsubscribe();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    // Connect lazily, when the panel is first shown; afterwards it stays live even when hidden,
    // so reopening it shows current state at once.
    this.connection.start();
    this._render(this.connection.state);
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this.connection.start();
    }
  }

  protected onBeforeDetach(msg: Message): void {
    this._stopTicker();
    super.onBeforeDetach(msg);
  }

  private _section(
    title: string,
    className: string
  ): { root: HTMLElement; body: HTMLElement; count: HTMLElement } {
    const root = el('section', `lf-section ${className}`);
    const heading = el('h3', 'lf-section-title', title);
    const count = el('span', 'lf-count');
    heading.appendChild(count);
    const body = el('div', 'lf-section-body');
    root.append(heading, body);
    return { root, body, count };
  }

  private _render(state: Readonly<IPanelState>): void {
    this._renderStatus(state);
    this._renderClasses(state);
    this._batches.render(state.batches ?? [], Date.now());
    this._renderJobs(state);
    this._renderFunctions(state);
    const needsTick =
      state.status.kind === 'unreachable' ||
      state.status.kind === 'error' ||
      state.jobs.some(j => !isTerminal(j.job_state)) ||
      (state.batches ?? []).some(b => !isTerminal(b.batch_state));
    if (needsTick) {
      this._startTicker();
    } else {
      this._stopTicker();
    }
  }

  private _renderStatus(state: Readonly<IPanelState>): void {
    const s = state.status;
    this._status.dataset.status = s.kind;
    let text: string;
    let showRetry = false;
    switch (s.kind) {
      case 'connected':
        text = `connected to ${s.url || 'control plane'}${s.embedded ? ' (embedded)' : ''}`;
        break;
      case 'connecting':
        text = s.message;
        break;
      case 'no-extension':
        text = s.message;
        showRetry = true;
        break;
      case 'unreachable':
      case 'error': {
        const seconds = Math.max(0, Math.ceil((s.retryAt - Date.now()) / 1000));
        text = `${s.message} — retrying in ${seconds} s`;
        showRetry = true;
        break;
      }
    }
    setText(this._statusText, text);
    this._statusText.title = text;
    this._retry.style.display = showRetry ? '' : 'none';
  }

  private _renderClasses(state: Readonly<IPanelState>): void {
    const body = this._classesBody;
    const rows = classRows(state.classes, state.usage);
    if (placeholder(body, state, state.classesError, rows.length, 'No GPU classes.')) {
      return;
    }
    body.textContent = '';
    for (const row of rows) {
      const card = el('div', 'lf-class');
      card.dataset.className = row.name;
      const top = el('div', 'lf-class-top');
      const name = el('span', 'lf-class-name', row.name);
      name.title = row.name;
      top.appendChild(name);
      if (row.simulated) {
        top.appendChild(el('span', 'lf-badge lf-simulated', 'simulated'));
      }
      card.appendChild(top);
      card.appendChild(el('div', 'lf-class-model', row.model || 'unknown GPU model'));
      const memory = row.memory ? `${row.memory} per GPU` : 'GPU memory not reported';
      card.appendChild(
        el(
          'div',
          'lf-class-hw',
          `${memory} · max ${row.maxPerWorker} GPUs per worker` + (row.host ? ` · ${row.host}` : '')
        )
      );
      const usage = el('div', 'lf-class-usage');
      if (row.total !== null && row.busy !== null) {
        const meter = el('div', 'lf-meter');
        const fill = el('div', 'lf-meter-fill');
        fill.style.width = row.total > 0 ? `${Math.round((100 * row.busy) / row.total)}%` : '0%';
        meter.appendChild(fill);
        usage.appendChild(meter);
        const text = row.pending > 0 ? `${row.usage} · ${row.pending} pending` : row.usage;
        usage.appendChild(el('span', 'lf-usage-text', row.nodes ? `${text} · ${row.nodes}` : text));
      } else {
        usage.appendChild(el('span', 'lf-usage-text', 'usage unknown'));
      }
      card.appendChild(usage);
      if (row.warm) {
        card.appendChild(el('div', 'lf-class-warm', row.warm));
      }
      body.appendChild(card);
    }
  }

  private _renderJobs(state: Readonly<IPanelState>): void {
    const body = this._jobsBody;
    const jobs = listedJobs(state.jobs);
    const active = jobs.filter(j => !isTerminal(j.job_state)).length;
    setText(this._jobsCount, jobs.length ? ` (${active} active)` : '');
    if (placeholder(body, state, state.jobsError, jobs.length, NO_JOBS_TEXT)) {
      this._jobRows.clear();
      return;
    }
    const now = Date.now();
    const namespaces = showNamespaces(jobs);
    syncRows(
      body,
      this._jobRows,
      jobs,
      j => j.job_id,
      id => this._createJobRow(id),
      (row, job) => this._updateJobRow(row, job, now, namespaces)
    );
  }

  private _createJobRow(jobId: string): IJobRow {
    const root = el('div', 'lf-job');
    root.dataset.jobId = jobId;
    const line1 = el('div', 'lf-job-line');
    const badge = el('span', 'lf-badge');
    const title = el('span', 'lf-job-title');
    const namespace = el('span', 'lf-job-namespace');
    const elapsed = el('span', 'lf-job-elapsed');
    line1.append(badge, title, namespace);
    const line2 = el('div', 'lf-job-line lf-job-meta');
    const placement = el('span', 'lf-job-placement');
    const queue = el('span', 'lf-job-queue');
    line2.append(placement, queue, elapsed);
    const { progress, bar: progressBar, text: progressText } = progressMeter();
    // Cold or warm ("cold start 1.2 s, setup 1.0 s", "warm") once the job ended on a worker, after
    // its rows; the tooltip has every phase.
    const timings = el('span', 'lf-job-timings');
    progress.appendChild(timings);
    const failure = el('div', 'lf-job-failure');
    const error = el('div', 'lf-error lf-job-error');
    const cancel = cancelButton();
    const insert = el('button', 'lf-job-insert jp-mod-styled', 'Insert');
    insert.type = 'button';
    insert.title = 'Add a cell with a Job handle on this job (Job.attach) to the current notebook';
    const row: IJobRow = {
      root,
      badge,
      title,
      namespace,
      elapsed,
      placement,
      queue,
      timings,
      progress,
      progressBar,
      progressText,
      failure,
      cancel,
      insert,
      error,
      cancelling: false
    };
    cancel.addEventListener(
      'click',
      () => void cancelRow(row, () => this.connection.cancelJob(jobId))
    );
    insert.addEventListener('click', () => this._insert(row, jobId));
    line2.append(insert, cancel);
    root.append(line1, line2, progress, failure, error);
    return row;
  }

  private _updateJobRow(row: IJobRow, job: IJob, now: number, namespaces = false): void {
    const badge = stateBadge(job.job_state);
    row.root.dataset.state = badge.label;
    row.badge.className = badge.className;
    setText(row.badge, badge.label);
    const title = jobTitle(job);
    setText(row.title, title);
    row.title.title = `${title}\njob ${job.job_id}`;
    setText(row.namespace, namespaces ? (job.namespace ?? '') : '');
    row.namespace.style.display = namespaces ? '' : 'none';
    setText(row.elapsed, formatElapsed(jobElapsedMs(job, now)));
    setText(row.placement, jobPlacementText(job));
    setText(row.queue, queueText(job, now));
    setText(row.timings, jobTimingsText(job));
    row.timings.title = timingsBreakdown(job.timings);
    row.progressText.title = row.progressText.textContent ?? '';
    const progress = progressOf(job);
    row.progress.style.display = progress.fraction === null ? 'none' : '';
    row.progressBar.style.width = `${Math.round(100 * (progress.fraction ?? 0))}%`;
    const result = resultText(job);
    setText(row.progressText, result ? `${progress.text} · ${result}` : progress.text);
    const failure = failureText(job);
    setText(row.failure, failure);
    row.failure.style.display = failure ? '' : 'none';
    row.failure.title = job.failure?.traceback ?? '';
    showCancel(row, canCancel(job));
    const insertable = this._insertCode !== null && job.job_type === 'run_function';
    row.insert.style.display = insertable && attachSnippet(job.job_id) ? '' : 'none';
    row.error.style.display = row.error.textContent ? '' : 'none';
  }

  private _insert(row: IJobRow, jobId: string): void {
    const code = attachSnippet(jobId);
    const inserted = code !== null && this._insertCode !== null && this._insertCode(code);
    row.error.textContent = inserted ? '' : 'open a notebook first, then click Insert again';
    row.error.style.display = inserted ? 'none' : '';
  }

  private _renderFunctions(state: Readonly<IPanelState>): void {
    const body = this._functionsBody;
    const groups = groupFunctions(state.functions);
    if (!state.functionsError) {
      setText(this._functionsCount, groups.length ? ` (${groups.length})` : '');
    }
    if (placeholder(body, state, state.functionsError, groups.length, 'No functions registered.')) {
      return;
    }
    body.textContent = '';
    for (const group of groups) {
      const item = el('div', 'lf-function');
      item.dataset.functionName = group.name;
      const name = el('span', 'lf-function-name', group.name);
      name.title = group.name;
      item.appendChild(name);
      const versions = el('span', 'lf-function-versions');
      const history = state.history.get(group.name);
      if (history && history.length) {
        // Newest first, each with what changed from the one before, Diff and Insert (lookup).
        versions.classList.add('lf-function-history');
        for (const entry of history) {
          versions.appendChild(this._versionRow(group.name, entry.version, entry.change ?? ''));
        }
      } else {
        for (const v of group.versions) {
          const code = el('code', 'lf-version', v);
          code.title = v;
          versions.appendChild(code);
        }
      }
      item.appendChild(versions);
      body.appendChild(item);
    }
  }

  private _versionRow(name: string, version: string, change: string): HTMLElement {
    const key = `${name}@${version}`;
    const row = el('div', 'lf-version-row');
    row.dataset.version = version;
    const line = el('div', 'lf-job-line');
    const code = el('code', 'lf-version', version);
    code.title = version;
    const what = el('span', 'lf-version-change', change);
    what.title = change;
    line.append(code, what);
    const note = el('div', 'lf-error lf-version-error');
    note.style.display = 'none';
    const snippet = lookupSnippet(name, version);
    if (snippet !== null && this._insertCode !== null) {
      const insert = el('button', 'lf-version-insert jp-mod-styled', 'Insert');
      insert.type = 'button';
      insert.title =
        'Add a cell that uses this version from any notebook or script (lancefn_jupyter.lookup)';
      insert.addEventListener('click', () => {
        const inserted = this._insertCode !== null && this._insertCode(snippet);
        note.textContent = inserted ? '' : 'open a notebook first, then click Insert again';
        note.style.display = inserted ? 'none' : '';
      });
      line.appendChild(insert);
    }
    const diff = el('pre', 'lf-diff');
    const shown = this._openDiffs.get(key);
    diff.textContent = shown ?? '';
    diff.style.display = shown === undefined ? 'none' : '';
    if (change && change !== 'first version') {
      const toggle = el('button', 'lf-version-diff jp-mod-styled', 'Diff');
      toggle.type = 'button';
      toggle.title = 'What changed from the version before';
      toggle.addEventListener('click', () => void this._toggleDiff(key, name, version, diff, note));
      line.appendChild(toggle);
    }
    row.append(line, note, diff);
    return row;
  }

  private async _toggleDiff(
    key: string,
    name: string,
    version: string,
    diff: HTMLElement,
    note: HTMLElement
  ): Promise<void> {
    if (this._openDiffs.has(key)) {
      this._openDiffs.delete(key);
      diff.style.display = 'none';
      return;
    }
    try {
      const text = diffText(await this.connection.fetchDiff(name, version));
      this._openDiffs.set(key, text);
      diff.textContent = text;
      diff.style.display = '';
      note.style.display = 'none';
    } catch (err) {
      note.textContent = `diff failed: ${(err as Error).message ?? String(err)}`;
      note.style.display = '';
    }
  }

  private _startTicker(): void {
    if (this._ticker === null) {
      this._ticker = window.setInterval(() => {
        if (this.isVisible) {
          const state = this.connection.state;
          this._renderStatus(state);
          this._renderJobs(state);
          if ([...state.usage.values()].some(u => u.warm_retire_ms?.length)) {
            this._renderClasses(state); // "retire in …" counts down, and a retired worker leaves the count
          }
        }
      }, 1000);
    }
  }

  private _stopTicker(): void {
    if (this._ticker !== null) {
      window.clearInterval(this._ticker);
      this._ticker = null;
    }
  }

  private _status: HTMLElement;
  private _statusText: HTMLElement;
  private _retry: HTMLButtonElement;
  private _classesBody: HTMLElement;
  private _batches: BatchRows;
  private _jobsBody: HTMLElement;
  private _jobsCount: HTMLElement;
  private _functionsBody: HTMLElement;
  private _functionsCount: HTMLElement;
  private _jobRows = new Map<string, IJobRow>();
  private _openDiffs = new Map<string, string>(); // name@version → diff text, kept across re-renders
  private _ticker: number | null = null;
  private _unsubscribe: () => void;
}
