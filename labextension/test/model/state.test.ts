import { describe, expect, it } from 'vitest';

import type { ILogRecord } from '../../src/api';
import {
  appendLog,
  applyEvents,
  backoff,
  cancellable,
  emptyLog,
  emptyState,
  filterCounts,
  findJob,
  fromSnapshot,
  jobList,
  logRanks,
  queue,
  workerList
} from '../../src/model';
import {
  cursor,
  job,
  jobEvent,
  page,
  report,
  withState,
  worker,
  workerEvent
} from '../fixtures';

describe('folding events', () => {
  it("applies jobs and workers and moves to the page's cursor", () => {
    const a = job('a', 1);
    const s1 = applyEvents(
      emptyState(),
      page([jobEvent(1, a), workerEvent(2, worker('w', 'box'))])
    );
    expect(s1.jobs.get('a')?.state).toBe('queued');
    expect(s1.workers.get('w')?.name).toBe('box');
    expect(s1.cursor).toBe(cursor(2));
    const s2 = applyEvents(s1, page([jobEvent(3, withState(a, 'running'))]));
    expect(s2.jobs.get('a')?.state).toBe('running');
    expect(s2.cursor).toBe(cursor(3));
    expect(s1.jobs.get('a')?.state).toBe('queued'); // never mutated
  });

  it('returns the same state when nothing changed (no re-render)', () => {
    const s = fromSnapshot([job('a', 1)], [], cursor(5));
    expect(applyEvents(s, page([], 5))).toBe(s);
  });

  it("follows the server's cursor even when a page brings no events", () => {
    const s = fromSnapshot([job('a', 1)], [], cursor(5));
    const next = applyEvents(s, page([], 6));
    expect(next.cursor).toBe(cursor(6));
    expect(next.jobs).toBe(s.jobs);
  });

  it('converges on the newest state when events overlap a snapshot', () => {
    // cursor taken at 10, then the lists (already showing "running"), then events 11..12
    const s = fromSnapshot([withState(job('a', 1), 'running')], [], cursor(10));
    const next = applyEvents(
      s,
      page([
        jobEvent(11, withState(job('a', 1), 'placed')),
        jobEvent(12, withState(job('a', 1), 'running'))
      ])
    );
    expect(next.jobs.get('a')?.state).toBe('running');
  });

  it('keeps every active job but only the newest finished ones', () => {
    const events = [];
    for (let i = 1; i <= 10; i++) {
      events.push(jobEvent(i, withState(job(`f${i}`, i), 'succeeded')));
    }
    events.push(jobEvent(11, withState(job('live', 0), 'running')));
    const s = applyEvents(emptyState(), page(events), 3);
    expect([...s.jobs.keys()].sort()).toEqual(['f10', 'f8', 'f9', 'live']);
  });
});

