/**
 * The panel's live link to the control plane, through the lancefn server extension.
 *
 *   status check → open the event stream → on open (and on every reopen) refetch the lists
 *   → apply `job` / `usage` events as they come → on any failure close, back off (1 s doubling
 *   to 30 s) and start again from the status check.
 *
 * A missing server extension (404 on `<base>/lancefn/status`) stops the loop with a message that
 * says how to enable it: it cannot appear without a server restart, so retrying would only
 * produce a stream of 404s. The network and timers are injected (`ITransport`, `IClock`) so the
 * state machine is unit-tested without a browser (src/__tests__/connection.spec.ts).
 */

import { applyJobEvent, applyQueueEvent, backoffDelay, mergeJobLists, usageMap } from './reducers';
import {
  errorMessage,
  IFunctionEntry,
  IFunctionHistory,
  IGpuClass,
  IGpuUsage,
  IJob,
  IVersionDiff,
  IVersionEntry
} from './wire';
import { applyBatchEvent, IBatch } from './batches';
import { apiUrl, eventsUrl, statusUrl } from './urls';

export const NO_EXTENSION_MESSAGE =
  'lancefn server extension is not enabled: run `jupyter server extension enable lancefn_jupyter` and restart Jupyter';

export type ConnectionStatus =
  | { kind: 'connecting'; message: string }
  | { kind: 'connected'; url: string; embedded: boolean }
  | { kind: 'unreachable'; message: string; retryAt: number; url?: string }
  | { kind: 'no-extension'; message: string }
  | { kind: 'error'; message: string; retryAt: number };

export interface IPanelState {
  status: ConnectionStatus;
  classes: IGpuClass[];
  classesError: string | null;
  usage: Map<string, IGpuUsage>;
  jobs: IJob[];
  jobsError: string | null;
  functions: IFunctionEntry[];
  functionsError: string | null;
  /** Each function's newest versions with their one-line change (`functions/history`); empty if unavailable. */
  history: Map<string, IVersionEntry[]>;
  lastEventId: string | null;
  /** Recent batches (newest first); empty with a server that has none. */
  batches: IBatch[];
}

/** The subset of `EventSource` the connection uses. */
export interface IEventSourceLike {
  onopen: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  addEventListener(
    type: string,
    listener: (ev: { data: string; lastEventId?: string }) => void
  ): void;
  close(): void;
}

/** Minimal response shape (what `fetch` / `ServerConnection.makeRequest` resolve to). */
export interface IResponseLike {
  status: number;
  ok: boolean;
  json(): Promise<unknown>;
}

export interface ITransport {
  /** `ServerConnection.makeSettings().baseUrl`. */
  baseUrl: string;
  /** JupyterLab's token ('' when the server runs without one). */
  token: string;
  /** Performs an authenticated request (`ServerConnection.makeRequest`); rejects on network failure. */
  request(url: string, init: { method: 'GET' | 'POST'; body?: string }): Promise<IResponseLike>;
  /** Opens an `EventSource` (with cookies). */
  eventSource(url: string): IEventSourceLike;
}

export interface IClock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realClock: IClock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: handle => clearTimeout(handle as ReturnType<typeof setTimeout>)
};

class UnreachableError extends Error {}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

export class LiveConnection {
  constructor(
    private readonly transport: ITransport,
    options: { jobsLimit?: number; clock?: IClock } = {}
  ) {
    this._jobsLimit = options.jobsLimit ?? 50;
    this._clock = options.clock ?? realClock;
  }

  get state(): Readonly<IPanelState> {
    return this._state;
  }

  /** Number of consecutive failures (drives the backoff). */
  get attempt(): number {
    return this._attempt;
  }

  get jobsLimit(): number {
    return this._jobsLimit;
  }

  set jobsLimit(value: number) {
    this._jobsLimit = Math.max(1, Math.floor(value));
    this._update({ jobs: this._state.jobs.slice(0, this._jobsLimit) });
  }

  /** Registers a listener called after every state change; returns an unsubscribe function. */
  subscribe(listener: (state: Readonly<IPanelState>) => void): () => void {
    this._listeners.add(listener);
    return () => this._listeners.delete(listener);
  }

  /** Starts the loop (idempotent). */
  start(): void {
    if (this._started) {
      return;
    }
    this._started = true;
    void this._connect();
  }

