/**
 * The GPUlayer HTTP API as the panel sees it: the calls it makes, over one request function,
 * typed by the contracts generated from the Python ones (`contracts.generated.ts`).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ServerClock } from './clock';
import type {
  IEventCursor,
  IEventPage,
  IJob,
  IJobList,
  ILogPage,
  ISessionInfo,
  ISessionList,
  IWorkerInfo
} from './contracts';
import { API_PATH, Requester, makeRequester } from './request';

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
