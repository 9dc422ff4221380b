import { describe, expect, it } from 'vitest';

import {
  IClock,
  IEventSourceLike,
  IResponseLike,
  ITransport,
  LiveConnection,
  NO_EXTENSION_MESSAGE
} from '../connection';

type Handler = (
  method: string,
  url: string,
  body?: string
) => { status: number; body: unknown } | Error;

class FakeEventSource implements IEventSourceLike {
  onopen: ((ev: unknown) => void) | null = null;
  onerror: ((ev: unknown) => void) | null = null;
  closed = false;
  listeners = new Map<string, ((ev: { data: string; lastEventId?: string }) => void)[]>();
  constructor(readonly url: string) {}
  addEventListener(
    type: string,
    listener: (ev: { data: string; lastEventId?: string }) => void
  ): void {
    this.listeners.set(type, [...(this.listeners.get(type) ?? []), listener]);
  }
  close(): void {
    this.closed = true;
  }
  emit(type: string, data: unknown, lastEventId?: string): void {
    for (const l of this.listeners.get(type) ?? []) {
      l({ data: JSON.stringify(data), lastEventId });
    }
  }
}

class FakeClock implements IClock {
  t = 0;
  timers: { at: number; fn: () => void; id: number }[] = [];
  private nextId = 1;
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = this.nextId++;
    this.timers.push({ at: this.t + ms, fn, id });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.timers = this.timers.filter(t => t.id !== handle);
  }
  /** Delays of the pending timers, relative to now. */
  pending(): number[] {
    return this.timers.map(t => t.at - this.t);
  }
  fireNext(): void {
    this.timers.sort((a, b) => a.at - b.at);
    const next = this.timers.shift();
    if (next) {
      this.t = next.at;
      next.fn();
    }
  }
}

function setup(handler: Handler, token = '') {
  const calls: string[] = [];
  const streams: FakeEventSource[] = [];
  const transport: ITransport = {
    baseUrl: 'http://h/jl/',
    token,
    request: async (url, init): Promise<IResponseLike> => {
      calls.push(`${init.method} ${url.replace('http://h/jl/', '')}`);
      const r = handler(init.method, url.replace('http://h/jl/', ''), init.body);
      if (r instanceof Error) {
        throw r;
      }
      return { status: r.status, ok: r.status >= 200 && r.status < 300, json: async () => r.body };
    },
    eventSource: url => {
      const es = new FakeEventSource(url);
      streams.push(es);
      return es;
    }
  };
  const clock = new FakeClock();
  const conn = new LiveConnection(transport, { clock, jobsLimit: 10 });
  return { conn, calls, streams, clock };
}

const flush = () => new Promise(resolve => setTimeout(resolve, 0));

const healthy: Handler = (method, url) => {
  switch (url) {
    case 'lancefn/status':
      return {
        status: 200,
        body: { connected: true, url: 'http://127.0.0.1:9/', embedded: false }
      };
    case 'lancefn/api/v1/gpu/classes':
      return {
        status: 200,
        body: { classes: [{ name: 'default', gpu_memory_bytes: 1024, simulated: true }] }
      };
    case 'lancefn/api/v1/gpu/usage':
      return { status: 200, body: { classes: [{ name: 'default', gpus_total: 2, gpus_busy: 0 }] } };
    case 'lancefn/api/v1/jobs/list':
      return {
        status: 200,
        body: { jobs: [{ job_id: 'j1', job_state: 'PENDING', creation_ms: 1 }] }
      };
    case 'lancefn/api/v1/functions/list':
      return { status: 200, body: { functions: [{ name: 'f', version: 'v1', definition: {} }] } };
    default:
      return { status: 404, body: { error: { message: `no route ${method} ${url}` } } };
  }
};