  /** Stops everything: no timers, no stream. */
  stop(): void {
    this._started = false;
    this._generation += 1;
    this._clearTimer();
    this._closeStream();
  }

  /** "Retry now": skips the remaining backoff wait (also after a missing extension). */
  retryNow(): void {
    this._started = true;
    this._attempt = 0;
    this._clearTimer();
    this._closeStream();
    void this._connect();
  }

  /** Cancels a job through the proxy and applies its new state without waiting for the event. */
  async cancelJob(jobId: string): Promise<void> {
    const body = JSON.stringify({ job_id: jobId });
    await this._call('POST', 'jobs/cancel', body);
    try {
      const job = (await this._call('POST', 'jobs/describe', body)) as IJob;
      if (job && job.job_id) {
        this._applyJob(job);
      }
    } catch {
      // The event stream brings the new state anyway.
    }
  }

  /** What changed between a version and the one registered before it (`functions/diff`). */
  async fetchDiff(name: string, version: string): Promise<IVersionDiff> {
    return (await this._call(
      'POST',
      'functions/diff',
      JSON.stringify({ name, new: version })
    )) as IVersionDiff;
  }

  /** Cancels every pending or running chunk of a batch and applies its new state. */
  async cancelBatch(batchId: string): Promise<void> {
    await this._batchAction(batchId, 'batches/cancel');
  }

  /** Pauses a batch (no new chunk starts) or resumes a paused one, and applies its new state. */
  async toggleBatch(batchId: string, action: 'pause' | 'resume'): Promise<void> {
    await this._batchAction(batchId, `batches/${action}`);
  }

  private async _batchAction(batchId: string, route: string): Promise<void> {
    const body = JSON.stringify({ batch_id: batchId });
    await this._call('POST', route, body);
    try {
      const batch = (await this._call(
        'POST',
        'batches/describe',
        JSON.stringify({ batch_id: batchId, include_chunks: false })
      )) as IBatch;
      if (batch && batch.batch_id) {
        this._update({ batches: applyBatchEvent(this._state.batches, batch) });
      }
    } catch {
      // The event stream brings the new state anyway.
    }
  }

  private async _connect(): Promise<void> {
    const generation = ++this._generation;
    this._clearTimer();
    this._closeStream();
    if (this._state.status.kind !== 'unreachable') {
      this._update({ status: { kind: 'connecting', message: 'connecting to the control plane…' } });
    }
    let reply: IResponseLike;
    try {
      reply = await this.transport.request(statusUrl(this.transport.baseUrl), { method: 'GET' });
    } catch (err) {
      if (generation === this._generation) {
        this._fail('error', `Jupyter server unreachable (${String(err)})`);
      }
      return;
    }
    if (generation !== this._generation) {
      return;
    }
    if (reply.status === 404) {
      this._started = false;
      this._update({ status: { kind: 'no-extension', message: NO_EXTENSION_MESSAGE } });
      return;
    }
    const body = await reply.json().catch(() => null);
    if (generation !== this._generation) {
      return;
    }
    if (!reply.ok) {
      this._fail('error', errorMessage(body, `lancefn status failed (HTTP ${reply.status})`));
      return;
    }
    const status = (body ?? {}) as {
      connected?: boolean;
      url?: string;
      embedded?: boolean;
      error?: string;
    };
    if (!status.connected) {
      this._fail(
        'unreachable',
        `control plane unreachable${status.error ? `: ${status.error}` : ''}`,
        status.url
      );
      return;
    }
    this._connectedInfo = { url: status.url ?? '', embedded: Boolean(status.embedded) };
    this._openStream(generation);
  }

