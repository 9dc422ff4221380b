import { describe, expect, it } from 'vitest';

import {
  attachSnippet,
  canCancel,
  displayState,
  failureText,
  formatBytes,
  formatElapsed,
  jobElapsedMs,
  jobPlacementText,
  jobTitle,
  progressOf,
  queueText,
  resultText,
  showNamespaces,
  stateBadge
} from '../format';
import {
  applyJobEvent,
  applyQueueEvent,
  backoffDelay,
  classRows,
  groupFunctions,
  listedJobs,
  mergeJobLists,
  nodesText,
  warmText,
  usageMap
} from '../reducers';
import { errorMessage, IJob, IResultSummary } from '../wire';

function job(id: string, state: string, extra: Partial<IJob> = {}): IJob {
  return {
    job_id: id,
    job_type: 'run_function',
    job_state: state,
    creation_ms: 1000,
    spec: { name: 'double_all', version: 'abc123', rows_total: 4 },
    placement: { gpu_class: 'default', num_gpus: 1, devices: [] },
    progress: { rows_done: 0, rows_total: 4 },
    ...extra
  };
}

describe('formatBytes', () => {
  it.each([
    [85899345920, '80 GiB'],
    [17179869184, '16 GiB'],
    [1536, '1.5 KiB'],
    [1024, '1 KiB'],
    [512, '512 B'],
    [0, '0 B'],
    [12.5 * 1024 ** 3, '13 GiB'],
    [1.25 * 1024 ** 4, '1.3 TiB']
  ])('%d → %s', (bytes, text) => {
    expect(formatBytes(bytes)).toBe(text);
  });

  it('shows a dash for missing or invalid sizes', () => {
    expect(formatBytes(undefined)).toBe('—');
    expect(formatBytes(null)).toBe('—');
    expect(formatBytes(-1)).toBe('—');
    expect(formatBytes(Number.NaN)).toBe('—');
  });
});

describe('formatElapsed', () => {
  it.each([
    [0, '0.0 s'],
    [400, '0.4 s'],
    [9_999, '9.9 s'],
    [12_000, '12 s'],
    [59_999, '59 s'],
    [65_000, '1 m 05 s'],
    [3_599_000, '59 m 59 s'],
    [3_720_000, '1 h 02 m'],
    [-50, '0.0 s']
  ])('%d ms → %s', (ms, text) => {
    expect(formatElapsed(ms)).toBe(text);
  });

  it('shows a dash when unknown', () => {
    expect(formatElapsed(null)).toBe('—');
    expect(formatElapsed(undefined)).toBe('—');
  });
});

describe('state labels', () => {
  it.each([
    ['PENDING', 'pending', 'lf-badge lf-state-pending'],
    ['IN_PROGRESS', 'running', 'lf-badge lf-state-running'],
    ['DONE', 'finished', 'lf-badge lf-state-finished'],
    ['FAILED', 'failed', 'lf-badge lf-state-failed'],
    ['CANCELLED', 'cancelled', 'lf-badge lf-state-cancelled'],
    ['TIMED_OUT', 'timed out', 'lf-badge lf-state-timed-out']
  ])('%s → %s', (wire, label, className) => {
    expect(displayState(wire)).toBe(label);
    expect(stateBadge(wire)).toEqual({ label, className });
  });

  it('lowercases an unknown future state instead of hiding it', () => {
    expect(displayState('SUSPENDED_BY_ADMIN')).toBe('suspended by admin');
  });

  it('offers Cancel only for pending and running jobs', () => {
    expect(canCancel(job('a', 'PENDING'))).toBe(true);
    expect(canCancel(job('a', 'IN_PROGRESS'))).toBe(true);
    for (const s of ['DONE', 'FAILED', 'CANCELLED', 'TIMED_OUT']) {
      expect(canCancel(job('a', s))).toBe(false);
    }
  });
});

