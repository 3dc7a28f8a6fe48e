/**
 * The GPUlayer sidebar: a banner when the control plane is unreachable, then Workers
 * (devices and who uses them), Sessions (who holds which GPUs, idle clocks, stop), Queue
 * (scheduling order with each job's explanation) and Jobs (filterable; open logs, cancel,
 * open the submitting notebook).
 */
import { ReactWidget } from '@jupyterlab/apputils';
import * as React from 'react';

import type { IJob, IWorkerInfo } from './api';
import { NOTEBOOK_LABEL } from './api';
import {
  JobStateBadge,
  Progress,
  WorkerStateBadge,
  useNow,
  useSignal
} from './components';
import { formatAttempts, formatCost } from './costs';
import {
  deviceJob,
  formatAge,
  formatDevice,
  formatExit,
  formatJobClock,
  formatPlacement,
  formatRequest,
  shortId,
  workerCommand
} from './format';
import { gpulayerIcon } from './icon';
import { ISessionActions, SessionList } from './sessions';
import type { GPUlayerModel, IConnection } from './model';
import {
  JOB_FILTERS,
  JobFilter,
  cancellable,
  filterCounts,
  jobList,
  queue,
  sessionList,
  workerList
} from './state';

/** What the panel's buttons do; index.ts wires them to JupyterLab commands. */
export interface IPanelActions extends ISessionActions {
  openLogs(jobId: string): void;
  cancel(job: IJob): void;
  openNotebook(path: string): void;
  copy(text: string): void;
}

export const PANEL_ID = 'gpulayer-panel';

/** The sidebar widget. `focusJob` highlights one job (the `gpulayer:show-job` command). */
export class GPUlayerPanel extends ReactWidget {
  constructor(
    readonly model: GPUlayerModel,
    private readonly _actions: IPanelActions
  ) {
    super();
    this.id = PANEL_ID;
    this.addClass('gl-Panel');
    this.title.icon = gpulayerIcon;
    this.title.caption = 'GPUlayer: workers, queue and jobs';
  }

  /** Highlight and scroll to a job (by full id); it shows once the model knows it. */
  focusJob(jobId: string): void {
    this._focus = { id: jobId, token: this._focus.token + 1 };
    this.update();
  }

  protected render(): JSX.Element {
    return (
      <PanelView
        model={this.model}
        actions={this._actions}
        focus={this._focus}
      />
    );
  }

  private _focus: { id: string | null; token: number } = { id: null, token: 0 };
}

function PanelView(props: {
  model: GPUlayerModel;
  actions: IPanelActions;
  focus: { id: string | null; token: number };
}): JSX.Element {
  const { model, actions, focus } = props;
  useSignal(model.changed);
  const clock = React.useCallback(() => model.api.clock.now(), [model]);
  const now = useNow(clock);
  const [filter, setFilter] = React.useState<JobFilter>('all');
  const state = model.state;
  const workers = workerList(state);
  const sessions = sessionList(state);
  const queued = queue(state);
  const focusedJob = focus.id ? state.jobs.get(focus.id) : undefined;
  // A focused job that the filter hides is shown by widening the filter to "all".
  React.useEffect(() => {
    if (focusedJob && focusedJob.state !== 'queued') {
      setFilter('all');
    }
  }, [focus.token, focusedJob?.id]);
  const jobs = jobList(state, filter);
  const counts = filterCounts(state);
  const names = new Map(workers.map(w => [w.id, w.name]));

  return (
    <div className="gl-PanelBody">
      <header className="gl-Header">
        <gpulayerIcon.react tag="span" className="gl-Header-icon" />
        <h2 className="gl-Header-title">GPUlayer</h2>
      </header>
      <Banner connection={model.connection} retry={() => model.retryNow()} />
      <Section title="Workers" count={workers.length} testId="workers">
        {workers.length === 0 ? (
          <EmptyWorkers
            command={workerCommand(
              model.api.url || '<jupyter url>/gpulayer/api/v1'
            )}
            copy={text => actions.copy(text)}
            connecting={model.connection.status !== 'live'}
          />
        ) : (
          <ul className="gl-List">
            {workers.map(w => (
              <WorkerRow key={w.id} worker={w} now={now} jobs={state.jobs} />
            ))}
          </ul>
        )}
      </Section>
      <Section title="Sessions" count={sessions.length} testId="sessions">
        <SessionList sessions={sessions} now={now} actions={actions} />
      </Section>
      <Section title="Queue" count={queued.length} testId="queue">
        {queued.length === 0 ? (
          <p className="gl-Empty">No job is waiting.</p>
        ) : (
          <ol className="gl-List">
            {queued.map(j => (
              <QueueRow
                key={j.id}
                job={j}
                now={now}
                names={names}
                actions={actions}
                focused={focus.id === j.id}
                focusToken={focus.token}
              />
            ))}
          </ol>
        )}
      </Section>
      <Section title="Jobs" count={counts.all} testId="jobs">
        <div
          className="gl-Filters"
          role="group"
          aria-label="Filter jobs by state"
        >
          {JOB_FILTERS.map(f => (
            <button
              key={f}
              className={`gl-Filter${filter === f ? ' gl-mod-selected' : ''}`}
              aria-pressed={filter === f}
              data-filter={f}
              onClick={() => setFilter(f)}
            >
              {f} <span className="gl-Filter-count">{counts[f]}</span>
            </button>
          ))}
        </div>
        {jobs.length === 0 ? (
          <p className="gl-Empty">
            {filter === 'all'
              ? 'No jobs yet. Run a cell with %%gpulayer, or `gpulayer run -- CMD`.'
              : `No ${filter} jobs.`}
          </p>
        ) : (
          <ul className="gl-List">
            {jobs.map(j => (
              <JobRow
                key={j.id}
                job={j}
                now={now}
                actions={actions}
                focused={focus.id === j.id}
                focusToken={focus.token}
              />
            ))}
          </ul>
        )}
      </Section>
    </div>
  );
}

function Banner(props: {
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

function Section(props: {
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

function EmptyWorkers(props: {
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

function WorkerRow(props: {
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
            const job = jobId ? jobs.get(jobId) : undefined;
            return (
              <li
                key={d.index}
                className={`gl-Device${jobId ? ' gl-mod-busy' : ''}`}
                data-device={d.index}
              >
                <span className="gl-Device-name">{formatDevice(d)}</span>
                <span className="gl-Device-use">
                  {jobId
                    ? `in use by ${job ? job.spec.name : 'job'} ${shortId(jobId)}`
                    : 'free'}
                </span>
              </li>
            );
          })}
        </ul>
      )}
    </li>
  );
}

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

function QueueRow(props: {
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

function JobRow(props: {
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
