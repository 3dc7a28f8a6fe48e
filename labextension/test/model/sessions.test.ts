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
  sessionList,
  waitingKernels
} from '../../src/model';
import { page } from '../fixtures';
import { job, report, session, sessionEvent, withState } from '../fixtures';

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
