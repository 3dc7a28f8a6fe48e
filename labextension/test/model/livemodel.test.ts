import { describe, expect, it } from 'vitest';

import {
  APIError,
  GPUlayerAPI,
  IEventPage,
  IRequestOptions,
  ServerClock,
  errorFromAnswer
} from '../../src/api';
import { GPUlayerModel, WORKERS_REFRESH } from '../../src/model/livemodel';
import {
  cursor,
  job,
  jobEvent,
  page,
  session,
  withState,
  worker
} from '../fixtures';

/** The `events` request for a cursor, as the model writes it. */
const follow = (at: string, wait: number): string =>
  `events?cursor=${encodeURIComponent(at)}&wait=${wait}`;

/** A scripted API: each call pops the next answer for its path (or waits to be aborted). */
class FakeServer {
  calls: string[] = [];
  events: (IEventPage | Error)[] = [];
  jobs = [job('a', 1)];
  workers = [worker('w', 'box')];
  sessions = [session('s', 'train')];
  down = false;

  request = async <T>(
    path: string,
    options: IRequestOptions = {}
  ): Promise<T> => {
    this.calls.push(path);
    await Promise.resolve();
    if (this.down) {
      throw new APIError(
        0,
        'unreachable',
        'the Jupyter server does not answer'
      );
    }
    if (path.startsWith('jobs?')) {
      return { jobs: this.jobs } as T;
    }
    if (path === 'workers') {
      return { workers: this.workers } as T;
    }
    if (path === 'sessions') {
      return { sessions: this.sessions } as T;
    }
    if (path === 'events/cursor') {
      return { api_version: 'gpulayer/v1', cursor: cursor(7) } as T;
    }
    const next = this.events.shift();
    if (next instanceof Error) {
      throw next;
    }
    if (next) {
      return next as T;
    }
    // An idle long-poll: hang until the model goes away.
    return new Promise<T>((_, reject) =>
      options.signal?.addEventListener('abort', () =>
        reject(new Error('aborted'))
      )
    );
  };
}

async function settle(): Promise<void> {
  for (let i = 0; i < 20; i++) {
    await new Promise(resolve => setTimeout(resolve, 0));
  }
}

function model(server: FakeServer): GPUlayerModel {
  return new GPUlayerModel({
    api: new GPUlayerAPI(server.request),
    sleep: () => Promise.resolve(),
    random: () => 0.5
  });
}

describe('GPUlayerModel', () => {
  it('takes the cursor, then the lists, then follows events from the cursor', async () => {
    const server = new FakeServer();
    server.events.push(page([jobEvent(8, withState(job('a', 1), 'running'))]));
    const m = model(server);
    m.start();
    await settle();
    expect(server.calls.slice(0, 6)).toEqual([
      'events/cursor',
      'jobs?limit=200',
      'workers',
      'sessions',
      follow(cursor(7), 10),
      follow(cursor(8), 10)
    ]);
    expect(m.state.jobs.get('a')?.state).toBe('running');
    expect(m.state.sessions.get('s')?.name).toBe('train');
    expect(m.connection.status).toBe('live');
    m.dispose();
  });

  it('refetches the lists after a reset page and follows from its cursor', async () => {
    const server = new FakeServer();
    // The server restarted: a new epoch, counting from the start again.
    server.events.push(page([], 3, { reset: true, cursor: cursor(3, 'e2') }));
    const m = model(server);
    m.start();
    await settle();
    expect(server.calls.slice(4)).toEqual([
      follow(cursor(7), 10),
      'jobs?limit=200',
      'workers',
      'sessions',
      follow(cursor(3, 'e2'), 10)
    ]);
    expect(m.state.cursor).toBe(cursor(3, 'e2'));
    m.dispose();
  });

  it('shows unreachable with the reason, retries, and recovers by itself', async () => {
    const server = new FakeServer();
    server.down = true;
    let naps = 0;
    const m = new GPUlayerModel({
      api: new GPUlayerAPI(server.request),
      sleep: async () => {
        naps += 1;
        if (naps === 3) {
          server.down = false;
        }
        await Promise.resolve();
      },
      random: () => 0.5
    });
    const seen: string[] = [];
    m.changed.connect(() => seen.push(m.connection.status));
    m.start();
    await settle();
    expect(seen).toContain('unreachable');
    expect(m.connection.status).toBe('live');
    expect(naps).toBe(3);
    // Back up: a fresh cursor, then the lists, then the stream from that cursor.
    expect(server.calls.slice(-5)).toEqual([
      'events/cursor',
      'jobs?limit=200',
      'workers',
      'sessions',
      follow(cursor(7), 10)
    ]);
    m.dispose();
  });

  it('re-reads only the workers list, at most every WORKERS_REFRESH seconds', async () => {
    const server = new FakeServer();
    let now = 0;
    for (let seq = 8; seq < 14; seq++) {
      server.events.push(page([jobEvent(seq, job('a', 1))]));
    }
    const m = new GPUlayerModel({
      api: new GPUlayerAPI(server.request),
      sleep: () => Promise.resolve(),
      random: () => 0.5,
      now: () => (now += 4000) // every read of the clock: 4 s later
    });
    m.start();
    await settle();
    const workers = server.calls.filter(c => c === 'workers').length;
    const jobs = server.calls.filter(c => c.startsWith('jobs')).length;
    expect(jobs).toBe(1); // the snapshot only
    expect(workers).toBeGreaterThan(1);
    expect(workers).toBeLessThan(
      server.calls.filter(c => c.startsWith('events?')).length
    );
    // The long-poll never waits past the next workers refresh.
    const waits = server.calls
      .filter(c => c.startsWith('events?cursor='))
      .map(c => Number(c.split('wait=')[1]));
    expect(Math.max(...waits)).toBeLessThanOrEqual(WORKERS_REFRESH);
    m.dispose();
  });
});

describe('API errors and the server clock', () => {
  it('reads the error contract, and explains a missing server extension', () => {
    const e = errorFromAnswer(
      503,
      { code: 'home_locked', message: 'in use', hint: 'stop it' },
      ''
    );
    expect([e.code, e.message, e.hint, e.unreachable]).toEqual([
      'home_locked',
      'in use',
      'stop it',
      true
    ]);
    expect(errorFromAnswer(404, null, '<html>404</html>').code).toBe(
      'not_installed'
    );
    expect(errorFromAnswer(500, null, '<b>boom</b>').message).toBe('boom');
  });

  it('corrects for a browser clock that is off, ignoring sub-second noise', () => {
    const clock = new ServerClock();
    clock.observe(
      'Thu, 01 Jan 2026 00:00:10 GMT',
      Date.parse('2026-01-01T00:00:00Z')
    );
    expect(clock.offset).toBe(10);
    clock.observe(
      'Thu, 01 Jan 2026 00:00:00 GMT',
      Date.parse('2026-01-01T00:00:00.900Z')
    );
    expect(clock.offset).toBe(0);
    clock.observe(null);
    expect(clock.now(1000)).toBe(1);
  });
});
