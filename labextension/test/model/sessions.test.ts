import { describe, expect, it } from 'vitest';

import {
  formatHolder,
  formatSessionClock,
  formatSessionUse
} from '../../src/model/format';
import {
  applyEvents,
  emptyState,
  fromSnapshot,
  kernelEnds,
  sessionList,
  waitingKernels
} from '../../src/model';
import { page } from '../fixtures';
import {
  job,
  jobEvent,
  report,
  session,
  sessionEvent,
  withState
} from '../fixtures';

describe('sessions in the panel state', () => {
  it('keeps live sessions from the snapshot and leaves out ended ones', () => {
    const s = fromSnapshot([], [], '1:0', [
      session('b', 'beta'),
      session('a', 'alpha'),
      session('c', 'gone', { status: 'ended' })
    ]);
    expect(sessionList(s).map(x => x.name)).toEqual(['alpha', 'beta']);
  });

  it('follows session events: a change replaces it, an end removes it', () => {
    let s = emptyState();
    s = applyEvents(s, page([sessionEvent(1, session('a', 'alpha'))], 1));
    expect(s.sessions.get('a')?.status).toBe('idle');
    s = applyEvents(
      s,
      page(
        [
          sessionEvent(
            2,
            session('a', 'alpha', { status: 'busy', busy_cell: 3 })
          )
        ],
        2
      )
    );
    expect(s.sessions.get('a')?.busy_cell).toBe(3);
    s = applyEvents(
      s,
      page([sessionEvent(3, session('a', 'alpha', { status: 'ended' }))], 3)
    );
    expect(s.sessions.size).toBe(0);
  });
});

describe('session formatting', () => {
  it('counts down an idle session to the end of its idle timeout', () => {
    const s = session('a', 'alpha', { idle_since: 1000, ends_at: 2800 });
    expect(formatSessionClock(s, 1185)).toBe('idle 3m 05s · ends in 26m 55s');
  });

  it('says what a busy, waiting or broken session is doing', () => {
    expect(
      formatSessionClock(session('a', 'x', { status: 'busy', busy_cell: 7 }), 0)
    ).toBe('running cell 7');
    expect(
      formatSessionClock(session('a', 'x', { status: 'waiting' }), 0)
    ).toBe('waiting for its GPUs');
    expect(formatSessionClock(session('a', 'x', { status: 'broken' }), 0)).toBe(
      'broken: restart it'
    );
  });

  it('names the holder by its notebook file', () => {
    expect(formatHolder(session('a', 'x'))).toBe('train.ipynb');
    const none = session('a', 'x', {
      holder: {
        api_version: 'gpulayer/v1',
        client: 'k',
        notebook: null,
        kernel: null
      }
    });
    expect(formatHolder(none)).toBe('a client without a notebook');
  });
});

describe('GPU kernels among sessions', () => {
  it('says a kernel is a kernel, not a session of 0 cells', () => {
    const k = session('k', 'kernel-1', { kernel: true, cells: 0 });
    expect(formatSessionUse(k)).toBe('GPU kernel picked in the launcher');
    expect(formatSessionUse(k)).not.toContain('cell');
  });

  it('counts ranks and cells of a session', () => {
    expect(formatSessionUse(session('a', 'x', { ranks: 2, cells: 1 }))).toBe(
      '2 ranks · 1 cell'
    );
    expect(formatSessionUse(session('a', 'x', { cells: 3 }))).toBe(
      '1 rank · 3 cells'
    );
  });
});

describe('GPU kernels waiting for their GPUs', () => {
  it("gives each queued kernel's sentence, from its freshest job", () => {
    const waiting = session('k', 'kernel-1', {
      kernel: true,
      status: 'waiting',
      job: withState(job('k', 4), 'queued')
    });
    let s = fromSnapshot([], [], '1:0', [
      waiting,
      session('s', 'plain', { status: 'waiting' }),
      session('r', 'kernel-2', { kernel: true })
    ]);
    expect(waitingKernels(s)).toEqual([
      {
        id: 'k',
        job: 'k',
        holder: 'train.ipynb',
        sentence: 'waiting for the next scheduling pass'
      }
    ]);
    const pending = report('k', {
      sentence: '0/1 workers can run job k: 1 has too few GPUs'
    });
    s = fromSnapshot([{ ...waiting.job, pending }], [], '1:0', [waiting]);
    expect(waitingKernels(s).map(w => w.sentence)).toEqual([
      '0/1 workers can run job k: 1 has too few GPUs'
    ]);
  });
});

describe('GPU kernels whose session ends on purpose', () => {
  const holder = {
    api_version: 'gpulayer/v1' as const,
    client: 'kernel-k1',
    notebook: 'work/train.ipynb',
    kernel: 'k1'
  };
  const live = session('k', 'kernel-1', { kernel: true, holder });

  it('tells an idle end once its job is cancelled, and only once', () => {
    let s = fromSnapshot([live.job], [], '1:0', [live]);
    let look = kernelEnds(s, new Map());
    expect(look.ended).toEqual([]);
    expect([...look.watching.keys()]).toEqual(['k']);

    // The session's end comes first: its job's end follows in a later page.
    const gone = { ...live, status: 'ended' as const };
    s = applyEvents(s, page([sessionEvent(2, gone)]));
    look = kernelEnds(s, look.watching);
    expect(look.ended).toEqual([]);
    expect([...look.watching.keys()]).toEqual(['k']);

    const why =
      'session ended: idle for 30 min (its idle timeout), so its GPUs were freed';
    const cancelled = { ...withState(live.job, 'cancelled'), reason: why };
    s = applyEvents(s, page([jobEvent(3, cancelled)]));
    look = kernelEnds(s, look.watching);
    expect(look.ended).toEqual([
      { id: 'k', kernel: 'k1', holder: 'train.ipynb', reason: why }
    ]);
    expect(look.watching.size).toBe(0);
    expect(kernelEnds(s, look.watching).ended).toEqual([]);
  });

  it('leaves lost kernels to Jupyter, and sessions that are not kernels alone', () => {
    const plain = session('p', 'plain');
    let s = fromSnapshot([live.job, plain.job], [], '1:0', [live, plain]);
    const first = kernelEnds(s, new Map());
    expect([...first.watching.keys()]).toEqual(['k']);
    s = applyEvents(
      s,
      page([
        sessionEvent(2, { ...live, status: 'ended' }),
        jobEvent(3, withState(live.job, 'lost')),
        sessionEvent(4, { ...plain, status: 'ended' }),
        jobEvent(5, withState(plain.job, 'cancelled'))
      ])
    );
    const look = kernelEnds(s, first.watching);
    expect(look.ended).toEqual([]);
    expect(look.watching.size).toBe(0);
  });
});
