/**
 * Small React pieces shared by the sidebar panel and the log view: state badges,
 * progress bars, collapsible sections, a ticking clock, and a hook that re-renders on a Lumino signal.
 */
import type { ISignal } from '@lumino/signaling';
import * as React from 'react';

import type { IJob, JobState, WorkerState } from '../api';
import { TERMINAL_STATES } from '../api';
import { formatProgress, stateTone } from '../model';

/** Re-render whenever `signal` fires (the model's `changed`). */
export function useSignal<T>(signal: ISignal<T, void>): void {
  const [, setTick] = React.useState(0);
  React.useEffect(() => {
    const bump = (): void => setTick(t => t + 1);
    signal.connect(bump);
    return () => {
      signal.disconnect(bump);
    };
  }, [signal]);
}

/**
 * The current time (server seconds), re-read every `ms`. This ticks the displayed ages
 * and elapsed times only; it never talks to the server.
 */
export function useNow(now: () => number, ms = 1000): number {
  const [value, setValue] = React.useState(now);
  React.useEffect(() => {
    const timer = setInterval(() => setValue(now()), ms);
    return () => clearInterval(timer);
  }, [now, ms]);
  return value;
}

export function JobStateBadge(props: {
  state: JobState;
  cancelling?: boolean;
}): JSX.Element {
  // "cancelling" only while the worker is still stopping it.
  const label =
    props.cancelling && !TERMINAL_STATES.has(props.state)
      ? `${props.state} · cancelling`
      : props.state;
  return (
    <span
      className={`gl-Badge gl-mod-${stateTone(props.state)}`}
      data-state={props.state}
    >
      {label}
    </span>
  );
}

const WORKER_TONE: Record<WorkerState, string> = {
  ready: 'ok',
  busy: 'live',
  draining: 'idle',
  cordoned: 'idle',
  lost: 'bad',
  offline: 'idle'
};

export function WorkerStateBadge(props: { state: WorkerState }): JSX.Element {
  return (
    <span
      className={`gl-Badge gl-mod-${WORKER_TONE[props.state]}`}
      data-state={props.state}
    >
      {props.state}
    </span>
  );
}

export function Progress(props: { job: IJob }): JSX.Element | null {
  const { fraction, text } = formatProgress(props.job.progress);
  if (!text) {
    return null;
  }
  return (
    <div className="gl-Progress">
      {fraction !== null && (
        <div
          className="gl-Progress-bar"
          role="progressbar"
          aria-valuemin={0}
          aria-valuemax={100}
          aria-valuenow={Math.round(fraction * 100)}
        >
          <div
            className="gl-Progress-fill"
            style={{ width: `${(fraction * 100).toFixed(1)}%` }}
          />
        </div>
      )}
      <span className="gl-Progress-text">{text}</span>
    </div>
  );
}

/** A collapsible section of the panel, open at first; `testId` names it for tests. */
export function Section(props: {
  title: string;
  count: number;
  testId: string;
  children: React.ReactNode;
}): JSX.Element {
  const [open, setOpen] = React.useState(true);
  const bodyId = `gl-section-${props.testId}`;
  return (
    <section className="gl-Section" data-section={props.testId}>
      <h3 className="gl-Section-header">
        <button
          className="gl-Section-toggle"
          aria-expanded={open}
          aria-controls={bodyId}
          onClick={() => setOpen(!open)}
        >
          <span
            className={`gl-Caret${open ? ' gl-mod-open' : ''}`}
            aria-hidden
          />
          {props.title}
          <span className="gl-Section-count">{props.count}</span>
        </button>
      </h3>
      {open && (
        <div className="gl-Section-body" id={bodyId}>
          {props.children}
        </div>
      )}
    </section>
  );
}
