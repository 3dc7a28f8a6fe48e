/**
 * One request function for every call to GPUlayer's API, over a transport: the panel's goes
 * through JupyterLab's `ServerConnection` (`request.ts`), the cell widget's through the page's
 * own configuration (`widget/page.ts`). Either way the Jupyter token/cookie and XSRF header
 * travel, and no GPUlayer token ever reaches the page. Nothing here imports JupyterLab, so the
 * widget's bundle stays small. Tests pass a fake requester.
 */
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

/** A function that performs API requests: real (`requester`) or a fake in tests. */
export type Requester = <T>(
  path: string,
  options?: IRequestOptions
) => Promise<T>;

/** How a request reaches the Jupyter server that served the page. */
export interface ITransport {
  /** The Jupyter server's base URL, ending in `/`. */
  readonly baseUrl: string;
  /** Sends one request with the page's credentials; rejects when there is no answer. */
  send(url: string, init: RequestInit): Promise<Response>;
}

/** `base` and `path` joined by exactly one `/`. */
export function joinUrl(base: string, path: string): string {
  return `${base.replace(/\/+$/, '')}/${path.replace(/^\/+/, '')}`;
}

/** The requester over `transport`: JSON in and out, errors as `APIError`. */
export function requester(
  transport: ITransport,
  clock: ServerClock = new ServerClock()
): Requester {
  return async <T>(path: string, options: IRequestOptions = {}): Promise<T> => {
    const url = joinUrl(joinUrl(transport.baseUrl, API_PATH), path);
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
      response = await transport.send(url, init);
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
