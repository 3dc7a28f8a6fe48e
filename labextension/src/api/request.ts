/**
 * One request function for every call. The real one goes through JupyterLab's
 * `ServerConnection`, so it carries the Jupyter token/cookie and XSRF header; no GPUlayer
 * token ever reaches the page. Tests pass a fake.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ServerClock } from './clock';
import { APIError, errorFromAnswer } from './errors';

/** Where the server extension mounts the API, relative to the Jupyter base URL. */
export const API_PATH = 'gpulayer/api/v1';

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
