/**
 * A job's log view (a main-area tab): the job's header (state, placement, progress, cancel)
 * and its log, live. It renders what a `LogFollower` (model/logfollower.ts) holds; the view
 * follows the tail while it is scrolled to the bottom and stays put while the user reads
 * older lines.
 */
import { ReactWidget } from '@jupyterlab/apputils';
import * as React from 'react';

import type { IJob, ILogRecord } from '../api';
import {
  LogFollower,
  formatExit,
  formatJobClock,
  formatPlacement,
  formatRequest,
  logRanks,
  logStatusText,
  rankPrefix,
  shortId,
  visibleText
} from '../model';
import type { GPUlayerModel } from '../model';
import type { IPanelActions } from './actions';
import { JobStateBadge, Progress, useNow, useSignal } from './components';
import { JobActions } from './jobs';

/** The tab's content: one job's header and live log. */
export class LogView extends ReactWidget {
  constructor(
    readonly model: GPUlayerModel,
    readonly jobId: string,
    private readonly _actions: IPanelActions & { showInPanel(id: string): void }
  ) {
    super();
    this.addClass('gl-LogView');
    this.follower = new LogFollower(model.api, jobId);
    this.follower.start();
  }

  readonly follower: LogFollower;

  override dispose(): void {
    this.follower.dispose();
    super.dispose();
  }

  protected render(): JSX.Element {
    return (
      <LogViewBody
        model={this.model}
        follower={this.follower}
        actions={this._actions}
      />
    );
  }
}

type StreamFilter = 'all' | 'stdout' | 'stderr' | 'system';

function LogViewBody(props: {
  model: GPUlayerModel;
  follower: LogFollower;
  actions: IPanelActions & { showInPanel(id: string): void };
}): JSX.Element {
  const { model, follower, actions } = props;
  useSignal(model.changed);
  useSignal(follower.changed);
  const clock = React.useCallback(() => model.api.clock.now(), [model]);
  const now = useNow(clock);
  const [stream, setStream] = React.useState<StreamFilter>('all');
  const [rank, setRank] = React.useState<number | 'all'>('all');
  const job = model.state.jobs.get(follower.jobId) ?? follower.job;
  const buffer = follower.buffer;
  const ranks = logRanks(buffer);

  const scroller = React.useRef<HTMLDivElement>(null);
  const atBottom = React.useRef(true);
  const [unseen, setUnseen] = React.useState(0);
  const seenCount = React.useRef(0);

  const onScroll = (): void => {
    const el = scroller.current;
    if (!el) {
      return;
    }
    atBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 8;
    if (atBottom.current) {
      seenCount.current = buffer.records.length + buffer.dropped;
      setUnseen(0);
    }
  };

  React.useLayoutEffect(() => {
    const el = scroller.current;
    const total = buffer.records.length + buffer.dropped;
    if (!el) {
      return;
    }
    if (atBottom.current) {
      el.scrollTop = el.scrollHeight;
      seenCount.current = total;
      setUnseen(0);
    } else {
      setUnseen(total - seenCount.current);
    }
  }, [buffer, stream, rank]);

  const jumpToEnd = (): void => {
    const el = scroller.current;
    if (el) {
      atBottom.current = true;
      el.scrollTop = el.scrollHeight;
      seenCount.current = buffer.records.length + buffer.dropped;
      setUnseen(0);
    }
  };

  return (
    <div className="gl-LogViewBody" data-job={follower.jobId}>
      {job ? (
        <JobHeader job={job} now={now} actions={actions} />
      ) : (
        <div className="gl-LogHeader">Job {shortId(follower.jobId)}</div>
      )}
      <div className="gl-LogToolbar">
        <label>
          Stream{' '}
          <select
            value={stream}
            onChange={e => setStream(e.target.value as StreamFilter)}
            aria-label="Show stream"
          >
            <option value="all">all</option>
            <option value="stdout">stdout</option>
            <option value="stderr">stderr</option>
            <option value="system">system</option>
          </select>
        </label>
        {ranks.length > 0 && (
          <label>
            Rank{' '}
            <select
              value={String(rank)}
              onChange={e =>
                setRank(
                  e.target.value === 'all' ? 'all' : Number(e.target.value)
                )
              }
              aria-label="Show rank"
            >
              <option value="all">all</option>
              {ranks.map(r => (
                <option key={r} value={String(r)}>
                  rank {r}
                </option>
              ))}
            </select>
          </label>
        )}
        <span className="gl-LogStatus" data-status={follower.status}>
          {logStatusText(
            follower.status,
            buffer.records.length + buffer.dropped,
            job?.state ?? null,
            follower.error
          )}
        </span>
      </div>
      <div
        className="gl-Log"
        ref={scroller}
        onScroll={onScroll}
        tabIndex={0}
        role="log"
        aria-live="off"
        aria-label={`Log of job ${job?.spec.name ?? follower.jobId}`}
      >
        {buffer.dropped > 0 && (
          <div className="gl-LogNote">
            {buffer.dropped} older lines are not kept in this view; `gpulayer
            logs {shortId(follower.jobId)}` prints them all.
          </div>
        )}
        {chunks(buffer.records).map(c => (
          <LogChunk
            key={c.key}
            records={c.records}
            first={c.first}
            last={c.last}
            length={c.records.length}
            stream={stream}
            rank={rank}
          />
        ))}
      </div>
      {unseen > 0 && (
        <button className="gl-Button gl-JumpToEnd" onClick={jumpToEnd}>
          ↓ {unseen} new line{unseen === 1 ? '' : 's'}
        </button>
      )}
    </div>
  );
}

