/**
 * The live model behind the panel: the event cursor (`GET events/cursor`), one snapshot of
 * the lists, then the event stream from that cursor (`GET events?cursor=&wait=`, a long-poll
 * that answers the moment something changes), with a backoff retry loop and a connection
 * status for the banner.
 *
 * Nothing polls on a fixed interval: an idle panel holds one open request at a time.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { APIError, GPUlayerAPI } from '../api';
import type { IJob, ISessionInfo } from '../api';
import { abortableSleep, backoff } from './retry';
import { IPanelState, applyEvents, emptyState, fromSnapshot } from './state';

/** How long one event long-poll waits on the server (s); the server caps it too. */
export const EVENT_WAIT = 25;

/**
 * How often (s) the workers list is re-read for their "last heartbeat" ages: heartbeats are
 * not events (one per worker every few seconds would flood the stream), so this one small
 * list is refreshed on a timer. Jobs and the queue are never polled.
 */
export const WORKERS_REFRESH = 10;

/** The connection as the banner shows it. */
export interface IConnection {
  status: 'connecting' | 'live' | 'unreachable';
  /** Why it is unreachable (the server's message when it gave one). */
  message: string;
  hint: string;
  /** When (ms epoch) the next retry starts, while unreachable. */
  retryAt: number | null;
  failures: number;
}

/** Anything the model needs from the outside world, so tests can fake it. */
export interface IModelOptions {
  api: GPUlayerAPI;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  random?: () => number;
  /** The clock (ms) for the workers refresh. */
  now?: () => number;
}

export class GPUlayerModel {
  constructor(options: IModelOptions) {
    this.api = options.api;
    this._sleep = options.sleep ?? abortableSleep;
    this._random = options.random ?? Math.random;
    this._now = options.now ?? Date.now;
  }

  readonly api: GPUlayerAPI;

  get state(): IPanelState {
    return this._state;
  }

  get connection(): IConnection {
    return this._connection;
  }

  /** Emitted after the lists or the connection status change. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Start following (idempotent). Runs until `dispose`. */
  start(): void {
    if (this._running || this._abort.signal.aborted) {
      return;
    }
    this._running = true;
    void this._loop();
  }

  /** Retry now instead of waiting out the backoff (the banner's "Retry" button). */
  retryNow(): void {
    this._wake?.abort();
  }

  /** Fold in a job the user just acted on (e.g. the answer to a cancel), before its event. */
  noteJob(job: IJob): void {
    const jobs = new Map(this._state.jobs);
    jobs.set(job.id, job);
    this._state = { ...this._state, jobs };
    this._changed.emit();
  }

  /** Fold in a session the user just acted on (the answer to a stop), before its event. */
  noteSession(session: ISessionInfo): void {
    const sessions = new Map(this._state.sessions);
    if (session.status === 'ended') {
      sessions.delete(session.id);
    } else {
      sessions.set(session.id, session);
    }
    this._state = { ...this._state, sessions };
    this._changed.emit();
  }

  get isDisposed(): boolean {
    return this._abort.signal.aborted;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._abort.abort();
    this._wake?.abort();
    Signal.clearData(this);
  }

  private async _loop(): Promise<void> {
    const signal = this._abort.signal;
    let needSnapshot = true;
    while (!signal.aborted) {
      try {
        if (needSnapshot) {
          await this._snapshot(signal);
          needSnapshot = false;
        }
        const sinceWorkers = (this._now() - this._workersAt) / 1000;
        if (sinceWorkers >= WORKERS_REFRESH) {
          await this._refreshWorkers(signal);
        }
        const wait = Math.max(
          1,
          Math.min(EVENT_WAIT, Math.ceil(WORKERS_REFRESH - sinceWorkers))
        );
        const page = await this.api.events(this._state.cursor, wait, signal);
        if (signal.aborted) {
          return;
        }
        if (page.reset) {
          // Events were dropped, or the server restarted (a new epoch in the cursor): the
          // page's cursor is current, so read the lists again and follow on from it.
          await this._lists(signal, page.cursor);
          continue;
        }
        this._setLive();
        const next = applyEvents(this._state, page);
        if (next !== this._state) {
          this._state = next;
          this._changed.emit();
        }
      } catch (error) {
        if (signal.aborted) {
          return;
        }
        needSnapshot = true;
        await this._failed(error, signal);
      }
    }
  }

  private async _snapshot(signal: AbortSignal): Promise<void> {
    const { cursor } = await this.api.eventCursor(signal);
    await this._lists(signal, cursor);
  }

  /**
   * Read the lists and follow on from `cursor`, which was taken before them: events after it
   * are folded on top, and since every event carries the whole object, the result converges
   * to the newest state.
   */
  private async _lists(signal: AbortSignal, cursor: string): Promise<void> {
    const [jobs, workers, sessions] = await Promise.all([
      this.api.jobs(),
      this.api.workers(),
      this.api.sessions()
    ]);
    if (signal.aborted) {
      return;
    }
    this._workersAt = this._now();
    this._state = fromSnapshot(
      jobs.jobs,
      workers.workers,
      cursor,
      sessions.sessions
    );
    this._setLive(true);
  }

  private async _refreshWorkers(signal: AbortSignal): Promise<void> {
    const { workers } = await this.api.workers();
    this._workersAt = this._now();
    if (signal.aborted) {
      return;
    }
    this._state = {
      ...this._state,
      workers: new Map(workers.map(w => [w.id, w]))
    };
    this._changed.emit();
  }

  private _setLive(force = false): void {
    if (!force && this._connection.status === 'live') {
      return;
    }
    this._connection = {
      status: 'live',
      message: '',
      hint: '',
      retryAt: null,
      failures: 0
    };
    this._changed.emit();
  }

  private async _failed(error: unknown, signal: AbortSignal): Promise<void> {
    const failures = this._connection.failures + 1;
    const delay = backoff(failures, this._random()) * 1000;
    const e =
      error instanceof APIError
        ? error
        : new APIError(0, 'unreachable', String(error), '');
    this._connection = {
      status: 'unreachable',
      message: e.message,
      hint: e.hint,
      retryAt: Date.now() + delay,
      failures
    };
    this._changed.emit();
    this._wake = new AbortController();
    const wake = this._wake.signal;
    const both = new AbortController();
    const stop = (): void => both.abort();
    signal.addEventListener('abort', stop);
    wake.addEventListener('abort', stop);
    await this._sleep(delay, both.signal);
    signal.removeEventListener('abort', stop);
    this._wake = null;
  }

  private _state: IPanelState = emptyState();
  private _connection: IConnection = {
    status: 'connecting',
    message: '',
    hint: '',
    retryAt: null,
    failures: 0
  };
  private _changed = new Signal<this, void>(this);
  private _abort = new AbortController();
  private _wake: AbortController | null = null;
  private _running = false;
  private _sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  private _random: () => number;
  private _now: () => number;
  private _workersAt = 0;
}
