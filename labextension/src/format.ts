/**
 * How the panel words and formats what it shows: states, sizes, durations, placements, progress,
 * failures, results, snippets and diffs. Pure (tested in src/__tests__/model.spec.ts).
 */

import { IJob, IResultSummary, isTerminal, IVersionDiff } from './wire';

const DISPLAY_STATE: Record<string, string> = {
  PENDING: 'pending',
  IN_PROGRESS: 'running',
  DONE: 'finished',
  FAILED: 'failed',
  CANCELLED: 'cancelled',
  TIMED_OUT: 'timed out'
};

/** The user-facing word for a wire job state (docs/ARCHITECTURE.md, "REST API (v1)"): pending, running, finished, ... */
export function displayState(state: string): string {
  return (
    DISPLAY_STATE[state] ??
    String(state || 'unknown')
      .toLowerCase()
      .replace(/_/g, ' ')
  );
}

/** Label and CSS class of a job's state badge. */
export function stateBadge(state: string): { label: string; className: string } {
  const label = displayState(state);
  return { label, className: `lf-badge lf-state-${label.replace(/\s+/g, '-')}` };
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Human memory size in binary units: 85899345920 → "80 GiB", 1536 → "1.5 KiB". */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes) || bytes < 0) {
    return '—';
  }
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  if (unit === 0) {
    return `${Math.round(value)} B`;
  }
  const rounded = value >= 10 ? Math.round(value) : Math.round(value * 10) / 10;
  return `${rounded} ${UNITS[unit]}`;
}

/** Human duration: 400 → "0.4 s", 12_000 → "12 s", 65_000 → "1 m 05 s", 3_720_000 → "1 h 02 m". */
export function formatElapsed(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) {
    return '—';
  }
  const clamped = Math.max(0, ms);
  if (clamped < 10_000) {
    return `${(Math.floor(clamped / 100) / 10).toFixed(1)} s`;
  }
  const totalSeconds = Math.floor(clamped / 1000);
  if (totalSeconds < 60) {
    return `${totalSeconds} s`;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  const totalMinutes = Math.floor(totalSeconds / 60);
  if (totalMinutes < 60) {
    return `${totalMinutes} m ${pad(totalSeconds % 60)} s`;
  }
  const hours = Math.floor(totalMinutes / 60);
  return `${hours} h ${pad(totalMinutes % 60)} m`;
}

/**
 * How long the job has been in its current phase: waiting (pending), running, or how long it
 * ran (terminal). `null` when the job carries no timestamps.
 */
export function jobElapsedMs(job: IJob, nowMs: number): number | null {
  const created = job.creation_ms ?? null;
  const started = job.started_ms ?? null;
  const finished = job.finished_ms ?? null;
  if (isTerminal(job.job_state)) {
    const from = started ?? created;
    return from !== null && finished !== null ? finished - from : null;
  }
  if (job.job_state === 'IN_PROGRESS') {
    const from = started ?? created;
    return from !== null ? nowMs - from : null;
  }
  return created !== null ? nowMs - created : null;
}

/** `function@version` for a run job, `register name` for a registration, else the job type. */
export function jobTitle(job: IJob): string {
  const name = job.spec?.name;
  const version = job.spec?.version;
  if (job.job_type === 'create_function') {
    return name ? `register ${name}` : 'register function';
  }
  if (name) {
    return version ? `${name}@${version}` : name;
  }
  return job.job_type ?? 'job';
}

/** "default · 2 GPUs (sim0, sim1)" */
export function jobPlacementText(job: IJob): string {
  const p = job.placement ?? {};
  const parts: string[] = [];
  if (p.gpu_class) {
    parts.push(p.gpu_class);
  }
  const n = p.num_gpus ?? 0;
  if (n > 0) {
    let gpus = `${n} GPU${n === 1 ? '' : 's'}`;
    if (p.devices && p.devices.length > 0) {
      gpus += ` (${p.devices.join(', ')})`;
    }
    parts.push(gpus);
  }
  return parts.join(' · ');
}

/**
 * Whether the namespace is worth showing: jobs of more than one namespace are listed (an admin on a
 * shared server). A key that sees only its own team's jobs gets no namespace label.
 */
export function showNamespaces(jobs: readonly IJob[]): boolean {
  return new Set(jobs.map(j => j.namespace).filter(ns => ns)).size > 1;
}

/**
 * A pending job's place and estimate, the one wording of every front end (Python's `queue_text` in
 * kernel/display/cards.py words it alike, tested on the same cases, queue-cases.json): "position 2, starts in
 * about 40 s"; "position 2" with no estimate offered (CPU jobs, Ray); "" when the job is not queued.
 */
export function queueText(job: IJob, nowMs: number = Date.now()): string {
  const pos = job.placement?.queue_position;
  if (job.job_state !== 'PENDING' || pos === null || pos === undefined) {
    return '';
  }
  const estimate = expectedStartText(job, nowMs);
  return estimate ? `position ${pos}, ${estimate}` : `position ${pos}`;
}

/** A time to come in the front ends' one wording ("40 s", "8 min", "1.5 h"), as `duration_text` in Python. */
export function durationText(seconds: number): string {
  if (seconds < 90) {
    return `${Math.max(0, Math.round(seconds))} s`;
  }
  if (seconds < 90 * 60) {
    return `${Math.round(seconds / 60)} min`;
  }
  return `${(Math.round(seconds / 360) / 10).toFixed(1)} h`;
}

