/**
 * The cell widget's transport: the Jupyter server that served the page, found in the page's
 * own configuration (`#jupyter-config-data`), with its XSRF cookie and token. An anywidget
 * gets no JupyterLab services, so this is what `ServerConnection` does for the panel.
 */
import type { ITransport } from '../api/requester';

interface IPageConfig {
  baseUrl?: unknown;
  token?: unknown;
}

function pageConfig(): IPageConfig | null {
  const el = document.getElementById('jupyter-config-data');
  if (!el) {
    return null;
  }
  try {
    return JSON.parse(el.textContent || '{}') as IPageConfig;
  } catch {
    return null;
  }
}

function cookie(name: string): string {
  const m = document.cookie.match('\\b' + name + '=([^;]*)\\b');
  return m?.[1] ?? '';
}

/** The page's Jupyter server; null where there is none (VS Code, a static page). */
export function pageTransport(): ITransport | null {
  const config = pageConfig();
  if (!config || typeof config.baseUrl !== 'string') {
    return null;
  }
  const token = typeof config.token === 'string' ? config.token : '';
  return {
    baseUrl: config.baseUrl,
    send: (url, init) => {
      const headers = new Headers(init.headers);
      headers.set('X-XSRFToken', cookie('_xsrf'));
      if (token) {
        headers.set('Authorization', `token ${token}`);
      }
      return fetch(url, { ...init, headers, credentials: 'same-origin' });
    }
  };
}