describe('job row texts', () => {
  it('titles run jobs function@version and registrations by name', () => {
    expect(jobTitle(job('a', 'PENDING'))).toBe('double_all@abc123');
    expect(
      jobTitle({ job_id: 'b', job_type: 'create_function', job_state: 'DONE', spec: { name: 'f' } })
    ).toBe('register f');
    expect(jobTitle({ job_id: 'c', job_type: 'something_else', job_state: 'DONE' })).toBe(
      'something_else'
    );
  });

  it('shows class and devices', () => {
    expect(
      jobPlacementText(
        job('a', 'IN_PROGRESS', {
          placement: { gpu_class: 'default', num_gpus: 2, devices: ['sim0', 'sim1'] }
        })
      )
    ).toBe('default · 2 GPUs (sim0, sim1)');
    expect(
      jobPlacementText(job('a', 'PENDING', { placement: { gpu_class: 'a100', num_gpus: 1 } }))
    ).toBe('a100 · 1 GPU');
  });

  it('shows the queue position only while pending', () => {
    expect(queueText(job('a', 'PENDING', { placement: { queue_position: 2 } }))).toBe('position 2');
    expect(queueText(job('a', 'PENDING', { placement: { queue_position: 0 } }))).toBe('position 0');
    expect(queueText(job('a', 'IN_PROGRESS', { placement: { queue_position: 2 } }))).toBe('');
    expect(queueText(job('a', 'PENDING', { placement: {} }))).toBe('');
  });

  it('computes progress from rows_done/rows_total', () => {
    expect(
      progressOf(job('a', 'IN_PROGRESS', { progress: { rows_done: 1, rows_total: 4 } }))
    ).toEqual({
      text: '1/4 rows',
      fraction: 0.25
    });
    expect(progressOf({ job_id: 'x', job_state: 'PENDING' })).toEqual({ text: '', fraction: null });
    expect(progressOf(job('a', 'DONE', { progress: { rows_done: 1, rows_total: 1 } })).text).toBe(
      '1/1 row'
    );
  });

  it('summarises an Arrow result without its data', () => {
    const summary = { type: 'ndarray', dtype: 'float32', shape: [1000, 768], nbytes: 3072000 };
    expect(resultText(job('a', 'DONE', { result_format: 'arrow', result_summary: summary }))).toBe(
      'ndarray float32 (1000, 768), 2.9 MiB'
    );
    const list = (extra: IResultSummary) =>
      resultText(
        job('a', 'DONE', {
          result_format: 'arrow',
          result_summary: { type: 'list', shape: [2], ...extra }
        })
      );
    expect(list({ item: { type: 'ndarray', dtype: 'int8', shape: [3] } })).toBe(
      'list of 2 × ndarray int8 (3,)'
    );
    // Rows shaped (1,) and (2,): not the first row's shape and bytes, but theirs.
    expect(
      list({
        nbytes: 500,
        items_nbytes: 12,
        item: { type: 'ndarray', dtype: 'float32', shape_varies: true }
      })
    ).toBe('list of 2 × ndarray float32 of varying shapes, 12 B in all');
    expect(
      resultText(
        job('a', 'DONE', { result_format: 'arrow', result_summary: { ...summary, expired: true } })
      )
    ).toContain('(removed by retention)');
    expect(resultText(job('a', 'IN_PROGRESS', { result_summary: summary }))).toBe('');
    const nan = { ...summary, nonfinite: { nan: 2, inf: 0, '-inf': 1, floats: 768000 } };
    expect(resultText(job('a', 'DONE', { result_format: 'arrow', result_summary: nan }))).toBe(
      'ndarray float32 (1000, 768), 2.9 MiB; holds 2 NaN, 1 -Inf of 768000 floats'
    );
  });

  it('shows the failure phase and message', () => {
    expect(
      failureText(
        job('a', 'FAILED', { failure: { phase: 'environment', message: 'no module named foo' } })
      )
    ).toBe('environment: no module named foo');
    expect(failureText(job('a', 'DONE'))).toBe('');
  });

  it('measures elapsed per phase', () => {
    expect(jobElapsedMs(job('a', 'PENDING', { creation_ms: 1000 }), 4000)).toBe(3000);
    expect(
      jobElapsedMs(job('a', 'IN_PROGRESS', { creation_ms: 1000, started_ms: 2000 }), 4500)
    ).toBe(2500);
    expect(
      jobElapsedMs(
        job('a', 'DONE', { creation_ms: 1000, started_ms: 2000, finished_ms: 2600 }),
        99999
      )
    ).toBe(600);
    expect(
      jobElapsedMs(job('a', 'CANCELLED', { creation_ms: 1000, finished_ms: 1500 }), 99999)
    ).toBe(500);
    expect(jobElapsedMs({ job_id: 'x', job_state: 'PENDING' }, 5)).toBeNull();
  });
});