describe('lists', () => {
  it('orders the queue as the scheduler does', () => {
    const pending = (
      id: string,
      seq: number,
      position: number | null,
      priority = 0
    ) =>
      job(id, seq, {
        spec: { ...job(id, seq).spec, priority },
        pending: report(id, { position, sentence: `s ${id}` })
      });
    const s = fromSnapshot(
      [
        pending('c', 3, 2),
        pending('a', 1, null),
        pending('b', 2, 1),
        pending('d', 4, null, 5),
        withState(job('r', 0), 'running')
      ],
      [],
      ''
    );
    expect(queue(s).map(j => j.id)).toEqual(['b', 'c', 'd', 'a']);
  });

  it('lists jobs past the queue newest first, filtered by state', () => {
    const s = fromSnapshot(
      [
        withState(job('q', 1), 'queued'),
        withState(job('r', 2), 'running'),
        withState(job('ok', 3), 'succeeded'),
        withState(job('bad', 4), 'failed'),
        withState(job('gone', 5), 'lost'),
        withState(job('x', 6), 'cancelled'),
        withState(job('p', 7), 'placed')
      ],
      [],
      ''
    );
    expect(jobList(s).map(j => j.id)).toEqual([
      'p',
      'x',
      'gone',
      'bad',
      'ok',
      'r'
    ]);
    expect(jobList(s, 'active').map(j => j.id)).toEqual(['p', 'r']);
    expect(jobList(s, 'failed').map(j => j.id)).toEqual(['gone', 'bad']);
    expect(filterCounts(s)).toEqual({
      all: 6,
      active: 2,
      succeeded: 1,
      failed: 2,
      cancelled: 1
    });
  });

  it("sorts workers by name with gone ones (the server's `live`) last", () => {
    const s = fromSnapshot(
      [],
      [
        worker('1', 'zeta'),
        worker('2', 'alpha', { state: 'lost', live: false }),
        worker('3', 'beta'),
        // The server's word wins: the panel repeats no rule about states.
        worker('4', 'aaa', { state: 'offline', live: false })
      ],
      ''
    );
    expect(workerList(s).map(w => w.name)).toEqual([
      'beta',
      'zeta',
      'aaa',
      'alpha'
    ]);
  });

  it('finds jobs by id or unique prefix', () => {
    const s = fromSnapshot([job('abcdef', 1), job('abcxyz', 2)], [], '');
    expect(findJob(s, 'abcdef')?.id).toBe('abcdef');
    expect(findJob(s, 'abcx')?.id).toBe('abcxyz');
    expect(findJob(s, 'abc')).toBeNull(); // ambiguous
    expect(findJob(s, 'zzz')).toBeNull();
  });

  it('offers cancel only while a job can still be stopped', () => {
    expect(cancellable(job('a', 1))).toBe(true);
    expect(cancellable(withState(job('a', 1), 'running'))).toBe(true);
    expect(
      cancellable({
        ...withState(job('a', 1), 'running'),
        cancel_requested: true
      })
    ).toBe(false);
    expect(cancellable(withState(job('a', 1), 'failed'))).toBe(false);
  });
});

describe('log buffer', () => {
  const rec = (seq: number, rank: number | null = null): ILogRecord => ({
    api_version: 'gpulayer/v1',
    seq,
    time: seq,
    stream: seq % 2 ? 'stdout' : 'stderr',
    rank,
    text: `line ${seq}`,
    cell: null,
    data: null
  });

  it('appends in order and ignores records it already holds', () => {
    let b = appendLog(emptyLog(), [rec(1), rec(2)], 2);
    b = appendLog(b, [rec(2), rec(3)], 3);
    expect(b.records.map(r => r.seq)).toEqual([1, 2, 3]);
    expect(b.next).toBe(3);
  });

  it('keeps the newest lines and counts the dropped ones', () => {
    let b = emptyLog();
    for (let i = 1; i <= 10; i++) {
      b = appendLog(b, [rec(i)], i, 4);
    }
    expect(b.records.map(r => r.seq)).toEqual([7, 8, 9, 10]);
    expect(b.dropped).toBe(6);
  });

  it('returns the same buffer when a page brings nothing new', () => {
    const b = appendLog(emptyLog(), [rec(1)], 1);
    expect(appendLog(b, [], 1)).toBe(b);
    expect(appendLog(b, [], 5).next).toBe(5);
  });

  it('lists the ranks of a gang', () => {
    const b = appendLog(
      emptyLog(),
      [rec(1, 1), rec(2, 0), rec(3, 1), rec(4)],
      4
    );
    expect(logRanks(b)).toEqual([0, 1]);
  });
});

describe('backoff', () => {
  it('doubles from half a second to ten, with jitter', () => {
    expect(backoff(1, 0.5)).toBe(0.5);
    expect(backoff(2, 0.5)).toBe(1);
    expect(backoff(5, 0.5)).toBe(8);
    expect(backoff(50, 0.5)).toBe(10);
    expect(backoff(1, 0)).toBe(0.375);
    expect(backoff(1, 1)).toBe(0.625);
  });
});
