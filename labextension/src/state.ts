/**
 * The panel's state as pure functions: lists folded from snapshots and the event stream,
 * the queue in scheduling order, job filters, and the bounded log buffer of a log view.
 *
 * Events carry whole objects (the job or worker as it is now), so applying a page is
 * idempotent and a page applied after a newer snapshot converges to the newest state. The
 * event cursor is opaque here: the server hands it out and reads it back.
 */
import type {
  IEventPage,
  IJob,
  ILogRecord,
  ISessionInfo,
  IWorkerInfo,
  JobState
} from './api';
import { TERMINAL_STATES } from './api';

/** What the panel knows. Maps are replaced, never mutated, so React sees every change. */
export interface IPanelState {
  jobs: ReadonlyMap<string, IJob>;
  workers: ReadonlyMap<string, IWorkerInfo>;
  /** Live sessions by id; one that ends leaves the map (its job stays in `jobs`). */
  sessions: ReadonlyMap<string, ISessionInfo>;
  /** The event cursor (`<epoch>:<seq>`, the server's): where the stream follows on from. */
  cursor: string;
}

export function emptyState(): IPanelState {
  return {
    jobs: new Map(),
    workers: new Map(),
    sessions: new Map(),
    cursor: ''
  };
}

/**
 * A fresh state from full lists (after start-up, a reconnect, or an event `reset`), following
 * on from a cursor taken before the lists were read.
 */
export function fromSnapshot(
  jobs: readonly IJob[],
  workers: readonly IWorkerInfo[],
  cursor: string,
  sessions: readonly ISessionInfo[] = []
): IPanelState {
  return {
    jobs: new Map(jobs.map(j => [j.id, j])),
    workers: new Map(workers.map(w => [w.id, w])),
    sessions: new Map(
      sessions.filter(s => s.status !== 'ended').map(s => [s.id, s])
    ),
    cursor
  };
}

/**
 * Fold one event page into the state. Returns the same object when nothing changed, so
 * callers can skip a render. A `reset` page cannot be folded: callers refetch the lists.
 */
export function applyEvents(
  state: IPanelState,
  page: IEventPage,
  maxFinished = 200
): IPanelState {
  if (!page.events.length && page.cursor === state.cursor) {
    return state;
  }
  let jobs: Map<string, IJob> | null = null;
  let workers: Map<string, IWorkerInfo> | null = null;
  let sessions: Map<string, ISessionInfo> | null = null;
  for (const event of page.events) {
    if (event.kind === 'job' && event.job) {
      jobs ??= new Map(state.jobs);
      jobs.set(event.job.id, event.job);
    } else if (event.kind === 'worker' && event.worker) {
      workers ??= new Map(state.workers);
      workers.set(event.worker.id, event.worker);
    } else if (event.kind === 'session' && event.session) {
      sessions ??= new Map(state.sessions);
      if (event.session.status === 'ended') {
        sessions.delete(event.session.id);
      } else {
        sessions.set(event.session.id, event.session);
      }
    }
  }
  return {
    jobs: jobs ? pruneFinished(jobs, maxFinished) : state.jobs,
    workers: workers ?? state.workers,
    sessions: sessions ?? state.sessions,
    cursor: page.cursor
  };
}

/** Keep every active job and the newest `keep` finished ones (by submission order). */
export function pruneFinished(
  jobs: Map<string, IJob>,
  keep: number
): Map<string, IJob> {
  const finished = [...jobs.values()].filter(j => TERMINAL_STATES.has(j.state));
  if (finished.length <= keep) {
    return jobs;
  }
  finished.sort((a, b) => b.seq - a.seq);
  for (const job of finished.slice(keep)) {
    jobs.delete(job.id);
  }
  return jobs;
}

/** Workers worth showing: every live one, by name; gone ones (the server's `live`) last. */
export function workerList(state: IPanelState): IWorkerInfo[] {
  const gone = (w: IWorkerInfo): number => (w.live ? 0 : 1);
  return [...state.workers.values()].sort(
    (a, b) =>
      gone(a) - gone(b) ||
      a.name.localeCompare(b.name) ||
      a.id.localeCompare(b.id)
  );
}

/** Live sessions by name. */
export function sessionList(state: IPanelState): ISessionInfo[] {
  return [...state.sessions.values()].sort(
    (a, b) => a.name.localeCompare(b.name) || a.id.localeCompare(b.id)
  );
}

/**
 * Queued jobs in scheduling order: the scheduler's `pending.position` first (1 = next);
 * jobs it has not ranked yet follow by priority (high first), then submission order.
 */