describe('applyJobEvent', () => {
  it('inserts a new job newest first', () => {
    const jobs = [job('old', 'DONE', { creation_ms: 1 })];
    const next = applyJobEvent(jobs, job('new', 'PENDING', { creation_ms: 2 }));
    expect(next.map(j => j.job_id)).toEqual(['new', 'old']);
    expect(jobs.map(j => j.job_id)).toEqual(['old']); // input untouched
  });

  it('replaces the row of the same job in place', () => {
    const jobs = [job('a', 'PENDING'), job('b', 'PENDING', { creation_ms: 0 })];
    const next = applyJobEvent(jobs, job('a', 'IN_PROGRESS', { started_ms: 1500 }));
    expect(next.map(j => [j.job_id, j.job_state])).toEqual([
      ['a', 'IN_PROGRESS'],
      ['b', 'PENDING']
    ]);
  });

  it('never moves a finished job back to running', () => {
    const jobs = [job('a', 'CANCELLED')];
    expect(applyJobEvent(jobs, job('a', 'IN_PROGRESS'))[0].job_state).toBe('CANCELLED');
  });

  it('keeps at most limit rows', () => {
    let jobs: IJob[] = [];
    for (let i = 0; i < 10; i++) {
      jobs = applyJobEvent(jobs, job(`j${i}`, 'DONE', { creation_ms: i }), 3);
    }
    expect(jobs.map(j => j.job_id)).toEqual(['j9', 'j8', 'j7']);
  });

  it('merges a refetched list without regressing terminal rows', () => {
    const known = [
      job('a', 'DONE', { creation_ms: 2 }),
      job('gone', 'PENDING', { creation_ms: 0 })
    ];
    const fetched = [
      job('a', 'IN_PROGRESS', { creation_ms: 2 }),
      job('b', 'PENDING', { creation_ms: 3 })
    ];
    expect(mergeJobLists(known, fetched).map(j => [j.job_id, j.job_state])).toEqual([
      ['b', 'PENDING'],
      ['a', 'DONE']
    ]);
  });
});

describe('GPU classes', () => {
  const classes = [
    {
      name: 'default',
      gpu_model: 'Simulated GPU (numba CUDA simulator)',
      gpu_memory_bytes: 17179869184,
      max_gpu_count_per_worker: 2,
      simulated: true
    },
    {
      name: 'h100',
      gpu_model: 'NVIDIA H100 80GB HBM3',
      gpu_memory_bytes: 85899345920,
      max_gpu_count_per_worker: 8
    }
  ];

  it('joins hardware with live usage', () => {
    const usage = usageMap({
      classes: [{ name: 'default', gpus_total: 2, gpus_busy: 1, jobs_running: 1, jobs_pending: 3 }]
    });
    const rows = classRows(classes, usage);
    expect(rows[0]).toMatchObject({
      name: 'default',
      memory: '16 GiB',
      maxPerWorker: '2',
      simulated: true,
      usage: '1 busy / 1 free of 2',
      busy: 1,
      total: 2,
      pending: 3
    });
    expect(rows[1]).toMatchObject({
      name: 'h100',
      memory: '80 GiB',
      simulated: false,
      usage: '',
      busy: null
    });
  });

  it('shows host CPU and memory next to GPUs, as the kernel does', () => {
    const rows = classRows(
      [
        { name: 'a', cpu_per_gpu: 1, memory_bytes_per_gpu: 2 * 2 ** 30 },
        { name: 'b', node_cpu: 2, node_memory_bytes: 25276190720 },
        { name: 'c' }
      ],
      new Map()
    );
    expect(rows.map(r => r.host)).toEqual(['1 CPU + 2 GiB per GPU', 'node 2 CPUs, 24 GiB', '']);
  });

  it('says the nodes of a class an autoscaler scales', () => {
    const usage = usageMap({
      classes: [
        { name: 'default', gpus_total: 2, gpus_busy: 1 },
        { name: 'h100', gpus_total: 0, gpus_busy: 0, nodes_up: 0, nodes_starting: 2, nodes_max: 4 }
      ]
    });
    const rows = classRows(classes, usage);
    expect(rows[0].nodes).toBe('');
    expect(rows[1].nodes).toBe('0 of 4 nodes up · 2 starting');
    expect(nodesText({ name: 'h100', nodes_up: 3, nodes_starting: 0, nodes_max: 4 })).toBe(
      '3 of 4 nodes up'
    );
  });

  it("says a class's idle warm workers and when the last retires, counting down between events", () => {
    const now = 1_000_000;
    const usage = usageMap({
      classes: [
        {
          name: 'default',
          gpus_total: 2,
          gpus_busy: 0,
          warm_retire_ms: [now + 40_000, now + 480_000]
        },
        { name: 'h100', gpus_total: 1, gpus_busy: 0 }
      ]
    });
    expect(classRows(classes, usage, now).map(r => r.warm)).toEqual([
      'warm: 2 workers, retire in 8 min',
      ''
    ]);
    // The first retired (no event says so): one is left, whose time counts down.
    expect(classRows(classes, usage, now + 60_000)[0].warm).toBe(
      'warm: 1 worker, retires in 7 min'
    );
    expect(classRows(classes, usage, now + 450_000)[0].warm).toBe(
      'warm: 1 worker, retires in 30 s'
    );
    expect(classRows(classes, usage, now + 480_000)[0].warm).toBe('');
    expect(warmText(undefined, now)).toBe('');
  });

  it('treats zero or missing memory as not reported', () => {
    expect(
      classRows([{ name: 'sim', gpu_memory_bytes: 0 }, { name: 'x' }], new Map()).map(r => r.memory)
    ).toEqual(['', '']);
  });

  it('reads usage from an event payload or a plain list and ignores junk', () => {
    expect([...usageMap([{ name: 'x', gpus_total: 1 }]).keys()]).toEqual(['x']);
    expect(usageMap(null).size).toBe(0);
    expect(usageMap({ classes: [1, null, { nope: 1 }] }).size).toBe(0);
  });
});