describe('LiveConnection', () => {
  it('stops with a clear message when the server extension is missing (no stream of 404s)', async () => {
    const { conn, calls, clock, streams } = setup(() => ({ status: 404, body: 'Not Found' }));
    conn.start();
    await flush();
    expect(conn.state.status).toEqual({ kind: 'no-extension', message: NO_EXTENSION_MESSAGE });
    expect(conn.state.status.kind === 'no-extension' && conn.state.status.message).toContain(
      'jupyter server extension enable lancefn_jupyter'
    );
    expect(clock.timers).toHaveLength(0);
    expect(streams).toHaveLength(0);
    expect(calls).toEqual(['GET lancefn/status']);
  });

  it('backs off 1 s doubling to 30 s while the control plane is unreachable', async () => {
    const { conn, calls, clock } = setup(() => ({
      status: 200,
      body: { connected: false, url: 'http://127.0.0.1:1/', error: 'connection refused' }
    }));
    conn.start();
    await flush();
    const delays: number[] = [];
    for (let i = 0; i < 7; i++) {
      expect(conn.state.status.kind).toBe('unreachable');
      delays.push(...clock.pending());
      clock.fireNext();
      await flush();
    }
    expect(delays).toEqual([1000, 2000, 4000, 8000, 16000, 30000, 30000]);
    expect(calls.every(c => c === 'GET lancefn/status')).toBe(true);
    expect(conn.state.status.kind === 'unreachable' && conn.state.status.message).toBe(
      'control plane unreachable: connection refused'
    );
  });

  it('loads the lists when the stream opens and applies job and usage events', async () => {
    const { conn, calls, streams } = setup(healthy, 'tok');
    conn.start();
    await flush();
    expect(streams).toHaveLength(1);
    expect(streams[0].url).toBe('http://h/jl/lancefn/api/v1/jobs/events?token=tok');
    streams[0].onopen?.({});
    await flush();
    expect(conn.state.status).toEqual({
      kind: 'connected',
      url: 'http://127.0.0.1:9/',
      embedded: false
    });
    expect(conn.state.classes.map(c => c.name)).toEqual(['default']);
    expect(conn.state.jobs.map(j => j.job_state)).toEqual(['PENDING']);
    expect(conn.state.functions).toEqual([{ name: 'f', version: 'v1' }]);
    expect(calls).toContain('POST lancefn/api/v1/jobs/list');

    streams[0].emit('job', { job_id: 'j1', job_state: 'IN_PROGRESS', creation_ms: 1 }, '7');
    streams[0].emit('usage', { classes: [{ name: 'default', gpus_total: 2, gpus_busy: 1 }] });
    expect(conn.state.jobs[0].job_state).toBe('IN_PROGRESS');
    expect(conn.state.usage.get('default')?.gpus_busy).toBe(1);
    expect(conn.state.lastEventId).toBe('7');
  });

  it('reconnects after the stream drops, resuming from the last event id and refetching lists', async () => {
    const { conn, calls, streams, clock } = setup(healthy);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    streams[0].emit('job', { job_id: 'j1', job_state: 'DONE', creation_ms: 1 }, '12');
    streams[0].onerror?.({});
    expect(streams[0].closed).toBe(true);
    expect(conn.state.status.kind).toBe('unreachable');
    expect(clock.pending()).toEqual([1000]);
    clock.fireNext();
    await flush();
    expect(streams).toHaveLength(2);
    expect(streams[1].url).toBe('http://h/jl/lancefn/api/v1/jobs/events?last_event_id=12');
    const before = calls.filter(c => c.endsWith('jobs/list')).length;
    streams[1].onopen?.({});
    await flush();
    expect(calls.filter(c => c.endsWith('jobs/list')).length).toBe(before + 1);
    expect(conn.state.status.kind).toBe('connected');
    // the refetched list still says PENDING, the event said DONE: the terminal state wins
    expect(conn.state.jobs[0].job_state).toBe('DONE');
    expect(conn.attempt).toBe(0);
  });

  it('treats a 502 from the proxy as unreachable and shows its message', async () => {
    const handler: Handler = (method, url) =>
      url === 'lancefn/status'
        ? healthy(method, url)
        : {
            status: 502,
            body: { error: { code: 'control_plane_unreachable', message: 'connect failed' } }
          };
    const { conn, streams, clock } = setup(handler);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    expect(conn.state.status.kind).toBe('unreachable');
    expect(conn.state.status.kind === 'unreachable' && conn.state.status.message).toBe(
      'control plane unreachable: connect failed'
    );
    expect(streams[0].closed).toBe(true);
    expect(clock.pending()).toEqual([1000]);
  });

  it('keeps going when only one list is forbidden', async () => {
    const handler: Handler = (method, url) =>
      url === 'lancefn/api/v1/gpu/classes'
        ? {
            status: 403,
            body: { error: { code: 'forbidden', message: 'key lacks the system_usage privilege' } }
          }
        : healthy(method, url);
    const { conn, streams } = setup(handler);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    expect(conn.state.status.kind).toBe('connected');
    expect(conn.state.classesError).toBe('key lacks the system_usage privilege');
    expect(conn.state.jobs).toHaveLength(1);
  });

  it('cancels through the proxy and applies the described state', async () => {
    const seen: string[] = [];
    const handler: Handler = (method, url, body) => {
      if (url === 'lancefn/api/v1/jobs/cancel') {
        seen.push(body ?? '');
        return { status: 200, body: { job_id: 'j1', cancelled: true } };
      }
      if (url === 'lancefn/api/v1/jobs/describe') {
        return { status: 200, body: { job_id: 'j1', job_state: 'CANCELLED', creation_ms: 1 } };
      }
      return healthy(method, url);
    };
    const { conn, streams } = setup(handler);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    await conn.cancelJob('j1');
    expect(seen).toEqual(['{"job_id":"j1"}']);
    expect(conn.state.jobs[0].job_state).toBe('CANCELLED');
  });

  it('stop() leaves no timer and no stream behind', async () => {
    const { conn, streams, clock } = setup(healthy);
    conn.start();
    await flush();
    conn.stop();
    expect(streams[0].closed).toBe(true);
    expect(clock.timers).toHaveLength(0);
  });
});

describe('LiveConnection version history', () => {
  const withHistory: Handler = (method, url, body) => {
    if (url === 'lancefn/api/v1/functions/history') {
      return {
        status: 200,
        body: {
          functions: [
            {
              name: 'f',
              versions: [
                { version: 'v2', change: 'pip: +torch' },
                { version: 'v1', change: 'first version' }
              ]
            }
          ]
        }
      };
    }
    if (url === 'lancefn/api/v1/functions/diff') {
      return {
        status: 200,
        body: {
          old: 'v1',
          new: JSON.parse(body ?? '{}').new,
          summary: 'pip: +torch',
          runtime: [],
          source_diff: []
        }
      };
    }
    return healthy(method, url, body);
  };

  it("loads each function's history after the lists and fetches a diff on demand", async () => {
    const { conn, streams } = setup(withHistory);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    await flush();
    expect(conn.state.history.get('f')?.map(v => [v.version, v.change])).toEqual([
      ['v2', 'pip: +torch'],
      ['v1', 'first version']
    ]);
    expect((await conn.fetchDiff('f', 'v2')).new).toBe('v2');
  });

  it('keeps an empty history when the control plane has no history route', async () => {
    const { conn, streams } = setup(healthy);
    conn.start();
    await flush();
    streams[0].onopen?.({});
    await flush();
    await flush();
    expect(conn.state.functions).toEqual([{ name: 'f', version: 'v1' }]);
    expect(conn.state.history.size).toBe(0);
  });
});
