/**
 * Wire shapes of the control plane's REST API and events (docs/ARCHITECTURE.md, "REST API (v1)"),
 * the job states' meaning, and the error envelope.
 *
 * Every field the panel reads is optional-tolerant because the server omits fields that are `None`
 * or equal to their default. Pure: no DOM, network or JupyterLab (tested in src/__tests__).
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
  /** The estimate rests on run times that say little (a version without history): "uncertain". */
  expected_start_uncertain?: boolean;
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
  /** Where the job's time went, once it ended on a worker (absent before that, and from older servers). */
  timings?: IJobTimings | null;
  /** What it held and cost, once a job that ran has ended (docs/ARCHITECTURE.md, "Cost"). */
  usage?: IJobUsage | null;
}

export interface IJobUsage {
  held_s?: number;
  gpu_seconds?: number;
  cpu_seconds?: number;
  cost?: number | null;
  currency?: string | null;
}

/**
 * `Job.timings` (docs/ARCHITECTURE.md, "Warm state"), in milliseconds; zeros and `cold: false` are
 * omitted on the wire. `cold`: the job paid a worker start or a setup.
 */
export interface IJobTimings {
  queued_ms?: number;
  start_ms?: number;
  environment_ms?: number;
  setup_ms?: number;
  run_ms?: number;
  cold?: boolean;
  /** The earlier version whose live worker ran it, with its model loaded ("Setup reuse"). */
  setup_reused_from?: string;
  rebind_ms?: number;
}

/** A result's description (never its data): type, dtype, shape, bytes; `item` for a map's rows. */
export interface IResultSummary {
  type?: string;
  dtype?: string;
  shape?: number[];
  nbytes?: number;
  /** A list's rows' bytes in all (its `nbytes` is the result file's). */
  items_nbytes?: number;
  /** A list's item: its rows' shapes differ (so it has no `shape`). */
  shape_varies?: boolean;
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
  /** Host CPU and memory ("Compute resources"): one GPU's share, the node's totals. */
  cpu_per_gpu?: number | null;
  memory_bytes_per_gpu?: number | null;
  node_cpu?: number | null;
  node_memory_bytes?: number | null;
}

export interface IGpuUsage {
  name: string;
  gpus_total?: number;
  gpus_busy?: number;
  jobs_running?: number;
  jobs_pending?: number;
  /** A class an autoscaler scales (Ray, `max_nodes`): nodes up, asked for and not up yet, its maximum. */
  nodes_up?: number;
  nodes_starting?: number;
  nodes_max?: number;
  /** When each idle warm worker of the class retires unused (epoch ms, soonest first); absent: none. */
  warm_retire_ms?: number[];
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

export function isTerminal(state: string): boolean {
  return TERMINAL_STATES.has(state);
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
