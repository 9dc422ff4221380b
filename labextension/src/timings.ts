/**
 * Where a job's time went, in words — cold or warm (docs/ARCHITECTURE.md, "Warm state"). The same rules
 * as the kernel's lancefn_jupyter/display/timings.py (keep the two in step):
 *
 *   "cold start 1.2 s, setup 1.0 s"  a job that started a worker and executed the version's module
 *   "setup 350 ms"                   only the setup was paid
 *   "setup reused from @1a2b3c, 2 ms" the idle worker of an earlier version with the same setup part ran it
 *   "warm"                           an idle worker already held the version ("warm, ran 12 ms" with run)
 *   ""                               no timings (the job has not ended on a worker, or an older server)
 *
 * Pure (tested in src/__tests__/timings.spec.ts).
 */

import { IJob, IJobTimings } from './wire';

/** A non-negative integer count of tenths as "d.d". */
function tenthsText(tenths: number): string {
  return `${Math.floor(tenths / 10)}.${tenths % 10}`;
}

/** [unit, milliseconds per tenth of it]: a duration is said in the first unit it is under 60.0 of. */
const UNITS: readonly [string, number][] = [
  ['s', 100],
  ['min', 6000]
];

/**
 * A duration in milliseconds: "<1 ms", "12 ms" under a second, "1.2 s" under a minute, "2.5 min",
 * "1.1 h". Rounded half up, so 999.5 ms is "1.0 s" and 59.96 s is "1.0 min".
 */
export function formatMs(ms: number | null | undefined): string {
  const value = typeof ms === 'number' && Number.isFinite(ms) ? Math.max(0, ms) : 0;
  if (value === 0) {
    return '0 ms';
  }
  const whole = Math.floor(value + 0.5);
  if (whole < 1) {
    return '<1 ms';
  }
  if (whole < 1000) {
    return `${whole} ms`;
  }
  for (const [unit, tenth] of UNITS) {
    const tenths = Math.floor(value / tenth + 0.5);
    if (tenths < 600) {
      return `${tenthsText(tenths)} ${unit}`;
    }
  }
  return `${tenthsText(Math.floor(value / 360_000 + 0.5))} h`;
}

/** A field the server may omit (it leaves out zeros): 0 unless a positive finite number. */
function part(value: number | undefined): number {
  return typeof value === 'number' && Number.isFinite(value) && value > 0 ? value : 0;
}

/**
 * Cold or warm in a few words: the start / environment / setup a job paid (only the non-zero parts),
 * else "warm". With `run`, the run time too ("warm, ran 12 ms"; nothing when the entry never ran).
 * No timings → "".
 */
export function timingsText(
  timings: IJobTimings | null | undefined,
  options: { run?: boolean } = {}
): string {
  if (!timings || typeof timings !== 'object') {
    return '';
  }
  const parts = (
    [
      ['cold start', part(timings.start_ms)],
      ['environment', part(timings.environment_ms)],
      ['setup', part(timings.setup_ms)]
    ] as [string, number][]
  )
    .filter(([, value]) => value > 0)
    .map(([label, value]) => `${label} ${formatMs(value)}`);
  if (typeof timings.setup_reused_from === 'string' && timings.setup_reused_from) {
    parts.push(
      `setup reused from @${timings.setup_reused_from.slice(0, 6)}, ${formatMs(part(timings.rebind_ms))}`
    );
  }
  if (!parts.length) {
    parts.push(timings.cold ? 'cold start' : 'warm');
  }
  const run = part(timings.run_ms);
  if (options.run && run > 0) {
    parts.push(`ran ${formatMs(run)}`);
  }
  return parts.join(', ');
}

/** Every phase, for a tooltip: "queued 2.0 s · start 1.2 s · environment 0 ms · setup 1.0 s · run 12 ms". */
export function timingsBreakdown(timings: IJobTimings | null | undefined): string {
  if (!timings || typeof timings !== 'object') {
    return '';
  }
  return (
    [
      ['queued', timings.queued_ms],
      ['start', timings.start_ms],
      ['environment', timings.environment_ms],
      ['setup', timings.setup_ms],
      ['run', timings.run_ms]
    ] as [string, number | undefined][]
  )
    .map(([label, value]) => `${label} ${formatMs(part(value))}`)
    .join(' · ');
}

const SYMBOLS: Record<string, string> = { USD: '$', EUR: '€', GBP: '£' };

/** "$0.021", "€12.50", "3.00 CHF" (as the kernel's display/timings.py `format_money`). */
export function formatMoney(amount: number, currency = 'USD'): string {
  const text =
    amount >= 1 || amount === 0
      ? amount.toFixed(2)
      : String(Number(amount.toPrecision(amount >= 0.01 ? 2 : 1)));
  const symbol = SYMBOLS[currency];
  return symbol ? `${symbol}${text}` : `${text} ${currency}`;
}

/** `timingsText` of a job's `timings` ("" for a job without), and its cost where its class has prices
 * ("warm, ran 41 s · $0.02": docs/ARCHITECTURE.md, "Cost"). */
export function jobTimingsText(job: IJob, options: { run?: boolean } = {}): string {
  const text = timingsText(job.timings, options);
  const cost = job.usage?.cost;
  if (typeof cost !== 'number') {
    return text;
  }
  const money = formatMoney(cost, job.usage?.currency ?? 'USD');
  return text ? `${text} · ${money}` : money;
}
