import { describe, expect, it } from 'vitest';

import type { IAttemptRecord } from '../../src/api';
import {
  formatAttempt,
  formatAttempts,
  formatCost,
  formatDollars
} from '../../src/model/costs';
import { job } from '../fixtures';

function attempt(
  n: number,
  over: Partial<IAttemptRecord> = {}
): IAttemptRecord {
  return {
    api_version: 'gpulayer/v1',
    attempt: n,
    placed_at: 1000,
    started_at: 1001,
    ended_at: null,
    outcome: null,
    reason: null,
    exit_code: null,
    retried: false,
    retry_at: null,
    workers: ['fake-3f2a9c1d'],
    instances: ['3f2a9c1d0000'],
    provider: 'fake',
    units: 2,
    unit_price: 2.1,
    estimate_hours: 1,
    estimate: 4.2,
    gpu_seconds: null,
    charge: null,
    ...over
  };
}

describe('the cost column', () => {
  it('shows nothing before a first placement', () => {
    expect(formatCost(job('a', 1))).toBe('');
  });

  it('shows the estimate while the only attempt runs', () => {
    expect(formatCost(job('a', 1, { history: [attempt(0)] }))).toBe('≈ $4.20');
  });

  it('adds charges of ended attempts to the running one', () => {
    const history = [
      attempt(0, { outcome: 'preempted', charge: 0.5, retried: true }),
      attempt(1)
    ];
    expect(formatCost(job('a', 1, { history }))).toBe('$0.50 + ≈ $4.20');
  });

  it('shows what was charged once every attempt ended', () => {
    const history = [
      attempt(0, { outcome: 'lost', charge: 0.25, retried: true }),
      attempt(1, { outcome: 'succeeded', charge: 1.0 })
    ];
    expect(formatCost(job('a', 1, { history }))).toBe('$1.25');
    expect(formatDollars(1234.5)).toBe('$1,235');
  });

  it('lists every attempt with how it ended, what it cost and whether it was retried', () => {
    const first = attempt(0, {
      outcome: 'lost',
      reason: 'preempted: worker fake-3f2a9c1d',
      charge: 0.12,
      retried: true
    });
    expect(formatAttempt(first)).toBe(
      'attempt 0 · on fake-3f2a9c1d (fake) · lost (preempted: worker fake-3f2a9c1d) · ' +
        '$0.12 of ≈ $4.20 · retried'
    );
    const lines = formatAttempts(job('a', 1, { history: [first, attempt(1)] }));
    expect(lines.split('\n')).toHaveLength(2);
    expect(lines).toContain(
      'attempt 1 · on fake-3f2a9c1d (fake) · in progress · ≈ $4.20'
    );
  });
});
