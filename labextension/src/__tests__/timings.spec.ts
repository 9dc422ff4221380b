import { describe, expect, it } from 'vitest';

import { formatMs, jobTimingsText, timingsBreakdown, timingsText } from '../timings';
import { IJob, IJobTimings } from '../wire';

// Shared with the kernel's formatter (tests/kernel/widgets/test_timings.py): both must say the same.
import cases from './timings-cases.json';

function job(timings?: IJobTimings | null): IJob {
  return { job_id: 'j', job_type: 'run_function', job_state: 'DONE', timings };
}

describe('durations', () => {
  it.each(cases.format_ms as [number, string][])('%s ms → %s', (ms, text) => {
    expect(formatMs(ms)).toBe(text);
  });

  it('treats missing and non-finite values as nothing', () => {
    expect(formatMs(undefined)).toBe('0 ms');
    expect(formatMs(null)).toBe('0 ms');
    expect(formatMs(NaN)).toBe('0 ms');
    expect(formatMs(Infinity)).toBe('0 ms');
  });
});

describe('cold or warm', () => {
  it.each(cases.timings as [IJobTimings, string, string][])('%j → %s', (timings, text, withRun) => {
    expect(timingsText(timings)).toBe(text);
    expect(timingsText(timings, { run: true })).toBe(withRun);
    expect(jobTimingsText(job(timings))).toBe(text);
  });

  it('shows nothing without timings (running jobs, older servers)', () => {
    expect(timingsText(undefined)).toBe('');
    expect(timingsText(null, { run: true })).toBe('');
    expect(jobTimingsText(job())).toBe('');
    expect(jobTimingsText(job(null))).toBe('');
    expect(timingsBreakdown(undefined)).toBe('');
  });

  it.each(cases.breakdown as [IJobTimings, string][])('tooltip of %j', (timings, text) => {
    expect(timingsBreakdown(timings)).toBe(text);
  });
});