function JobHeader(props: {
  job: IJob;
  now: number;
  actions: IPanelActions & { showInPanel(id: string): void };
}): JSX.Element {
  const { job, now, actions } = props;
  const bits = [
    job.placement ? formatPlacement(job) : formatRequest(job),
    formatJobClock(job, now),
    formatExit(job)
  ].filter(Boolean);
  return (
    <div className="gl-LogHeader" data-state={job.state}>
      <div className="gl-Row-head">
        <span className="gl-Row-name">{job.spec.name}</span>
        <span className="gl-Id">{job.id}</span>
        <JobStateBadge state={job.state} cancelling={job.cancel_requested} />
      </div>
      <div className="gl-Row-meta">{bits.join(' · ')}</div>
      {job.state === 'queued' && job.pending?.sentence && (
        <p className="gl-Sentence">{job.pending.sentence}</p>
      )}
      {job.placement?.explanation && job.state !== 'queued' && (
        <div className="gl-Row-meta">{job.placement.explanation}</div>
      )}
      {job.reason && job.state !== 'succeeded' && (
        <div className="gl-Row-meta gl-Reason">{job.reason}</div>
      )}
      <Progress job={job} />
      <div className="gl-Actions">
        <JobActions job={job} actions={actions} showLogs={false} />
        <button
          className="gl-Button"
          onClick={() => actions.showInPanel(job.id)}
        >
          Show in panel
        </button>
      </div>
    </div>
  );
}

interface IChunk {
  key: number;
  first: number;
  last: number;
  records: readonly ILogRecord[];
}

/** Group records by seq into blocks of 500 so React re-renders only the block that grew. */
function chunks(records: readonly ILogRecord[]): IChunk[] {
  const out: IChunk[] = [];
  let current: ILogRecord[] = [];
  let key = -1;
  for (const r of records) {
    const k = Math.floor(r.seq / 500);
    if (k !== key && current.length) {
      out.push(chunkOf(key, current));
      current = [];
    }
    key = k;
    current.push(r);
  }
  if (current.length) {
    out.push(chunkOf(key, current));
  }
  return out;
}

function chunkOf(key: number, records: ILogRecord[]): IChunk {
  return {
    key,
    records,
    first: records[0]?.seq ?? 0,
    last: records[records.length - 1]?.seq ?? 0
  };
}

interface ILogChunkProps {
  records: readonly ILogRecord[];
  first: number;
  last: number;
  length: number;
  stream: StreamFilter;
  rank: number | 'all';
}

const LogChunk = React.memo(
  (props: ILogChunkProps): JSX.Element => (
    <>
      {props.records
        .filter(
          r =>
            (props.stream === 'all' || r.stream === props.stream) &&
            (props.rank === 'all' || r.rank === props.rank)
        )
        .map(r => (
          <div
            key={r.seq}
            className={`gl-LogLine gl-mod-${r.stream}`}
            data-seq={r.seq}
          >
            {r.rank !== null && (
              <span className="gl-LogRank">{rankPrefix(r.rank)}</span>
            )}
            {visibleText(r.text)}
          </div>
        ))}
    </>
  ),
  (a, b) =>
    a.first === b.first &&
    a.last === b.last &&
    a.length === b.length &&
    a.stream === b.stream &&
    a.rank === b.rank
);
