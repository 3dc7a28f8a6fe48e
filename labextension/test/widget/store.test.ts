import { describe, expect, it } from 'vitest';

import {
  IWidgetModel,
  MAX_UNSEEN_JOBS,
  keepLast,
  store,
  storedJobs
} from '../../src/widget/store';

function model(jobId: string): IWidgetModel {
  const traits: Record<string, unknown> = {
    job_id: jobId,
    log_tail: [['stdout', null, 'saved']],
    chart: []
  };
  return {
    get: name => traits[name],
    on: () => undefined,
    off: () => undefined,
    send: () => undefined
  };
}

describe("the page's store of a job's lines (the cell widget)", () => {
  it('keeps one store per job, started from the saved tail', () => {
    const a = store(model('job-a'));
    expect(store(model('job-a'))).toBe(a);
    expect(a.lines).toEqual([['stdout', null, 'saved']]);
  });

  it('keeps the lines of at most MAX_UNSEEN_JOBS jobs no view draws', () => {
    const shown = store(model('shown'));
    const draw = (): void => undefined;
    shown.listeners.add(draw);
    for (let i = 0; i < MAX_UNSEEN_JOBS + 50; i++) {
      store(model(`old-${i}`));
    }
    expect(storedJobs()).toBeLessThanOrEqual(MAX_UNSEEN_JOBS + 1);
    expect(store(model('shown'))).toBe(shown); // a job a view draws is kept
    expect(store(model(`old-${MAX_UNSEEN_JOBS + 49}`)).lines).toHaveLength(1);
  });

  it('keeps the last items of a list', () => {
    const items = [1, 2, 3, 4, 5];
    keepLast(items, 3);
    expect(items).toEqual([3, 4, 5]);
  });
});
