/**
 * Pure data and presentation logic of the GPU Functions panel.
 *
 * Nothing in this module touches the DOM, the network or JupyterLab, so it is unit-tested
 * directly (src/__tests__/model.spec.ts). The wire shapes mirror the control plane's REST API
 * (docs/ARCHITECTURE.md, "REST API (v1)"); every field the panel reads is optional-tolerant because the server omits fields
 * that are `None` or equal to their default.
 */

export type JobStateWire =
  'PENDING' | 'IN_PROGRESS' | 'DONE' | 'FAILED' | 'CANCELLED' | 'TIMED_OUT';

export interface IJobPlacement {
  gpu_class?: string | null;
  num_gpus?: number;
  devices?: string[];
  waiting_on_capacity?: boolean;
  queue_position?: number | null;
  node?: string | null;
  /** When a queued GPU job should start (epoch ms); null: unknown; absent: no estimate offered. */
  expected_start_ms?: number | null;
}

export interface IJobProgress {
  rows_done?: number;
  rows_total?: number;
}

export interface IJobFailure {
  phase?: string;
  message?: string;
  retryable?: boolean;
  traceback?: string | null;
}

export interface IJob {
  job_id: string;
  job_type?: string;
  job_state: JobStateWire | string;
  creation_ms?: number;
  started_ms?: number | null;
  finished_ms?: number | null;
  spec?: { name?: string; version?: string; rows_total?: number; [k: string]: unknown };
  placement?: IJobPlacement;
  progress?: IJobProgress;
  failure?: IJobFailure | null;
  namespace?: string; // the owning team; absent from servers before namespaces
  /** "arrow": the result is an Arrow IPC file (GET /v1/jobs/result); `result_summary` describes it. */
  result_format?: string | null;
  result_summary?: IResultSummary | null;
}

/** A result's description (never its data): type, dtype, shape, bytes; `item` for a map's rows. */
export interface IResultSummary {
  type?: string;
  dtype?: string;
  shape?: number[];
  nbytes?: number;
  item?: IResultSummary;
  expired?: boolean;
  /** NaN / ±Inf counts of a float array result, present only when some value is not finite. */
  nonfinite?: { nan?: number; inf?: number; '-inf'?: number; floats?: number };
}

export interface IGpuClass {
  name: string;
  resource_name?: string;
  gpu_model?: string;
  gpu_memory_bytes?: number;
  max_gpu_count_per_worker?: number;
  simulated?: boolean;
}

export interface IGpuUsage {
  name: string;
  gpus_total?: number;
  gpus_busy?: number;
  jobs_running?: number;
  jobs_pending?: number;
}

export interface IFunctionEntry {
  name: string;
  version: string;
}

/** One version row of `functions/history` (newest first). */
export interface IVersionEntry {
  version: string;
  created_at?: string;
  change?: string;
}

export interface IFunctionHistory {
  name: string;
  versions: IVersionEntry[];
}

/** The reply of `functions/diff`. */
export interface IVersionDiff {
  name?: string;
  old?: string;
  new?: string;
  summary?: string;
  source_diff?: string[];
  runtime?: [string, string, string][];
}

export const TERMINAL_STATES: ReadonlySet<string> = new Set([
  'DONE',
  'FAILED',
  'CANCELLED',
  'TIMED_OUT'
]);

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