export function queue(state: IPanelState): IJob[] {
  const queued = [...state.jobs.values()].filter(j => j.state === 'queued');
  const pos = (j: IJob): number =>
    j.pending?.position ?? Number.POSITIVE_INFINITY;
  return queued.sort(
    (a, b) =>
      pos(a) - pos(b) || b.spec.priority - a.spec.priority || a.seq - b.seq
  );
}

/** The state filters of the Jobs list. */
export type JobFilter = 'all' | 'active' | 'succeeded' | 'failed' | 'cancelled';

export const JOB_FILTERS: readonly JobFilter[] = [
  'all',
  'active',
  'succeeded',
  'failed',
  'cancelled'
];

const FILTER_STATES: Record<
  Exclude<JobFilter, 'all'>,
  ReadonlySet<JobState>
> = {
  active: new Set(['placed', 'running']),
  succeeded: new Set(['succeeded']),
  failed: new Set(['failed', 'lost']),
  cancelled: new Set(['cancelled'])
};

export function matchesFilter(job: IJob, filter: JobFilter): boolean {
  return filter === 'all' || FILTER_STATES[filter].has(job.state);
}

/** The Jobs list: everything past the queue (placed, running, finished), newest first. */
export function jobList(state: IPanelState, filter: JobFilter = 'all'): IJob[] {
  return [...state.jobs.values()]
    .filter(j => j.state !== 'queued' && matchesFilter(j, filter))
    .sort((a, b) => b.seq - a.seq);
}

/** How many jobs each filter would show (for the filter buttons' counts). */
export function filterCounts(state: IPanelState): Record<JobFilter, number> {
  const counts: Record<JobFilter, number> = {
    all: 0,
    active: 0,
    succeeded: 0,
    failed: 0,
    cancelled: 0
  };
  for (const job of state.jobs.values()) {
    if (job.state === 'queued') {
      continue;
    }
    for (const filter of JOB_FILTERS) {
      if (matchesFilter(job, filter)) {
        counts[filter] += 1;
      }
    }
  }
  return counts;
}

/** Find a job by id or unique prefix (the `gpulayer:show-job` command accepts either). */
export function findJob(state: IPanelState, id: string): IJob | null {
  const exact = state.jobs.get(id);
  if (exact) {
    return exact;
  }
  const matches = [...state.jobs.values()].filter(j => j.id.startsWith(id));
  return matches.length === 1 ? (matches[0] ?? null) : null;
}

/** Whether the user may cancel a job now (not finished, not already being stopped). */
export function cancellable(job: IJob): boolean {
  return !TERMINAL_STATES.has(job.state) && !job.cancel_requested;
}

// -- log buffer ----------------------------------------------------------------------------

/** The lines a log view holds: the newest `max` records, in order, and the cursor after them. */
export interface ILogBuffer {
  records: readonly ILogRecord[];
  /** Records dropped off the front to stay within `max`. */
  dropped: number;
  next: number;
}

export function emptyLog(): ILogBuffer {
  return { records: [], dropped: 0, next: 0 };
}

/** Append a page's records (ignoring any already held) and keep the newest `max`. */
export function appendLog(
  buffer: ILogBuffer,
  records: readonly ILogRecord[],
  nextSince: number,
  max = 20000
): ILogBuffer {
  const fresh = records.filter(r => r.seq > buffer.next);
  if (!fresh.length) {
    return nextSince > buffer.next ? { ...buffer, next: nextSince } : buffer;
  }
  let all = [...buffer.records, ...fresh];
  let dropped = buffer.dropped;
  if (all.length > max) {
    dropped += all.length - max;
    all = all.slice(all.length - max);
  }
  const last = fresh[fresh.length - 1];
  return {
    records: all,
    dropped,
    next: Math.max(nextSince, last ? last.seq : 0)
  };
}

/** The ranks present in a log (for the rank filter); empty for single-process jobs. */
export function logRanks(buffer: ILogBuffer): number[] {
  const ranks = new Set<number>();
  for (const r of buffer.records) {
    if (r.rank !== null) {
      ranks.add(r.rank);
    }
  }
  return [...ranks].sort((a, b) => a - b);
}

// -- reconnecting --------------------------------------------------------------------------

/** Retry delay after `failures` consecutive failures: 0.5 s doubling to 10 s, with jitter. */
export function backoff(failures: number, random: number = 0.5): number {
  const base = Math.min(10, 0.5 * 2 ** Math.max(0, failures - 1));
  return base * (0.75 + 0.5 * random);
}
