import { describe, expect, it } from 'vitest';

import { queueText } from '../format';
import { IJobPlacement } from '../wire';
import data from './queue-cases.json';

describe('queueText: the one wording of a pending job (queue-cases.json, shared with Python)', () => {
  for (const [placement, nowMs, text] of data.cases as [IJobPlacement, number, string][]) {
    it(`${JSON.stringify(placement)} at ${nowMs} → "${text}"`, () => {
      expect(queueText({ job_id: 'j', job_state: 'PENDING', placement }, nowMs)).toBe(text);
    });
  }
  it('says nothing for a job that is not pending', () => {
    const placement = data.cases[0][0] as IJobPlacement;
    expect(queueText({ job_id: 'j', job_state: 'IN_PROGRESS', placement }, 0)).toBe('');
  });
});
