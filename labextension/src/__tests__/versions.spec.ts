import { describe, expect, it } from 'vitest';

import { diffText, expectedStartText, lookupSnippet } from '../format';
import { applyQueueEvent } from '../reducers';
import { IJob } from '../wire';

function pending(id: string, position: number, expected?: number | null, numGpus = 1): IJob {
  const placement: IJob['placement'] = {
    gpu_class: 'default',
    num_gpus: numGpus,
    waiting_on_capacity: true,
    queue_position: position
  };
  if (expected !== undefined) {
    placement.expected_start_ms = expected;
  }
  return { job_id: id, job_type: 'run_function', job_state: 'PENDING', creation_ms: 0, placement };
}

describe('expectedStartText', () => {
  it('says when a queued GPU job should start, or that it is unknown', () => {
    expect(expectedStartText(pending('a', 1, 41_000), 1_000)).toBe('starts in about 40 s');
    expect(expectedStartText(pending('a', 1, 1_400), 1_000)).toBe('starts any moment');
    expect(expectedStartText(pending('a', 1, 601_000), 1_000)).toBe('starts in about 10 min');
    expect(expectedStartText(pending('a', 1, null), 1_000)).toBe('start time unknown');
  });

  it('says an estimate resting on run times that say little is uncertain, with its best guess', () => {
    const job = pending('a', 1, 25_000);
    job.placement!.expected_start_uncertain = true;
    expect(expectedStartText(job, 1_000)).toBe('start time uncertain (best guess 24 s)');
  });

  it('says nothing when no estimate is offered', () => {
    expect(expectedStartText(pending('a', 1), 0)).toBe(''); // an older server, or Ray
    expect(expectedStartText(pending('a', 1, 5_000, 0), 0)).toBe(''); // CPU job
    expect(expectedStartText({ ...pending('a', 1, 5_000), job_state: 'IN_PROGRESS' }, 0)).toBe('');
  });
});

describe('applyQueueEvent with expected starts', () => {
  it('takes the expected start the queue event carries, even when the position is unchanged', () => {
    const jobs = [pending('b', 1, 10_000), pending('c', 2, null)];
    const next = applyQueueEvent(jobs, {
      classes: { default: ['b', 'c'] },
      expected_start_ms: { b: 12_000, c: 20_000 }
    });
    expect(next.map(j => j.placement?.expected_start_ms)).toEqual([12_000, 20_000]);
    expect(
      applyQueueEvent(next, {
        classes: { default: ['b', 'c'] },
        expected_start_ms: { b: 12_000, c: 20_000 }
      })
    ).toBe(next);
  });

  it('takes the uncertainty the queue event carries with the estimate', () => {
    const next = applyQueueEvent([pending('b', 1, 10_000)], {
      classes: { default: ['b'] },
      expected_start_ms: { b: 10_000 },
      expected_start_uncertain: { b: true }
    });
    expect(next[0].placement?.expected_start_uncertain).toBe(true);
    const settled = applyQueueEvent(next, {
      classes: { default: ['b'] },
      expected_start_ms: { b: 10_000 }
    });
    expect(settled[0].placement?.expected_start_uncertain).toBe(false);
  });

  it('ignores malformed estimates and keeps the old value when none is sent', () => {
    const jobs = [pending('b', 2, 10_000)];
    const next = applyQueueEvent(jobs, {
      classes: { default: ['b'] },
      expected_start_ms: { b: 'soon' }
    });
    expect(next[0].placement?.queue_position).toBe(1);
    expect(next[0].placement?.expected_start_ms).toBe(10_000);
  });
});

describe('lookupSnippet', () => {
  it('builds a lookup cell with an 8-character version prefix', () => {
    expect(lookupSnippet('score', '1a2b3c4d5e6f7a8b')).toBe(
      'import lancefn_jupyter\n\nscore = lancefn_jupyter.lookup("score@1a2b3c4d")\nscore'
    );
    expect(lookupSnippet('scores.v2', '1a2b3c4d5e6f7a8b')).toContain(
      'fn = lancefn_jupyter.lookup("scores.v2@1a2b3c4d")'
    );
  });

  it('refuses names or versions that could break out of the string', () => {
    expect(lookupSnippet('x"); import os', '1a2b3c4d')).toBeNull();
    expect(lookupSnippet('score', 'abc"def')).toBeNull();
    expect(lookupSnippet('score', 'abc')).toBeNull();
  });
});

describe('diffText', () => {
  it('shows the summary, the runtime rows and the unified diff', () => {
    const text = diffText({
      old: 'aaaa',
      new: 'bbbb',
      summary: 'code: 1 line; num_gpus 1→2',
      runtime: [['num_gpus', '1', '2']],
      source_diff: ['--- f@aaaa', '+++ f@bbbb', '-    return x', '+    return 2 * x']
    });
    expect(text.split('\n')).toEqual([
      'aaaa → bbbb: code: 1 line; num_gpus 1→2',
      'num_gpus: 1 → 2',
      '--- f@aaaa',
      '+++ f@bbbb',
      '-    return x',
      '+    return 2 * x'
    ]);
    expect(diffText({ old: 'a', new: 'b', summary: 'env: values changed' })).toContain(
      'source unchanged'
    );
  });
});
