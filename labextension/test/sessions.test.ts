import { describe, expect, it } from 'vitest';

import { formatHolder, formatSessionClock } from '../src/format';
import {
  applyEvents,
  emptyState,
  fromSnapshot,
  sessionList
} from '../src/state';
import { page } from './fixtures';
import { session, sessionEvent } from './fixtures';

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
