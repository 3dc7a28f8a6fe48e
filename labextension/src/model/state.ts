/**
 * The panel's state as pure functions: lists folded from snapshots and the event stream,
 * the queue in scheduling order, job filters (the log view's lines are in logbuffer.ts).
 *
 * Events carry whole objects (the job or worker as it is now), so applying a page is
 * idempotent and a page applied after a newer snapshot converges to the newest state. The
 * event cursor is opaque here: the server hands it out and reads it back.
 */
import type {
  IEventPage,
  IJob,
  ISessionInfo,
  IWorkerInfo,
  JobState
} from '../api';
import { TERMINAL_STATES } from '../api';
import { formatHolder } from './format';

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

/** A GPU kernel that waits for its GPUs, as the notebook starting it is told (ADR 0021). */
export interface IKernelWait {
  /** The kernel's session id (one notice per kernel, updated as the sentence changes). */
  id: string;
  /** Its job (the panel's Queue row shows the whole sentence). */
  job: string;
  /** The notebook's file name, or who else holds it. */
  holder: string;
  /** The scheduler's one sentence: why it waits, and whether waiting helps. */
  sentence: string;
}

/**
 * GPU kernels still queued, with the queue's sentence (for a notice: JupyterLab cuts a toast's
 * text at 140 characters, hence the button to the Queue row). JupyterLab shows only "Starting" while
 * a provisioner waits, and a `%%gpulayer` session already prints its own sentence in its
 * cell, so kernels only. The job in `jobs` is the freshest (job events carry its report).
 */
export function waitingKernels(state: IPanelState): IKernelWait[] {
  return sessionList(state)
    .filter(s => s.kernel && s.status === 'waiting')
    .map(s => {
      const job = state.jobs.get(s.job.id) ?? s.job;
      return {
        id: s.id,
        job: s.job.id,
        holder: formatHolder(s),
        sentence:
          job.pending?.sentence || 'waiting for the next scheduling pass'
      };
    });
}

/** A GPU kernel whose session ended on purpose: idle past its timeout, or stopped elsewhere. */
export interface IKernelEnd {
  /** The kernel's session id. */
  id: string;
  /** The Jupyter kernel's id (its holder's), to find the notebook that uses it. */
  kernel: string | null;
  /** The notebook's file name, or who else holds it. */
  holder: string;
  /** Why it ended, as its job says. */
  reason: string;
}

/**
 * GPU kernels whose session ended on purpose since the last look (ADR 0021). `watched` holds the
 * kernel sessions seen live before; one that left the live list is told once its job is known to
 * have ended `cancelled` (final: the Jupyter kernel stays and answers each cell with the reason,
 * and only a restart gets a GPU again); `lost` or `failed` ends are Jupyter's restarter's to
 * handle, so they are dropped. Returns the ends and the sessions to keep watching.
 */
export function kernelEnds(
  state: IPanelState,
  watched: ReadonlyMap<string, ISessionInfo>
): { ended: IKernelEnd[]; watching: Map<string, ISessionInfo> } {
  const watching = new Map<string, ISessionInfo>();
  const ended: IKernelEnd[] = [];
  for (const s of state.sessions.values()) {
    if (s.kernel) {
      watching.set(s.id, s);
    }
  }
  for (const [id, s] of watched) {
    if (watching.has(id)) {
      continue;
    }
    const job = state.jobs.get(s.job.id);
    if (!job || !TERMINAL_STATES.has(job.state)) {
      watching.set(id, s); // its end is not known yet: the job's event follows
    } else if (job.state === 'cancelled') {
      ended.push({
        id,
        kernel: s.holder.kernel ?? null,
        holder: formatHolder(s),
        reason: job.reason ?? 'its session was stopped'
      });
    }
  }
  return { ended, watching };
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
