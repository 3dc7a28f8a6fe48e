/**
 * The Queue and Jobs sections' rows: a queued job with its place and the scheduler's
 * sentence, a placed or finished job with where it ran, its clock, cost and progress, and
 * the buttons both share (also under a log view).
 */
import * as React from 'react';

import type { IJob } from '../api';
import { NOTEBOOK_LABEL } from '../api';
import {
  cancellable,
  formatAttempts,
  formatCost,
  formatExit,
  formatJobClock,
  formatPlacement,
  formatRequest,
  shortId
} from '../model';
import type { IPanelActions } from './actions';
import { JobStateBadge, Progress } from './components';

/** Scroll a focused row into view and move keyboard focus to it, once per request. */
function useFocusRow(
  ref: React.RefObject<HTMLLIElement>,
  focused: boolean,
  token: number
): void {
  React.useEffect(() => {
    if (focused && ref.current) {
      ref.current.scrollIntoView({ block: 'nearest' });
      ref.current.focus();
    }
  }, [focused, token]);
}

export function QueueRow(props: {
  job: IJob;
  now: number;
  names: Map<string, string>;
  actions: IPanelActions;
  focused: boolean;
  focusToken: number;
}): JSX.Element {
  const { job, now, names, actions } = props;
  const ref = React.useRef<HTMLLIElement>(null);
  useFocusRow(ref, props.focused, props.focusToken);
  const p = job.pending;
  const reservation = p?.reservation.map(id => names.get(id) ?? id) ?? [];
  return (
    <li
      ref={ref}
      tabIndex={-1}
      className={`gl-Row gl-Job${props.focused ? ' gl-mod-focused' : ''}`}
      data-job={job.id}
      data-state={job.state}
    >
      <div className="gl-Row-head">
        <span className="gl-Position" title="position in the queue">
          {p?.position ? `#${p.position}` : '–'}
        </span>
        <button
          className="gl-Row-name gl-Link"
          onClick={() => actions.openLogs(job.id)}
          title="Open the job's logs"
        >
          {job.spec.name}
        </button>
        <span className="gl-Id">{shortId(job.id)}</span>
        <JobStateBadge state={job.state} />
      </div>
      <div className="gl-Row-meta">
        {formatRequest(job)} · {formatJobClock(job, now)}
      </div>
      <p className="gl-Sentence" data-testid="pending-sentence">
        {p?.sentence || 'Waiting for the next scheduling pass.'}
      </p>
      {reservation.length > 0 && (
        <div className="gl-Row-meta gl-Reservation">
          holds a reservation on {reservation.join(', ')}
        </div>
      )}
      {p?.reserved_by && (
        <div className="gl-Row-meta gl-Reservation">
          waits behind the reservation of job {shortId(p.reserved_by)}
        </div>
      )}
      <JobActions job={job} actions={actions} />
    </li>
  );
}

export function JobRow(props: {
  job: IJob;
  now: number;
  actions: IPanelActions;
  focused: boolean;
  focusToken: number;
}): JSX.Element {
  const { job, now, actions } = props;
  const ref = React.useRef<HTMLLIElement>(null);
  useFocusRow(ref, props.focused, props.focusToken);
  const placement = formatPlacement(job);
  const exit = formatExit(job);
  const cost = formatCost(job);
  return (
    <li
      ref={ref}
      tabIndex={-1}
      className={`gl-Row gl-Job${props.focused ? ' gl-mod-focused' : ''}`}
      data-job={job.id}
      data-state={job.state}
    >
      <div className="gl-Row-head">
        <button
          className="gl-Row-name gl-Link"
          onClick={() => actions.openLogs(job.id)}
          title="Open the job's logs"
        >
          {job.spec.name}
        </button>
        <span className="gl-Id">{shortId(job.id)}</span>
        {cost && (
          <span className="gl-Cost" data-cost title={formatAttempts(job)}>
            {cost}
          </span>
        )}
        <JobStateBadge state={job.state} cancelling={job.cancel_requested} />
      </div>
      <div className="gl-Row-meta">
        {[placement, formatJobClock(job, now), exit]
          .filter(Boolean)
          .join(' · ')}
      </div>
      {job.reason && job.state !== 'succeeded' && (
        <div className="gl-Row-meta gl-Reason">{job.reason}</div>
      )}
      <Progress job={job} />
      <JobActions job={job} actions={actions} />
    </li>
  );
}

export function JobActions(props: {
  job: IJob;
  actions: IPanelActions;
  showLogs?: boolean;
}): JSX.Element {
  const { job, actions } = props;
  const notebook = job.spec.labels[NOTEBOOK_LABEL];
  return (
    <div className="gl-Actions">
      {props.showLogs !== false && (
        <button
          className="gl-Button"
          onClick={() => actions.openLogs(job.id)}
          aria-label={`Logs of job ${job.spec.name}`}
        >
          Logs
        </button>
      )}
      {notebook && (
        <button
          className="gl-Button"
          onClick={() => actions.openNotebook(notebook)}
          title={notebook}
          aria-label={`Open notebook ${notebook}`}
        >
          Notebook
        </button>
      )}
      {cancellable(job) && (
        <button
          className="gl-Button gl-mod-danger"
          onClick={() => actions.cancel(job)}
          aria-label={`Cancel job ${job.spec.name}`}
        >
          Cancel
        </button>
      )}
    </div>
  );
}