export function isTerminal(state: string): boolean {
  return TERMINAL_STATES.has(state);
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

/** "queue #2" for a pending job that has a queue position, else "". */
export function queueText(job: IJob): string {
  const pos = job.placement?.queue_position;
  if (job.job_state === 'PENDING' && pos !== null && pos !== undefined) {
    return `queue #${pos}`;
  }
  return '';
}

/**
 * "starts in about 40 s" for a queued GPU job with an estimate, "start time unknown" when the control
 * plane has no run history to estimate from (null), "" when it offers none (absent, CPU jobs, Ray).
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
  if (waitS < 1.5) {
    return 'starts any moment';
  }
  if (waitS < 90) {
    return `starts in about ${Math.round(waitS)} s`;
  }
  if (waitS < 90 * 60) {
    return `starts in about ${Math.round(waitS / 60)} min`;
  }
  return `starts in about ${(waitS / 3600).toFixed(1)} h`;
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
    return `list of ${s.shape?.[0] ?? '?'} × ${describeSummary(s.item)}`;
  }
  const parts = [s.type ?? '?'];
  if (s.dtype) {
    parts.push(s.dtype.length <= 40 ? s.dtype : `${s.dtype.slice(0, 39)}…`);
  }
  if (s.shape) {
    parts.push(`(${s.shape.join(', ')}${s.shape.length === 1 ? ',' : ''})`);
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

function sortJobs(jobs: IJob[]): IJob[] {
  // Newest first; the list the control plane returns is ordered the same way.
  return jobs.sort((a, b) => (b.creation_ms ?? 0) - (a.creation_ms ?? 0));
}

/**
 * Merge one job (from a `job` event or a describe) into the list: replace the row with the same
 * id or insert it, keep newest first, keep at most `limit` rows. A terminal row is never moved
 * back to a non-terminal state by a stale snapshot. Returns a new array.
 */
export function applyJobEvent(jobs: readonly IJob[], job: IJob, limit = 50): IJob[] {
  const next = jobs.slice();
  const index = next.findIndex(j => j.job_id === job.job_id);
  if (index >= 0) {
    const current = next[index];
    if (isTerminal(current.job_state) && !isTerminal(job.job_state)) {
      return next;
    }
    next[index] = job;
  } else {
    next.push(job);
  }
  return sortJobs(next).slice(0, Math.max(1, limit));
}

/**
 * Apply a `queue` event (`{"classes": {"<class>": [job_id, ...]}, "expected_start_ms": {job_id: ms}}`, the
 * first pending jobs of each class in start order): re-number the pending jobs it lists and take their
 * expected start. Jobs behind a started or cancelled job
 * move up without job events of their own, so this keeps the queue positions shown current.
 * Returns the same array when nothing changed.
 */
export function applyQueueEvent(jobs: readonly IJob[], payload: unknown): readonly IJob[] {
  const classes = (payload as { classes?: Record<string, unknown> } | null)?.classes;
  if (!classes || typeof classes !== 'object') {
    return jobs;
  }
  const positions = new Map<string, number>();
  for (const ids of Object.values(classes)) {
    if (Array.isArray(ids)) {
      ids.forEach((id, index) => positions.set(String(id), index + 1));
    }
  }
  const expected = (payload as { expected_start_ms?: Record<string, unknown> }).expected_start_ms;
  const startOf = (id: string): number | null | undefined => {
    const value = expected && typeof expected === 'object' ? expected[id] : undefined;
    return typeof value === 'number' || value === null ? value : undefined;
  };
  let changed = false;
  const next = jobs.map(job => {
    const position = positions.get(job.job_id);
    if (job.job_state !== 'PENDING' || position === undefined) {
      return job;
    }
    const start = startOf(job.job_id);
    const placement = job.placement ?? {};
    const startChanged = start !== undefined && placement.expected_start_ms !== start;
    if (placement.queue_position === position && !startChanged) {
      return job;
    }
    changed = true;
    const update: IJobPlacement = {
      ...placement,
      waiting_on_capacity: true,
      queue_position: position
    };
    if (start !== undefined) {
      update.expected_start_ms = start;
    }
    return { ...job, placement: update };
  });
  return changed ? next : jobs;
}

/**
 * Merge a freshly fetched job list into the rows known from events: the fetched list is the
 * truth except that a terminal state known from an event is not regressed.
 */
export function mergeJobLists(
  known: readonly IJob[],
  fetched: readonly IJob[],
  limit = 50
): IJob[] {
  const byId = new Map(known.map(j => [j.job_id, j] as const));
  const merged = fetched.map(j => {
    const k = byId.get(j.job_id);
    return k && isTerminal(k.job_state) && !isTerminal(j.job_state) ? k : j;
  });
  return sortJobs(merged).slice(0, Math.max(1, limit));
}

export interface IClassRow {
  name: string;
  model: string;
  /** "80 GiB", or "" when the class does not report GPU memory. */
  memory: string;
  maxPerWorker: string;
  simulated: boolean;
  /** "1 busy / 1 free of 2", or "" when usage is unknown. */
  usage: string;
  busy: number | null;
  total: number | null;
  pending: number;
}

/** Rows of the GPU classes section: hardware from `gpu/classes`, live numbers from usage. */
export function classRows(
  classes: readonly IGpuClass[],
  usage: ReadonlyMap<string, IGpuUsage>
): IClassRow[] {
  return classes.map(c => {
    const u = usage.get(c.name);
    const total = u?.gpus_total ?? null;
    const busy = u?.gpus_busy ?? null;
    let usageText = '';
    if (total !== null && busy !== null) {
      usageText = `${busy} busy / ${Math.max(0, total - busy)} free of ${total}`;
    }
    return {
      name: c.name,
      model: c.gpu_model ?? '',
      // 0 / missing means "not reported" (simulated classes), not a 0-byte GPU.
      memory: c.gpu_memory_bytes && c.gpu_memory_bytes > 0 ? formatBytes(c.gpu_memory_bytes) : '',
      maxPerWorker:
        c.max_gpu_count_per_worker !== undefined ? String(c.max_gpu_count_per_worker) : '—',
      simulated: Boolean(c.simulated),
      usage: usageText,
      busy,
      total,
      pending: u?.jobs_pending ?? 0
    };
  });
}

/** Index a `usage` event (`{"classes": [GpuUsage...]}`) or a `gpu/usage` reply by class name. */
export function usageMap(payload: unknown): Map<string, IGpuUsage> {
  const map = new Map<string, IGpuUsage>();
  const list = Array.isArray(payload)
    ? payload
    : payload && typeof payload === 'object'
      ? (payload as { classes?: unknown }).classes
      : undefined;
  if (Array.isArray(list)) {
    for (const item of list) {
      if (item && typeof item === 'object' && typeof (item as IGpuUsage).name === 'string') {
        map.set((item as IGpuUsage).name, item as IGpuUsage);
      }
    }
  }
  return map;
}

/** Group function versions by name, names sorted, versions in the order the server listed them. */
export function groupFunctions(
  entries: readonly IFunctionEntry[]
): { name: string; versions: string[] }[] {
  const groups = new Map<string, string[]>();
  for (const e of entries) {
    const list = groups.get(e.name) ?? [];
    if (!list.includes(e.version)) {
      list.push(e.version);
    }
    groups.set(e.name, list);
  }
  return [...groups.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, versions]) => ({ name, versions }));
}

/**
 * Reconnect delay after `attempt` consecutive failures (0-based): 1 s, 2 s, 4 s, ... capped at
 * 30 s. The panel never retries faster than this, so an unreachable control plane or a missing
 * server extension never turns into a stream of requests.
 */
export function backoffDelay(attempt: number, baseMs = 1000, maxMs = 30_000): number {
  const n = Math.max(0, Math.floor(attempt));
  return Math.min(maxMs, baseMs * Math.pow(2, Math.min(n, 30)));
}

/** Read the error envelope `{"error": {"code", "message"}}` the server extension and control plane use. */
export function errorMessage(body: unknown, fallback: string): string {
  if (body && typeof body === 'object') {
    const err = (body as { error?: unknown }).error;
    if (err && typeof err === 'object') {
      const msg = (err as { message?: unknown }).message;
      if (typeof msg === 'string' && msg) {
        return msg;
      }
    }
    const message = (body as { message?: unknown }).message;
    if (typeof message === 'string' && message) {
      return message;
    }
  }
  return fallback;
}
