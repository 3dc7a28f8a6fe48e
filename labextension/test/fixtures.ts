/**
 * Small builders for contract objects, so each test states only what it cares about.
 *
 * They build every field the generated contract types require (what the server sends), so a
 * field added to a contract shows up here as a type error until a default is chosen.
 */
import type {
  IDevice,
  IEvent,
  IEventPage,
  IJob,
  INodePlacement,
  IPlacementReport,
  ISessionInfo,
  IWorkerInfo,
  JobState
} from '../src/api';

const V = 'gpulayer/v1' as const;

export function job(id: string, seq: number, over: Partial<IJob> = {}): IJob {
  return {
    api_version: V,
    id,
    seq,
    spec: {
      api_version: V,
      name: `job-${id}`,
      workload: {
        api_version: V,
        kind: 'command',
        argv: ['true'],
        bundle: null,
        workspace: null
      },
      resources: {
        api_version: V,
        gpus: 0,
        nodes: 1,
        gpu_kind: [],
        gpu_memory_min: null,
        cpus: null,
        selector: {},
        worker: null,
        fallback: []
      },
      labels: {},
      env: {},
      secrets: [],
      priority: 0,
      retries: 0,
      retry_on: ['lost', 'preempted'],
      retry_exit_codes: [],
      retry_backoff: 5,
      retry_backoff_max: 300,
      retry_gang: false,
      timeout: null,
      workdir: null,
      wait_for_capacity: false
    },
    state: 'queued',
    attempts: 0,
    requeues: 0,
    placement: null,
    pending: null,
    submitted_at: 1000,
    placed_at: null,
    started_at: null,
    finished_at: null,
    exit_code: null,
    reason: null,
    progress: null,
    result: null,
    artifacts: [],
    cancel_requested: false,
    owner: 'admin',
    history: [],
    retry_at: null,
    ...over
  };
}

export function withState(j: IJob, state: JobState): IJob {
  return { ...j, state };
}

/** A job's resources with some fields changed (the spec's are all required). */
export function withResources(
  j: IJob,
  over: Partial<IJob['spec']['resources']>
): IJob {
  return {
    ...j,
    spec: { ...j.spec, resources: { ...j.spec.resources, ...over } }
  };
}

export function device(index: number, over: Partial<IDevice> = {}): IDevice {
  return {
    api_version: V,
    index,
    vendor: 'nvidia',
    name: 'A100-80GB',
    kind: 'a100',
    memory_bytes: 80 * 1024 ** 3,
    uuid: null,
    compute_capability: null,
    unified_memory: false,
    ...over
  };
}

export function node(over: Partial<INodePlacement> = {}): INodePlacement {
  return {
    api_version: V,
    worker_id: 'w',
    worker_name: 'box',
    devices: [],
    simulated: false,
    node_rank: 0,
    cpu_fallback: false,
    ...over
  };
}

export function report(
  jobId: string,
  over: Partial<IPlacementReport> = {}
): IPlacementReport {
  return {
    api_version: V,
    job_id: jobId,
    workers_total: 1,
    workers_feasible: 0,
    nodes: 1,
    filtered: [],
    exhausted: [],
    reserved_by: null,
    reservation: [],
    position: null,
    sentence: '',
    candidates: [],
    largest_gpus: null,
    largest_cpus: null,
    sessions: [],
    quota: null,
    fair_share: null,
    scaling: null,
    ...over
  };
}

/** A worker as the server sends it; `live` is the server's to say, so tests set it too. */
export function worker(
  id: string,
  name: string,
  over: Partial<IWorkerInfo> = {}
): IWorkerInfo {
  return {
    api_version: V,
    id,
    name,
    state: 'ready',
    live: true,
    labels: {},
    address: null,
    shares: null,
    capabilities: {
      api_version: V,
      devices: [],
      simulated: false,
      runtime: 'cpu',
      cuda_driver: null,
      dist_backend: null,
      probe_errors: [],
      probe_sources: [],
      workloads: ['command', 'python'],
      frameworks: {
        api_version: V,
        cuda_available: false,
        device_count: 0,
        distributed_backends: [],
        mps_available: false,
        torch_cuda: null,
        torch_hip: null,
        torch_version: null
      },
      host: {
        api_version: V,
        hostname: name,
        cpus: 2,
        arch: 'x86_64',
        memory_bytes: 0,
        os: 'linux',
        python: '3.11'
      }
    },
    transport: 'inprocess',
    registered_at: 1000,
    last_heartbeat: 1000,
    running: [],
    device_jobs: {},
    unschedulable: null,
    suspect: null,
    ...over
  };
}

export function jobEvent(seq: number, j: IJob): IEvent {
  return {
    api_version: V,
    seq,
    time: 1000 + seq,
    kind: 'job',
    job: j,
    worker: null,
    session: null
  };
}

export function workerEvent(seq: number, w: IWorkerInfo): IEvent {
  return {
    api_version: V,
    seq,
    time: 1000 + seq,
    kind: 'worker',
    job: null,
    worker: w,
    session: null
  };
}

/** A cursor as the server writes them (`<epoch>:<seq>`); the panel never parses one. */
export function cursor(seq: number, epoch = 'e1'): string {
  return `${epoch}:${seq}`;
}

/** An event page following on at `seq` (the last event's seq, or the cursor's). */
export function page(
  events: IEvent[],
  seq: number = events[events.length - 1]?.seq ?? 0,
  over: Partial<IEventPage> = {}
): IEventPage {
  return {
    api_version: V,
    events,
    next_since: seq,
    cursor: cursor(seq),
    reset: false,
    ...over
  };
}

/** A session as the server sends it (its `ends_at` is the server's to compute). */
export function session(
  id: string,
  name: string,
  over: Partial<ISessionInfo> = {}
): ISessionInfo {
  return {
    api_version: V,
    id,
    name,
    status: 'idle',
    job: withState(job(id, 1), 'running'),
    holder: {
      api_version: V,
      client: 'k1',
      notebook: 'work/train.ipynb',
      kernel: null
    },
    ranks: 1,
    kernel: false,
    workspace: null,
    cells: 0,
    busy_cell: null,
    idle_since: 1000,
    idle_timeout: 1800,
    reason: null,
    ends_at: 2800,
    ...over
  };
}

export function sessionEvent(seq: number, s: ISessionInfo): IEvent {
  return {
    api_version: V,
    seq,
    time: 1000 + seq,
    kind: 'session',
    job: null,
    worker: null,
    session: s
  };
}
