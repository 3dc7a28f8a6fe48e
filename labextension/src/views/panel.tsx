/**
 * The GPUlayer sidebar: a banner when the control plane is unreachable, then Workers
 * (devices and who uses them), Sessions (who holds which GPUs, idle clocks, stop), Queue
 * (scheduling order with each job's explanation) and Jobs (filterable; open logs, cancel,
 * open the submitting notebook).
 */
import { ReactWidget } from '@jupyterlab/apputils';
import * as React from 'react';

import {
  JOB_FILTERS,
  JobFilter,
  filterCounts,
  jobList,
  queue,
  sessionList,
  workerList,
  workerCommand
} from '../model';
import type { GPUlayerModel } from '../model';
import type { IPanelActions } from './actions';
import { Banner } from './banner';
import { Section, useNow, useSignal } from './components';
import { gpulayerIcon } from './icon';
import { JobRow, QueueRow } from './jobs';
import { SessionList } from './sessions';
import { EmptyWorkers, WorkerRow } from './workers';

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
