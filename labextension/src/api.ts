/**
 * The GPUlayer HTTP API as the panel sees it: the calls it makes, over one request function,
 * typed by the contracts generated from the Python ones (`contracts.generated.ts`).
 *
 * Every request goes through JupyterLab's `ServerConnection`, so it carries the
 * Jupyter token/cookie and XSRF header; no GPUlayer token ever reaches the page.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type {
  IEventCursor,
  IEventPage,
  IJob,
  IJobList,
  ILogPage,
  ISessionInfo,
  ISessionList,
  IWorkerInfo,
  JobState
} from './contracts.generated';

// The contracts, generated from `gpulayer_kernel/contracts/schema.json` (see that file's
// header); only the request code below is written by hand.
export type {
  IDevice,
  IEvent,
  IEventCursor,
  IEventPage,
  IJob,
  IJobList,
  IJobSpec,
  ILogPage,
  ILogRecord,
  INodePlacement,
  IPlacementReport,
  ISessionInfo,
  ISessionList,
  IWorkerInfo,
  JobState,
  JsonValue,
  WorkerState
} from './contracts.generated';

/** Where the server extension mounts the API, relative to the Jupyter base URL. */
export const API_PATH = 'gpulayer/api/v1';

/**
 * Whether each job state is final. A record, not a list, so a state added to the contracts
 * fails `tsc` here until someone says whether it is final (the job table's rule in Python).
 */
const FINAL: Readonly<Record<JobState, boolean>> = {
  queued: false,
  placed: false,
  running: false,
  succeeded: true,
  failed: true,
  cancelled: true,
  lost: true
};

export const TERMINAL_STATES: ReadonlySet<JobState> = new Set(
  (Object.keys(FINAL) as JobState[]).filter(state => FINAL[state])
);

/** The label the `%%gpulayer` magic puts on a job: the notebook that submitted it. */
export const NOTEBOOK_LABEL = 'gpulayer.io/notebook';

/** An answer from the API that was not a success; `status` 0 means "no answer at all". */
export class APIError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly hint: string = ''
  ) {
    super(message);
    this.name = 'APIError';
  }

  /** The server (or the control plane in it) could not be reached or is not serving. */
  get unreachable(): boolean {
    return this.status === 0 || this.status === 502 || this.status === 503;
  }
}

/** Options for one request; `signal` aborts a long-poll when its view goes away. */
export interface IRequestOptions {
  method?: 'GET' | 'POST';
  body?: unknown;
  signal?: AbortSignal;
}

/** A function that performs API requests: real (`makeRequester`) or a fake in tests. */
export type Requester = <T>(
  path: string,
  options?: IRequestOptions
) => Promise<T>;

/**
 * The server's clock as seen from the page, from each answer's `Date` header. Ages and
 * elapsed times compare server timestamps, so a browser whose clock is off (a remote
 * JupyterHub) would show nonsense without it. `Date` has 1 s resolution: smaller
 * differences are ignored.
 */
export class ServerClock {
  /** Seconds to add to the browser's clock to get the server's. */
  offset = 0;

  observe(dateHeader: string | null, localMs: number = Date.now()): void {
    if (!dateHeader) {
      return;
    }
    const serverMs = Date.parse(dateHeader);
    if (Number.isNaN(serverMs)) {
      return;
    }
    const offset = (serverMs - localMs) / 1000;
    this.offset = Math.abs(offset) > 1.5 ? offset : 0;
  }

  /** Now, in server seconds since the epoch (what every `*_at` field uses). */
  now(localMs: number = Date.now()): number {
    return localMs / 1000 + this.offset;
  }
}

/** The requester that goes through JupyterLab's ServerConnection (token + XSRF). */
export function makeRequester(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  clock: ServerClock = new ServerClock()
): Requester {
  return async <T>(path: string, options: IRequestOptions = {}): Promise<T> => {
    const url = URLExt.join(settings.baseUrl, API_PATH, path);
    const init: RequestInit = { method: options.method ?? 'GET' };
    if (options.signal) {
      init.signal = options.signal;
    }
    if (options.body !== undefined) {
      init.body = JSON.stringify(options.body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      response = await ServerConnection.makeRequest(url, init, settings);
    } catch (error) {
      if (options.signal?.aborted) {
        throw error;
      }
      throw new APIError(
        0,
        'unreachable',
        'the Jupyter server does not answer',
        'it may have stopped or restarted; the panel keeps retrying'
      );
    }
    clock.observe(response.headers.get('Date'));
    const text = await response.text();
    let data: unknown = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!response.ok) {
      throw errorFromAnswer(response.status, data, text);
    }
    return data as T;
  };
}

