/** Small builders for contract objects, so each test states only what it cares about. */
import type { IEvent, IJob, IWorkerInfo, JobState } from '../src/api';

export function job(id: string, seq: number, over: Partial<IJob> = {}): IJob {
  return {
    id,
    seq,
    spec: {
      name: `job-${id}`,
      workload: { kind: 'command', argv: ['true'] },
      resources: { gpus: 0, nodes: 1, gpu_kind: [] },
      labels: {},
      priority: 0,
      timeout: null
    },
    state: 'queued',
    attempts: 0,
    placement: null,
    pending: null,
    submitted_at: 1000,
    placed_at: null,
    started_at: null,
    finished_at: null,
    exit_code: null,
    reason: null,
    progress: null,
    cancel_requested: false,
    ...over
  };
}

export function withState(j: IJob, state: JobState): IJob {
  return { ...j, state };
}

export function worker(
  id: string,
  name: string,
  over: Partial<IWorkerInfo> = {}
): IWorkerInfo {
  return {
    id,
    name,
    state: 'ready',
    labels: {},
    capabilities: {
      devices: [],
      simulated: false,
      runtime: 'cpu',
      host: { hostname: name, cpus: 2 }
    },
    transport: 'inprocess',
    registered_at: 1000,
    last_heartbeat: 1000,
    running: [],
    device_jobs: {},
    ...over
  };
}

export function jobEvent(seq: number, j: IJob): IEvent {
  return { seq, time: 1000 + seq, kind: 'job', job: j, worker: null };
}

export function workerEvent(seq: number, w: IWorkerInfo): IEvent {
  return { seq, time: 1000 + seq, kind: 'worker', job: null, worker: w };
}