describe('functions', () => {
  it('groups versions by name, names sorted', () => {
    expect(
      groupFunctions([
        { name: 'b', version: '1' },
        { name: 'a', version: 'x' },
        { name: 'b', version: '2' },
        { name: 'b', version: '1' }
      ])
    ).toEqual([
      { name: 'a', versions: ['x'] },
      { name: 'b', versions: ['1', '2'] }
    ]);
  });
});

describe('backoffDelay', () => {
  it('starts at 1 s, doubles, and stops at 30 s', () => {
    expect([0, 1, 2, 3, 4, 5, 6, 50].map(n => backoffDelay(n))).toEqual([
      1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000
    ]);
  });
});

describe('errorMessage', () => {
  it('reads the error envelope', () => {
    expect(errorMessage({ error: { code: 'x', message: 'boom' } }, 'fallback')).toBe('boom');
    expect(errorMessage({ message: 'tornado' }, 'fallback')).toBe('tornado');
    expect(errorMessage('nope', 'fallback')).toBe('fallback');
  });
});

describe('applyQueueEvent', () => {
  const pending = (id: string, position: number) =>
    job(id, 'PENDING', {
      placement: {
        gpu_class: 'default',
        num_gpus: 1,
        waiting_on_capacity: true,
        queue_position: position
      }
    });

  it('re-numbers pending jobs that moved up the queue', () => {
    const jobs = [pending('b', 2), pending('c', 3), job('a', 'IN_PROGRESS')];
    const next = applyQueueEvent(jobs, { classes: { default: ['b', 'c'] } });
    expect(next.map(j => j.placement?.queue_position)).toEqual([1, 2, undefined]);
    expect(queueText(next[0])).toContain('1');
  });

  it('leaves non-pending jobs and unchanged lists alone', () => {
    const jobs = [pending('b', 1), job('a', 'DONE')];
    expect(applyQueueEvent(jobs, { classes: { default: ['b', 'a'] } })).toBe(jobs);
    expect(applyQueueEvent(jobs, { nonsense: true })).toBe(jobs);
    expect(applyQueueEvent(jobs, null)).toBe(jobs);
  });
});

describe('attachSnippet', () => {
  it('gives a cell that attaches a Job handle to the job', () => {
    expect(attachSnippet('0123abcdef')).toBe(
      'from lancefn_jupyter import Job\n\njob = Job.attach("0123abcdef")\njob'
    );
  });

  it('refuses ids that are not plain job ids', () => {
    for (const id of ['', 'a"b', 'a\nimport os', 'x'.repeat(129), 'a b']) {
      expect(attachSnippet(id)).toBeNull();
    }
  });
});

describe('showNamespaces', () => {
  it('is true only when jobs of more than one namespace are listed', () => {
    expect(showNamespaces([])).toBe(false);
    expect(showNamespaces([job('a', 'DONE'), job('b', 'DONE')])).toBe(false); // servers before namespaces
    expect(
      showNamespaces([job('a', 'DONE', { namespace: 't1' }), job('b', 'DONE', { namespace: 't1' })])
    ).toBe(false);
    expect(
      showNamespaces([job('a', 'DONE', { namespace: 't1' }), job('b', 'DONE', { namespace: 't2' })])
    ).toBe(true);
  });

  it('a queue event with other namespaces hidden as null still numbers own jobs by global position', () => {
    const mine = job('mine', 'PENDING', { placement: { gpu_class: 'default', queue_position: 5 } });
    const next = applyQueueEvent([mine], { classes: { default: [null, 'mine'] } });
    expect(next[0].placement?.queue_position).toBe(2);
  });
});

describe('listedJobs', () => {
  it('lists run jobs, not registrations nor batches (as %gpu_jobs)', () => {
    const jobs = [
      job('r', 'DONE', { job_type: 'create_function', spec: { name: 'f' } }),
      job('a', 'PENDING', { job_type: 'run_function' }),
      job('p', 'PAUSED', { job_type: 'batch' }),
      job('f', 'DONE', { job_type: 'backfill' }),
      job('b', 'DONE')
    ];
    expect(listedJobs(jobs).map(j => j.job_id)).toEqual(['a', 'b']);
  });
});