/** Turn an error answer (`{"code", "message", "hint"}` or anything else) into an APIError. */
export function errorFromAnswer(
  status: number,
  data: unknown,
  text: string
): APIError {
  if (data && typeof data === 'object') {
    const d = data as Record<string, unknown>;
    if (typeof d.message === 'string') {
      return new APIError(
        status,
        typeof d.code === 'string' ? d.code : `http_${status}`,
        d.message,
        typeof d.hint === 'string' ? d.hint : ''
      );
    }
  }
  if (status === 404) {
    return new APIError(
      status,
      'not_installed',
      'the GPUlayer server extension is not enabled in this Jupyter server',
      'run `jupyter server extension enable gpulayer_kernel.jupyter` and restart it'
    );
  }
  const snippet = text
    .replace(/<[^>]*>/g, ' ')
    .trim()
    .slice(0, 200);
  return new APIError(
    status,
    `http_${status}`,
    snippet || `HTTP ${status}`,
    ''
  );
}

/** The calls the panel makes, over one requester. */
export class GPUlayerAPI {
  /**
   * @param request performs the requests.
   * @param clock the server's clock, fed by the requester.
   * @param url the API's absolute URL (what a remote worker joins), for display only.
   */
  constructor(
    readonly request: Requester,
    readonly clock: ServerClock = new ServerClock(),
    readonly url: string = ''
  ) {}

  /** The API of the Jupyter server this page talks to. */
  static forServer(
    settings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ): GPUlayerAPI {
    const clock = new ServerClock();
    const url = URLExt.join(settings.baseUrl, API_PATH);
    return new GPUlayerAPI(makeRequester(settings, clock), clock, url);
  }

  workers(): Promise<{ workers: IWorkerInfo[] }> {
    return this.request('workers');
  }

  jobs(limit = 200): Promise<IJobList> {
    return this.request(`jobs?limit=${limit}`);
  }

  job(id: string): Promise<IJob> {
    return this.request(`jobs/${encodeURIComponent(id)}`);
  }

  /** The event log's current position: follow from it to see only what happens next. */
  eventCursor(signal?: AbortSignal): Promise<IEventCursor> {
    return this.request('events/cursor', { signal });
  }

  /** Events after `cursor`, waiting up to `wait` s for the first; the page's `cursor` is next. */
  events(
    cursor: string,
    wait: number,
    signal?: AbortSignal
  ): Promise<IEventPage> {
    const q = `cursor=${encodeURIComponent(cursor)}&wait=${wait}`;
    return this.request(`events?${q}`, { signal });
  }

  logs(
    id: string,
    since: number,
    wait: number,
    limit: number,
    signal?: AbortSignal
  ): Promise<ILogPage> {
    const q = `since=${since}&wait=${wait}&limit=${limit}`;
    return this.request(`jobs/${encodeURIComponent(id)}/logs?${q}`, { signal });
  }

  cancel(id: string): Promise<IJob> {
    return this.request(`jobs/${encodeURIComponent(id)}/cancel`, {
      method: 'POST'
    });
  }
  /** Live sessions (ADR 0019): jobs that hold their GPUs and keep state across cells. */
  sessions(): Promise<ISessionList> {
    return this.request('sessions');
  }

  /** End a session: its job is cancelled and its GPUs freed. */
  stopSession(id: string): Promise<ISessionInfo> {
    const reason = encodeURIComponent('stopped from the GPUlayer panel');
    return this.request(
      `sessions/${encodeURIComponent(id)}/stop?reason=${reason}`,
      {
        method: 'POST'
      }
    );
  }

  /** KeyboardInterrupt in the session's running cell, on every rank (it keeps its state). */
  interruptSession(id: string): Promise<ISessionInfo> {
    return this.request(`sessions/${encodeURIComponent(id)}/interrupt`, {
      method: 'POST'
    });
  }
}