  private _openStream(generation: number): void {
    const url = eventsUrl(this.transport.baseUrl, {
      token: this.transport.token,
      lastEventId: this._state.lastEventId
    });
    const es = this.transport.eventSource(url);
    this._stream = es;
    es.onopen = () => {
      if (generation !== this._generation) {
        return;
      }
      void this._loadAll(generation);
    };
    es.onerror = () => {
      if (generation !== this._generation) {
        return;
      }
      // Our own reconnect (not the browser's): the status check tells unreachable apart.
      this._fail(
        'unreachable',
        'control plane unreachable: event stream closed',
        this._connectedInfo?.url
      );
    };
    es.addEventListener('job', ev => {
      if (generation !== this._generation) {
        return;
      }
      let job: IJob;
      try {
        job = JSON.parse(ev.data) as IJob;
      } catch {
        return;
      }
      if (ev.lastEventId) {
        this._state.lastEventId = ev.lastEventId;
      }
      if (this._loading) {
        this._eventsDuringLoad.push(job);
      }
      this._applyJob(job);
      if (job.job_type === 'create_function' && job.job_state === 'DONE') {
        void this._refreshFunctions(generation);
      }
    });
    es.addEventListener('queue', ev => {
      if (generation !== this._generation) {
        return;
      }
      try {
        const jobs = applyQueueEvent(this._state.jobs, JSON.parse(ev.data));
        if (jobs !== this._state.jobs) {
          this._update({ jobs: jobs as IJob[] });
        }
      } catch {
        // ignore a malformed queue event
      }
    });
    es.addEventListener('batch', ev => {
      if (generation !== this._generation) {
        return;
      }
      try {
        this._update({
          batches: applyBatchEvent(this._state.batches, JSON.parse(ev.data) as IBatch)
        });
      } catch {
        // ignore a malformed batch event
      }
    });
    es.addEventListener('usage', ev => {
      if (generation !== this._generation) {
        return;
      }
      try {
        this._update({ usage: usageMap(JSON.parse(ev.data)) });
      } catch {
        // ignore a malformed usage event
      }
    });
  }

  /** Refetches classes, usage, jobs and functions (on every (re)open of the stream). */
  private async _loadAll(generation: number): Promise<void> {
    this._loading = true;
    this._eventsDuringLoad = [];
    try {
      const [classes, usage, jobs, functions, batches] = await Promise.allSettled([
        this._call('GET', 'gpu/classes'),
        this._call('GET', 'gpu/usage'),
        this._call('POST', 'jobs/list', JSON.stringify({ limit: this._jobsLimit })),
        this._listFunctions(),
        this._call('POST', 'batches/list', JSON.stringify({ limit: 10 }))
      ]);
      if (generation !== this._generation) {
        return;
      }
      const results = [classes, usage, jobs, functions];
      const unreachable = results.find(
        r => r.status === 'rejected' && r.reason instanceof UnreachableError
      ) as PromiseRejectedResult | undefined;
      if (unreachable) {
        this._fail('unreachable', (unreachable.reason as Error).message, this._connectedInfo?.url);
        return;
      }
      const patch: Partial<IPanelState> = {};
      if (classes.status === 'fulfilled') {
        const list = (classes.value as { classes?: IGpuClass[] })?.classes;
        patch.classes = Array.isArray(list) ? list : [];
        patch.classesError = null;
      } else {
        patch.classesError = String((classes.reason as Error).message ?? classes.reason);
      }
      if (usage.status === 'fulfilled') {
        patch.usage = usageMap(usage.value);
      }
      if (jobs.status === 'fulfilled') {
        const list = (jobs.value as { jobs?: IJob[] })?.jobs;
        let merged = mergeJobLists(
          this._state.jobs,
          Array.isArray(list) ? list : [],
          this._jobsLimit
        );
        for (const job of this._eventsDuringLoad) {
          merged = applyJobEvent(merged, job, this._jobsLimit);
        }
        patch.jobs = merged;
        patch.jobsError = null;
      } else {
        patch.jobsError = String((jobs.reason as Error).message ?? jobs.reason);
      }
      if (batches.status === 'fulfilled') {
        // Batch events carry no id, so the list fetched on (re)open is the truth.
        const list = (batches.value as { batches?: IBatch[] })?.batches;
        patch.batches = (Array.isArray(list) ? list : []).reduce<IBatch[]>(
          (all, b) => applyBatchEvent(all, b),
          []
        );
      }
      if (functions.status === 'fulfilled') {
        patch.functions = functions.value;
        patch.functionsError = null;
      } else {
        patch.functionsError = String((functions.reason as Error).message ?? functions.reason);
      }
      this._attempt = 0;
      patch.status = {
        kind: 'connected',
        url: this._connectedInfo?.url ?? '',
        embedded: this._connectedInfo?.embedded ?? false
      };
      this._update(patch);
      if (functions.status === 'fulfilled') {
        void this._refreshHistory(generation);
      }
    } finally {
      this._loading = false;
      this._eventsDuringLoad = [];
    }
  }

