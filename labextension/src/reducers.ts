/**
 * The panel's state updates: job lists merged from events and REST reads (`applyJobEvent`,
 * `applyQueueEvent`, `mergeJobLists`), GPU class rows and function groups built from replies, and
 * the reconnect delay. Pure: each returns new data and never touches the DOM or the network.
 */

import { durationText, formatBytes } from './format';
import { IFunctionEntry, IGpuClass, IGpuUsage, IJob, IJobPlacement, isTerminal } from './wire';

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
  const uncertain = (payload as { expected_start_uncertain?: Record<string, unknown> })
    .expected_start_uncertain;
  const vagueOf = (id: string): boolean =>
    !!uncertain && typeof uncertain === 'object' && uncertain[id] === true;
  let changed = false;
  const next = jobs.map(job => {
    const position = positions.get(job.job_id);
    if (job.job_state !== 'PENDING' || position === undefined) {
      return job;
    }
    const start = startOf(job.job_id);
    const placement = job.placement ?? {};
    const vague = vagueOf(job.job_id);
    const startChanged =
      start !== undefined &&
      (placement.expected_start_ms !== start ||
        (placement.expected_start_uncertain ?? false) !== vague);
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
      update.expected_start_uncertain = vague;
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
  /** Host CPU and memory ("1 CPU + 2 GiB per GPU; node 32 CPUs, 240 GiB"), or "" when not configured. */
  host: string;
  simulated: boolean;
  /** "1 busy / 1 free of 2", or "" when usage is unknown. */
  usage: string;
  busy: number | null;
  total: number | null;
  pending: number;
  /** "0 of 4 nodes up · 2 starting" for a class an autoscaler scales, else "". */
  nodes: string;
  /** "warm: 2 workers, retire in 8 min" while idle workers hold loaded versions, else "". */
  warm: string;
}

/** A class's host CPU and memory, as the kernel's `%gpu_classes` says it (display/cards.py `host_resources`). */
export function hostText(c: IGpuClass): string {
  const join = (parts: string[], sep: string) => parts.filter(Boolean).join(sep);
  const parts: string[] = [];
  if (c.cpu_per_gpu != null || c.memory_bytes_per_gpu != null) {
    const cpu = c.cpu_per_gpu != null ? `${c.cpu_per_gpu} CPU` : '';
    const memory = c.memory_bytes_per_gpu != null ? formatBytes(c.memory_bytes_per_gpu) : '';
    parts.push(`${join([cpu, memory], ' + ')} per GPU`);
  }
  if (c.node_cpu != null || c.node_memory_bytes != null) {
    const cpu = c.node_cpu != null ? `${c.node_cpu} CPUs` : '';
    const memory = c.node_memory_bytes != null ? formatBytes(c.node_memory_bytes) : '';
    parts.push(`node ${join([cpu, memory], ', ')}`);
  }
  return parts.join('; ');
}

/** Rows of the GPU classes section: hardware from `gpu/classes`, live numbers from usage. */
export function classRows(
  classes: readonly IGpuClass[],
  usage: ReadonlyMap<string, IGpuUsage>,
  nowMs: number = Date.now()
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
      host: hostText(c),
      simulated: Boolean(c.simulated),
      usage: usageText,
      busy,
      total,
      pending: u?.jobs_pending ?? 0,
      nodes: nodesText(u),
      warm: warmText(u, nowMs)
    };
  });
}

/** As `GpuUsage.nodes_text()` in Python: "0 of 4 nodes up · 2 starting", or "" for a class that does not scale. */
export function nodesText(u: IGpuUsage | undefined): string {
  if (u?.nodes_max === undefined) {
    return '';
  }
  const starting = u.nodes_starting ? ` · ${u.nodes_starting} starting` : '';
  return `${u.nodes_up ?? 0} of ${u.nodes_max} nodes up${starting}`;
}

/**
 * The class's idle warm workers and when the last of them retires unused: "warm: 2 workers, retire in 8 min"
 * ("warm: 1 worker, retires in 40 s"); "" when none is idle. Counted down from `warm_retire_ms` between usage
 * events, so a retired worker leaves the count at its time without an event.
 */
export function warmText(u: IGpuUsage | undefined, nowMs: number): string {
  const left = (u?.warm_retire_ms ?? []).filter(at => at > nowMs);
  if (left.length === 0) {
    return '';
  }
  const after = durationText((Math.max(...left) - nowMs) / 1000);
  return left.length === 1
    ? `warm: 1 worker, retires in ${after}`
    : `warm: ${left.length} workers, retire in ${after}`;
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

/** Job types `jobs/list` lists that the panel shows elsewhere. */
const NOT_RUN_JOBS = new Set(['create_function', 'batch', 'backfill']);

/**
 * The jobs the panel lists: run jobs, not registrations (a registration is its function's new version, shown
 * under Functions) nor batches and backfills (`jobs/list` lists them too; they are under Batches), as `%gpu_jobs`
 * lists them.
 */
export function listedJobs(jobs: readonly IJob[]): IJob[] {
  return jobs.filter(j => !NOT_RUN_JOBS.has(j.job_type ?? ''));
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
