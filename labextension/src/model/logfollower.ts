/**
 * Follows one job's log for a log view: pages through `GET jobs/{id}/logs?since=&wait=` (a
 * long-poll that answers the moment a line is written) into a bounded buffer, until the job
 * has finished and every line is in; retries with backoff, and gives up only on a 404.
 *
 * The model side of `logview.tsx`, which only renders what this holds.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { APIError, GPUlayerAPI, IJob, TERMINAL_STATES } from '../api';
import { ILogBuffer, appendLog, emptyLog } from './logbuffer';
import { abortableSleep, backoff } from './retry';

/** Lines per request while catching up (the API's own cap is 5000). */
export const LOG_PAGE = 2000;
/** Long-poll wait (s) while the job can still write. */
export const LOG_WAIT = 25;

/** Where a follower is: the log view's status line says it in words. */
export type LogStatus =
  'loading' | 'following' | 'complete' | 'retrying' | 'missing';

/** Anything the follower needs from the outside world, so tests can fake it. */
export interface ILogFollowerOptions {
  /** Records kept (the oldest are dropped past it). */
  max?: number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  random?: () => number;
}

/** Follows one job's log until the job has finished and every line is in. */
export class LogFollower {
  constructor(
    private readonly _api: GPUlayerAPI,
    readonly jobId: string,
    options: ILogFollowerOptions = {}
  ) {
    this._max = options.max ?? 20000;
    this._sleep = options.sleep ?? abortableSleep;
    this._random = options.random ?? Math.random;
  }

  get buffer(): ILogBuffer {
    return this._buffer;
  }

  /** The job as the last log page or fetch saw it (the model's copy is usually fresher). */
  get job(): IJob | null {
    return this._job;
  }

  get status(): LogStatus {
    return this._status;
  }

  get error(): string {
    return this._error;
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Start following (idempotent). Runs until the log is complete or `dispose`. */
  start(): void {
    if (!this._started) {
      this._started = true;
      void this._loop();
    }
  }

  get isDisposed(): boolean {
    return this._abort.signal.aborted;
  }

  dispose(): void {
    this._abort.abort();
    Signal.clearData(this);
  }

  private async _loop(): Promise<void> {
    const signal = this._abort.signal;
    let failures = 0;
    while (!signal.aborted) {
      try {
        if (!this._job) {
          this._job = await this._api.job(this.jobId);
        }
        // A finished job writes no more: read what is left without waiting.
        const finished = TERMINAL_STATES.has(this._job.state);
        const page = await this._api.logs(
          this.jobId,
          this._buffer.next,
          finished ? 0 : LOG_WAIT,
          LOG_PAGE,
          signal
        );
        failures = 0;
        this._buffer = appendLog(
          this._buffer,
          page.records,
          page.next_since,
          this._max
        );
        if (page.state !== this._job.state) {
          this._job = await this._api.job(this.jobId);
        }
        // Complete once a finished job's page comes back empty: every line is in.
        const done =
          TERMINAL_STATES.has(page.state) && page.records.length === 0;
        this._status = done ? 'complete' : 'following';
        this._error = '';
        this._changed.emit();
        if (done) {
          return;
        }
      } catch (error) {
        if (signal.aborted) {
          return;
        }
        if (error instanceof APIError && error.status === 404) {
          this._status = 'missing';
          this._error = error.message;
          this._changed.emit();
          return;
        }
        failures += 1;
        this._status = 'retrying';
        this._error = error instanceof Error ? error.message : String(error);
        this._changed.emit();
        await this._sleep(backoff(failures, this._random()) * 1000, signal);
      }
    }
  }

  private readonly _max: number;
  private readonly _sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  private readonly _random: () => number;
  private _buffer: ILogBuffer = emptyLog();
  private _job: IJob | null = null;
  private _status: LogStatus = 'loading';
  private _error = '';
  private _started = false;
  private _abort = new AbortController();
  private _changed = new Signal<this, void>(this);
}
