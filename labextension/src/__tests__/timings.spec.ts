import { describe, expect, it } from 'vitest';

import { formatMoney, formatMs, jobTimingsText, timingsBreakdown, timingsText } from '../timings';
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

describe('cost', () => {
  it('says money as the kernel does', () => {
    expect(formatMoney(0.0213)).toBe('$0.021');
    expect(formatMoney(12.5, 'EUR')).toBe('€12.50');
    expect(formatMoney(3, 'CHF')).toBe('3.00 CHF');
    expect(formatMoney(0.004)).toBe('$0.004');
  });

  it("follows a priced job's timings, and is absent without prices", () => {
    const timed = job({
      queued_ms: 0,
      start_ms: 0,
      environment_ms: 0,
      setup_ms: 0,
      run_ms: 41000,
      cold: false
    });
    expect(
      jobTimingsText(
        { ...timed, usage: { held_s: 41, cost: 0.021, currency: 'USD' } },
        { run: true }
      )
    ).toBe('warm, ran 41.0 s · $0.021');
    expect(jobTimingsText({ ...timed, usage: { held_s: 41 } }, { run: true })).toBe(
      'warm, ran 41.0 s'
    );
  });
});
