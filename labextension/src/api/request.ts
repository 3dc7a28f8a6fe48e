/**
 * The panel's requester: `requester.ts` over JupyterLab's `ServerConnection`, which carries
 * the Jupyter token/cookie and XSRF header.
 */
import { ServerConnection } from '@jupyterlab/services';

import { ServerClock } from './clock';
import { Requester, requester } from './requester';

export { API_PATH } from './requester';
export type { IRequestOptions, Requester } from './requester';

/** The requester that goes through JupyterLab's ServerConnection (token + XSRF). */
export function makeRequester(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  clock: ServerClock = new ServerClock()
): Requester {
  return requester(
    {
      baseUrl: settings.baseUrl,
      send: (url, init) => ServerConnection.makeRequest(url, init, settings)
    },
    clock
  );
}