/**
 * "starts in about 40 s" for a queued GPU job with an estimate, "start time unknown" when the control
 * plane has no run history to estimate from (null), "start time uncertain (best guess 40 s)" when it
 * flags the estimate `expected_start_uncertain`, "" when it offers none (absent, CPU jobs, Ray).
 */
export function expectedStartText(job: IJob, nowMs: number): string {
  const p = job.placement;
  if (
    job.job_state !== 'PENDING' ||
    !p ||
    p.queue_position === null ||
    p.queue_position === undefined
  ) {
    return '';
  }
  const at = p.expected_start_ms;
  if (at === undefined || !(p.num_gpus ?? 0)) {
    return '';
  }
  if (at === null) {
    return 'start time unknown';
  }
  const waitS = (at - nowMs) / 1000;
  const after = durationText(waitS);
  if (p.expected_start_uncertain) {
    return `start time uncertain (best guess ${after})`;
  }
  return waitS < 1.5 ? 'starts any moment' : `starts in about ${after}`;
}

/** Progress as "3/10 rows" with a 0..1 fraction (fraction is null when the total is unknown). */
export function progressOf(job: IJob): { text: string; fraction: number | null } {
  const done = job.progress?.rows_done ?? 0;
  const total = job.progress?.rows_total ?? job.spec?.rows_total ?? 0;
  if (!total) {
    return { text: '', fraction: null };
  }
  return {
    text: `${done}/${total} row${total === 1 ? '' : 's'}`,
    fraction: Math.max(0, Math.min(1, done / total))
  };
}

/** The failure line shown under a failed/timed-out job. */
export function failureText(job: IJob): string {
  const f = job.failure;
  if (!f || !f.message) {
    return '';
  }
  return f.phase ? `${f.phase}: ${f.message}` : f.message;
}

function describeSummary(s: IResultSummary): string {
  if (s.type === 'list' && s.item) {
    // The rows' own summary, then their bytes in all (an older item's nbytes was its first row's only).
    const item = describeSummary({ ...s.item, nbytes: undefined });
    const total = s.items_nbytes ? `, ${formatBytes(s.items_nbytes)} in all` : '';
    return `list of ${s.shape?.[0] ?? '?'} × ${item}${total}`;
  }
  const parts = [s.type ?? '?'];
  if (s.dtype) {
    parts.push(s.dtype.length <= 40 ? s.dtype : `${s.dtype.slice(0, 39)}…`);
  }
  if (s.shape) {
    parts.push(`(${s.shape.join(', ')}${s.shape.length === 1 ? ',' : ''})`);
  } else if (s.shape_varies) {
    parts.push('of varying shapes');
  }
  let text = parts.join(' ');
  if (s.nbytes) {
    text += `, ${formatBytes(s.nbytes)}`;
  }
  const n = s.nonfinite;
  if (n) {
    const found = [
      n.nan ? `${n.nan} NaN` : '',
      n.inf ? `${n.inf} +Inf` : '',
      n['-inf'] ? `${n['-inf']} -Inf` : ''
    ].filter(Boolean);
    text += `; holds ${found.join(', ')} of ${n.floats ?? '?'} floats`;
  }
  return text;
}

/** A finished job's Arrow result in a few words ("ndarray float32 (1000, 768), 2.9 MiB"); '' otherwise. */
export function resultText(job: IJob): string {
  const s = job.result_summary;
  if (job.job_state !== 'DONE' || job.result_format !== 'arrow' || !s) {
    return '';
  }
  return describeSummary(s) + (s.expired ? ' (removed by retention)' : '');
}

/** Whether the panel offers Cancel for this job. */
export function canCancel(job: IJob): boolean {
  return job.job_state === 'PENDING' || job.job_state === 'IN_PROGRESS';
}

/**
 * The code cell the panel's "Insert" button adds to the current notebook: a `Job` handle on this
 * job (state, wait, result, logs, cancel) in the kernel, like `%gpu_jobs` rows. Null for ids that
 * are not plain job ids (the control plane's are hex), so nothing odd is ever written into code.
 */
export function attachSnippet(jobId: string): string | null {
  if (!/^[A-Za-z0-9_-]{1,128}$/.test(jobId)) {
    return null;
  }
  return `from lancefn_jupyter import Job\n\njob = Job.attach("${jobId}")\njob`;
}

/**
 * The cell that uses a registered version from any notebook or script (`lancefn_jupyter.lookup`).
 * Null for names or versions with characters that are not in function names / version ids.
 */
export function lookupSnippet(name: string, version: string): string | null {
  if (!/^[A-Za-z_][A-Za-z0-9_.-]{0,127}$/.test(name) || !/^[A-Za-z0-9]{6,64}$/.test(version)) {
    return null;
  }
  const variable = /^[A-Za-z_][A-Za-z0-9_]*$/.test(name) ? name : 'fn';
  return `import lancefn_jupyter\n\n${variable} = lancefn_jupyter.lookup("${name}@${version.slice(0, 8)}")\n${variable}`;
}

/** The `functions/diff` reply as text: a header, the runtime differences, then the unified source diff. */
export function diffText(diff: IVersionDiff): string {
  const lines = [`${diff.old ?? '?'} → ${diff.new ?? '?'}: ${diff.summary ?? ''}`];
  for (const [field, before, after] of diff.runtime ?? []) {
    lines.push(`${field}: ${before} → ${after}`);
  }
  const source = diff.source_diff ?? [];
  lines.push(...(source.length ? source : ['source unchanged']));
  return lines.join('\n');
}
