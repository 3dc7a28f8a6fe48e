/**
 * The Workers section's rows: each worker with its state, heartbeat, marks, and every device
 * with who uses it; or, with no worker yet, the command that starts one.
 */
import * as React from 'react';

import type { IJob, IWorkerInfo } from '../api';
import { deviceJob, formatAge, formatDevice, formatDeviceUse } from '../model';
import { WorkerStateBadge } from './components';

export function EmptyWorkers(props: {
  command: string;
  copy: (text: string) => void;
  connecting: boolean;
}): JSX.Element {
  if (props.connecting) {
    return <p className="gl-Empty">Waiting for the control plane…</p>;
  }
  return (
    <div className="gl-Empty">
      <p>No workers yet — start one with:</p>
      <div className="gl-Command">
        <code>{props.command}</code>
        <button
          className="gl-Button"
          onClick={() => props.copy(props.command)}
          title="Copy the command"
          aria-label="Copy the worker command"
        >
          Copy
        </button>
      </div>
      <p className="gl-Hint">
        Make the join token in a terminal of this JupyterLab:{' '}
        <code>gpulayer token create --kind join --ttl 1h</code>. Plain HTTP is
        refused off this machine: serve Jupyter over HTTPS for remote workers.
      </p>
    </div>
  );
}

export function WorkerRow(props: {
  worker: IWorkerInfo;
  now: number;
  jobs: ReadonlyMap<string, IJob>;
}): JSX.Element {
  const { worker: w, now, jobs } = props;
  const devices = w.capabilities.devices;
  return (
    <li
      className={`gl-Row gl-Worker${w.live ? '' : ' gl-mod-gone'}`}
      data-worker={w.name}
    >
      <div className="gl-Row-head">
        <span className="gl-Row-name">{w.name}</span>
        <WorkerStateBadge state={w.state} />
        {w.capabilities.simulated && <span className="gl-Tag">simulated</span>}
      </div>
      <div className="gl-Row-meta">
        heartbeat {formatAge(w.last_heartbeat, now)} · {w.capabilities.runtime}
        {w.transport === 'inprocess' ? ' · in this server' : ''}
      </div>
      {w.unschedulable && (
        <div className="gl-Row-meta gl-Reason" data-mark="unschedulable">
          unschedulable: {w.unschedulable}
        </div>
      )}
      {w.suspect && (
        <div className="gl-Row-meta gl-Reason" data-mark="suspect">
          suspect: {w.suspect}
        </div>
      )}
      {devices.length === 0 ? (
        <div className="gl-Row-meta">no GPU (CPU jobs only)</div>
      ) : (
        <ul className="gl-Devices">
          {devices.map(d => {
            const jobId = deviceJob(w, d.index);
            return (
              <li
                key={d.index}
                className={`gl-Device${jobId ? ' gl-mod-busy' : ''}`}
                data-device={d.index}
              >
                <span className="gl-Device-name">{formatDevice(d)}</span>
                <span className="gl-Device-use">
                  {formatDeviceUse(jobId, jobs)}
                </span>
              </li>
            );
          })}
        </ul>
      )}
    </li>
  );
}