  private async _refreshHistory(generation: number): Promise<void> {
    try {
      const reply = (await this._call('POST', 'functions/history', JSON.stringify({}))) as {
        functions?: IFunctionHistory[];
      };
      const history = new Map<string, IVersionEntry[]>();
      for (const f of reply?.functions ?? []) {
        if (f && typeof f.name === 'string' && Array.isArray(f.versions)) {
          history.set(f.name, f.versions);
        }
      }
      if (generation === this._generation) {
        this._update({ history });
      }
    } catch {
      // an older control plane without history: the panel lists bare versions
    }
  }

  private async _refreshFunctions(generation: number): Promise<void> {
    try {
      const functions = await this._listFunctions();
      if (generation === this._generation) {
        this._update({ functions, functionsError: null });
        void this._refreshHistory(generation);
      }
    } catch {
      // shown on the next full refresh
    }
  }

  private async _listFunctions(): Promise<IFunctionEntry[]> {
    const out: IFunctionEntry[] = [];
    let pageToken: string | undefined;
    for (let page = 0; page < 20; page++) {
      const body: Record<string, unknown> = { include_definition: false };
      if (pageToken) {
        body.page_token = pageToken;
      }
      const reply = (await this._call('POST', 'functions/list', JSON.stringify(body))) as {
        functions?: IFunctionEntry[];
        page_token?: string;
      };
      for (const f of reply?.functions ?? []) {
        out.push({ name: f.name, version: f.version });
      }
      pageToken = reply?.page_token;
      if (!pageToken) {
        break;
      }
    }
    return out;
  }

  /** One proxied REST call; 502 (unreachable) and network failures raise `UnreachableError`. */
  private async _call(method: 'GET' | 'POST', path: string, body?: string): Promise<unknown> {
    let reply: IResponseLike;
    try {
      reply = await this.transport.request(apiUrl(this.transport.baseUrl, path), { method, body });
    } catch (err) {
      throw new UnreachableError(`Jupyter server unreachable (${String(err)})`);
    }
    const data = await reply.json().catch(() => null);
    if (reply.status === 502 || reply.status === 504) {
      throw new UnreachableError(
        `control plane unreachable: ${errorMessage(data, `HTTP ${reply.status}`)}`
      );
    }
    if (!reply.ok) {
      throw new HttpError(
        reply.status,
        errorMessage(data, `${path} failed (HTTP ${reply.status})`)
      );
    }
    return data;
  }

  private _applyJob(job: IJob): void {
    this._update({ jobs: applyJobEvent(this._state.jobs, job, this._jobsLimit) });
  }

  private _fail(kind: 'unreachable' | 'error', message: string, url?: string): void {
    this._closeStream();
    this._generation += 1;
    if (!this._started) {
      return;
    }
    const delay = backoffDelay(this._attempt);
    this._attempt += 1;
    const retryAt = this._clock.now() + delay;
    this._update({
      status: kind === 'unreachable' ? { kind, message, retryAt, url } : { kind, message, retryAt }
    });
    this._clearTimer();
    this._timer = this._clock.setTimeout(() => {
      this._timer = null;
      if (this._started) {
        void this._connect();
      }
    }, delay);
  }

  private _closeStream(): void {
    if (this._stream) {
      this._stream.onopen = null;
      this._stream.onerror = null;
      this._stream.close();
      this._stream = null;
    }
  }

  private _clearTimer(): void {
    if (this._timer !== null) {
      this._clock.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  private _update(patch: Partial<IPanelState>): void {
    this._state = { ...this._state, ...patch };
    for (const listener of [...this._listeners]) {
      try {
        listener(this._state);
      } catch (err) {
        console.error('lancefn-jupyter: panel listener failed', err);
      }
    }
  }

  private _state: IPanelState = {
    status: { kind: 'connecting', message: 'connecting to the control plane…' },
    classes: [],
    classesError: null,
    usage: new Map(),
    jobs: [],
    jobsError: null,
    functions: [],
    functionsError: null,
    history: new Map(),
    lastEventId: null,
    batches: []
  };
  private _listeners = new Set<(state: Readonly<IPanelState>) => void>();
  private _started = false;
  private _generation = 0;
  private _attempt = 0;
  private _timer: unknown = null;
  private _stream: IEventSourceLike | null = null;
  private _jobsLimit: number;
  private _clock: IClock;
  private _loading = false;
  private _eventsDuringLoad: IJob[] = [];
  private _connectedInfo: { url: string; embedded: boolean } | null = null;
}
