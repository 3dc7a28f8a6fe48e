import { describe, expect, it } from 'vitest';

import {
  APIError,
  GPUlayerAPI,
  IJob,
  ILogPage,
  ILogRecord,
  IRequestOptions,
  JobState
} from '../../src/api';
import { LOG_PAGE, LOG_WAIT, LogFollower } from '../../src/model/logfollower';
import { backoff } from '../../src/model/retry';
import { job, withState } from '../fixtures';

const V = 'gpulayer/v1' as const;

function rec(seq: number): ILogRecord {
  return {
    api_version: V,
    seq,
    time: seq,
    stream: 'stdout',
    rank: null,
    text: `line ${seq}`,
    cell: null,
    data: null
  };
}

function logPage(
  state: JobState,
  records: ILogRecord[],
  next = records[records.length - 1]?.seq ?? 0
): ILogPage {
  return { api_version: V, job_id: 'j', records, next_since: next, state };
}

/** A scripted API: `jobs/j` and `jobs/j/logs` answers in order; past the script, hang. */
class FakeServer {
  calls: string[] = [];
  jobs: (IJob | Error)[] = [];
  logs: (ILogPage | Error)[] = [];

  request = async <T>(
    path: string,
    options: IRequestOptions = {}
  ): Promise<T> => {
    this.calls.push(path);
    await Promise.resolve();
    const next = path.includes('/logs?')
      ? this.logs.shift()
      : this.jobs.shift();
    if (next instanceof Error) {
      throw next;
    }
    if (next) {
      return next as T;
    }
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

const logs = (since: number, wait: number): string =>
  `jobs/j/logs?since=${since}&wait=${wait}&limit=${LOG_PAGE}`;

describe('LogFollower', () => {
  it('follows a running job, then reads the rest without waiting and completes', async () => {
    const server = new FakeServer();
    server.jobs.push(
      withState(job('j', 1), 'running'),
      withState(job('j', 1), 'succeeded')
    );
    server.logs.push(
      logPage('running', [rec(1), rec(2)]),
      logPage('succeeded', [rec(3)]),
      logPage('succeeded', [])
    );
    const follower = new LogFollower(new GPUlayerAPI(server.request), 'j');
    const statuses: string[] = [];
    follower.changed.connect(() => statuses.push(follower.status));
    expect(follower.status).toBe('loading');
    follower.start();
    await settle();
    expect(server.calls).toEqual([
      'jobs/j',
      logs(0, LOG_WAIT),
      logs(2, LOG_WAIT),
      'jobs/j', // the page said the state changed
      logs(3, 0)
    ]);
    expect(follower.buffer.records.map(r => r.seq)).toEqual([1, 2, 3]);
    expect(follower.job?.state).toBe('succeeded');
    expect(follower.status).toBe('complete');
    expect(statuses).toEqual(['following', 'following', 'complete']);
    follower.dispose();
  });

  it('keeps only the newest lines it was asked to', async () => {
    const server = new FakeServer();
    server.jobs.push(withState(job('j', 1), 'succeeded'));
    server.logs.push(
      logPage('succeeded', [rec(1), rec(2), rec(3)]),
      logPage('succeeded', [])
    );
    const follower = new LogFollower(new GPUlayerAPI(server.request), 'j', {
      max: 2
    });
    follower.start();
    await settle();
    expect(follower.buffer.records.map(r => r.seq)).toEqual([2, 3]);
    expect(follower.buffer.dropped).toBe(1);
    expect(follower.status).toBe('complete');
  });

  it('says the job is missing on a 404 and stops', async () => {
    const server = new FakeServer();
    server.jobs.push(new APIError(404, 'not_found', 'no job j'));
    const follower = new LogFollower(new GPUlayerAPI(server.request), 'j');
    follower.start();
    await settle();
    expect([follower.status, follower.error]).toEqual(['missing', 'no job j']);
    expect(server.calls).toEqual(['jobs/j']);
  });

  it('retries with backoff after a failure and carries on where it was', async () => {
    const server = new FakeServer();
    server.jobs.push(withState(job('j', 1), 'running'));
    server.logs.push(
      logPage('running', [rec(1)]),
      new APIError(0, 'unreachable', 'the Jupyter server does not answer'),
      logPage('running', [rec(2)])
    );
    const naps: number[] = [];
    const follower = new LogFollower(new GPUlayerAPI(server.request), 'j', {
      sleep: ms => {
        naps.push(ms);
        return Promise.resolve();
      },
      random: () => 0.5
    });
    const seen: string[] = [];
    follower.changed.connect(() =>
      seen.push(`${follower.status} ${follower.error}`.trim())
    );
    follower.start();
    await settle();
    expect(naps).toEqual([backoff(1, 0.5) * 1000]);
    expect(seen).toEqual([
      'following',
      'retrying the Jupyter server does not answer',
      'following'
    ]);
    expect(server.calls).toEqual([
      'jobs/j',
      logs(0, LOG_WAIT),
      logs(1, LOG_WAIT), // failed
      logs(1, LOG_WAIT), // the same request again
      logs(2, LOG_WAIT) // following on
    ]);
    expect(follower.buffer.records.map(r => r.seq)).toEqual([1, 2]);
    follower.dispose();
  });

  it('stops its long-poll when disposed', async () => {
    const server = new FakeServer();
    server.jobs.push(withState(job('j', 1), 'running'));
    const follower = new LogFollower(new GPUlayerAPI(server.request), 'j');
    follower.start();
    await settle();
    follower.dispose();
    await settle();
    expect(follower.isDisposed).toBe(true);
    expect(follower.status).toBe('loading');
    expect(server.calls).toEqual(['jobs/j', logs(0, LOG_WAIT)]);
  });
});
