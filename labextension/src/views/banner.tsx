/** The banner at the top of the panel while the control plane cannot be reached. */
import * as React from 'react';

import type { IConnection } from '../model';

/** Nothing while live; "connecting…"; or why it is unreachable, with a retry countdown. */
export function Banner(props: {
  connection: IConnection;
  retry: () => void;
}): JSX.Element | null {
  const c = props.connection;
  const [, tick] = React.useState(0);
  React.useEffect(() => {
    if (c.status !== 'unreachable') {
      return;
    }
    const timer = setInterval(() => tick(t => t + 1), 500);
    return () => clearInterval(timer);
  }, [c.status, c.retryAt]);
  if (c.status === 'live') {
    return null;
  }
  if (c.status === 'connecting') {
    return (
      <div className="gl-Banner gl-mod-info" role="status">
        Connecting to the GPUlayer control plane…
      </div>
    );
  }
  const wait = c.retryAt
    ? Math.max(0, Math.ceil((c.retryAt - Date.now()) / 1000))
    : 0;
  return (
    <div className="gl-Banner gl-mod-error" role="alert" data-testid="banner">
      <div className="gl-Banner-title">GPUlayer control plane unreachable</div>
      <div className="gl-Banner-message">{c.message}</div>
      {c.hint && <div className="gl-Banner-hint">{c.hint}</div>}
      <div className="gl-Banner-retry">
        {wait > 0 ? `Retrying in ${wait}s` : 'Retrying…'}
        <button className="gl-Button" onClick={props.retry}>
          Retry now
        </button>
      </div>
    </div>
  );
}
