/**
 * The GPUlayer HTTP API as the panel sees it: typed contracts (the subset of
 * `gpulayer_kernel/contracts/` it reads) and one request function.
 *
 * Every request goes through JupyterLab's `ServerConnection`, so it carries the
 * Jupyter token/cookie and XSRF header; no GPUlayer token ever reaches the page.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** Where the server extension mounts the API, relative to the Jupyter base URL. */
export const API_PATH = 'gpulayer/api/v1';

export type JobState =
  | 'queued'
  | 'placed'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'lost';

export const JOB_STATES: readonly JobState[] = [
  'queued',
  'placed',
  'running',
  'succeeded',
  'failed',
  'cancelled',
  'lost'
];

export const TERMINAL_STATES: ReadonlySet<JobState> = new Set<JobState>([
  'succeeded',
  'failed',
  'cancelled',
  'lost'
]);

export type WorkerState =
  'ready' | 'busy' | 'draining' | 'cordoned' | 'lost' | 'offline';

export type JSONValue =
  null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

export interface IDevice {
  index: number;
  vendor: string;
  name: string;
  kind: string;
  memory_bytes: number;
}

export interface IWorkerInfo {
  id: string;
  name: string;
  state: WorkerState;
  labels: Record<string, string>;
  capabilities: {
    devices: IDevice[];
    simulated: boolean;
    runtime: string;
    host: { hostname: string; cpus: number };
  };
  transport: 'inprocess' | 'http';
  registered_at: number;
  last_heartbeat: number;
  running: string[];
  /** Device index (as a JSON object key) to the id of the job using it. */
  device_jobs: Record<string, string>;
}

export interface INodePlacement {
  worker_id: string;
  worker_name: string;
  devices: number[];
  simulated: boolean;
  node_rank: number;
  cpu_fallback: boolean;
}

export interface IPlacementReport {
  job_id: string;
  workers_total: number;
  workers_feasible: number;
  reserved_by: string | null;
  reservation: string[];
  position: number | null;
  sentence: string;
  candidates: string[];
}

export interface IJobSpec {
  name: string;
  workload: {
    kind: 'command' | 'python';
    argv?: string[];
    entrypoint?: string;
  };
  resources: { gpus: number; nodes: number; gpu_kind: string[] };
  labels: Record<string, string>;
  priority: number;
  timeout: number | null;
}

export interface IJob {
  id: string;
  seq: number;
  spec: IJobSpec;
  state: JobState;
  attempts: number;
  placement: { nodes: INodePlacement[]; explanation: string } | null;
  pending: IPlacementReport | null;
  submitted_at: number;
  placed_at: number | null;
  started_at: number | null;
  finished_at: number | null;
  exit_code: number | null;
  reason: string | null;
  progress: Record<string, JSONValue> | null;
  cancel_requested: boolean;
}

export interface IEvent {
  seq: number;
  time: number;
  kind: 'job' | 'worker';
  job: IJob | null;
  worker: IWorkerInfo | null;
}

export interface IEventPage {
  events: IEvent[];
  next_since: number;
  reset: boolean;
}

export interface ILogRecord {
  seq: number;
  time: number;
  stream: 'stdout' | 'stderr' | 'system';
  rank: number | null;
  text: string;
}

export interface ILogPage {
  job_id: string;
  records: ILogRecord[];
  next_since: number;
  state: JobState;
}

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

  jobs(limit = 200): Promise<{ jobs: IJob[] }> {
    return this.request(`jobs?limit=${limit}`);
  }

  job(id: string): Promise<IJob> {
    return this.request(`jobs/${encodeURIComponent(id)}`);
  }

  events(
    since: number,
    wait: number,
    signal?: AbortSignal
  ): Promise<IEventPage> {
    return this.request(`events?since=${since}&wait=${wait}`, { signal });
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
}
