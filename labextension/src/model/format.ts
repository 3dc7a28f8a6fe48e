/**
 * Pure formatting for the panel: ages, durations, sizes, placements, progress.
 * No DOM and no clock reads (callers pass `now`), so it is unit-tested in Node.
 */
import type {
  IDevice,
  IJob,
  ISessionInfo,
  IWorkerInfo,
  JobState,
  JsonValue
} from '../api';
// From its own module: the cell widget bundles this file, without the panel's HTTP calls.
import { HIDDEN_JOB } from '../api/contracts';

/** "now", "4s", "3m 05s", "2h 10m", "3d 4h": compact, for narrow sidebars. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds)) {
    return '–';
  }
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m}m ${String(s % 60).padStart(2, '0')}s`;
  }
  const h = Math.floor(m / 60);
  if (h < 24) {
    return `${h}h ${String(m % 60).padStart(2, '0')}m`;
  }
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** How long ago `then` was, e.g. "3s ago"; "just now" under a second. */
export function formatAge(then: number, now: number): string {
  const delta = now - then;
  if (delta < 1) {
    return 'just now';
  }
  return `${formatDuration(delta)} ago`;
}

/** Binary sizes as GPU vendors print them: "80 GiB", "512 MiB", "0 B". */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes <= 0) {
    return '0 B';
  }
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = value >= 10 || unit === 0 ? 0 : 1;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** One device as a line: "#0 A100-80GB · 80 GiB (simulated)". */
export function formatDevice(device: IDevice): string {
  const memory = device.memory_bytes
    ? ` · ${formatBytes(device.memory_bytes)}`
    : '';
  // Simulated devices always say so (DESIGN rule 10), once.
  const simulated =
    device.vendor === 'sim' && !/simulated/i.test(device.name)
      ? ' (simulated)'
      : '';
  return `#${device.index} ${device.name || device.kind}${memory}${simulated}`;
}

/** The job using a worker's device, if any (`device_jobs` keys are JSON strings). */
export function deviceJob(worker: IWorkerInfo, index: number): string | null {
  return worker.device_jobs[String(index)] ?? null;
}

/**
 * Who uses a worker's device, as its row says: "free", "in use by train 3f2a1b2c", or "busy
 * (another user's job)" for a job the server does not show this user (`HIDDEN_JOB` stands in
 * for its id; the same words as the CLI's `render.workers`).
 */
export function formatDeviceUse(
  jobId: string | null,
  jobs: ReadonlyMap<string, IJob>
): string {
  if (jobId === null) {
    return 'free';
  }
  if (jobId === HIDDEN_JOB) {
    return "busy (another user's job)";
  }
  const job = jobs.get(jobId);
  return `in use by ${job ? job.spec.name : 'job'} ${shortId(jobId)}`;
}

/** Where a job runs: "local-box GPUs 0,1 (simulated)", several nodes joined by " + ". */
export function formatPlacement(job: IJob): string {
  if (!job.placement) {
    return '';
  }
  return job.placement.nodes
    .map(n => {
      if (n.devices.length) {
        const gpus = n.devices.length === 1 ? 'GPU' : 'GPUs';
        const sim = n.simulated ? ' (simulated)' : '';
        return `${n.worker_name} ${gpus} ${n.devices.join(',')}${sim}`;
      }
      if (n.cpu_fallback) {
        return `${n.worker_name} CPU (fallback)`;
      }
      return `${n.worker_name} CPU`;
    })
    .join(' + ');
}

/** Seconds the job has run (running) or ran (finished); null before it started. */
export function jobElapsed(job: IJob, now: number): number | null {
  const start = job.started_at ?? job.placed_at;
  if (start === null) {
    return null;
  }
  const end = job.finished_at ?? now;
  return Math.max(0, end - start);
}

/** "running 2m 05s", "succeeded in 4s", "queued 10s": the state with its clock. */
export function formatJobClock(job: IJob, now: number): string {
  const elapsed = jobElapsed(job, now);
  if (job.state === 'queued') {
    return `waiting ${formatDuration(now - job.submitted_at)}`;
  }
  if (elapsed === null) {
    return '';
  }
  if (job.finished_at !== null) {
    return `took ${formatDuration(elapsed)}`;
  }
  return `for ${formatDuration(elapsed)}`;
}

function scalar(value: JsonValue | undefined): string | null {
  if (typeof value === 'number') {
    if (Number.isInteger(value)) {
      return String(value);
    }
    return Math.abs(value) >= 100 || Math.abs(value) < 0.001
      ? value.toPrecision(3)
      : value.toFixed(3).replace(/0+$/, '').replace(/\.$/, '');
  }
  if (typeof value === 'string' || typeof value === 'boolean') {
    return String(value);
  }
  return null;
}

/**
 * Progress as the job reported it (`gpulayer_kernel.job.progress(step=10, total=100, loss=0.3)`):
 * the fraction done (0–1) when step and total say so, and a one-line text.
 */
export function formatProgress(progress: Record<string, JsonValue> | null): {
  fraction: number | null;
  text: string;
} {
  if (!progress) {
    return { fraction: null, text: '' };
  }
  const step = progress.step;
  const total = progress.total;
  let fraction: number | null = null;
  const parts: string[] = [];
  if (typeof step === 'number' && typeof total === 'number' && total > 0) {
    fraction = Math.min(1, Math.max(0, step / total));
    parts.push(`step ${step}/${total}`);
  } else if (typeof step === 'number') {
    parts.push(`step ${step}`);
  }
  for (const [key, value] of Object.entries(progress)) {
    if (key === 'step' || key === 'total') {
      continue;
    }
    const text = scalar(value);
    if (text !== null) {
      parts.push(`${key} ${text}`);
    }
  }
  return { fraction, text: parts.join(' · ') };
}

/** A short label for a job's exit: "exit 0", "exit 137", or the reason when there is no code. */
export function formatExit(job: IJob): string {
  if (job.exit_code !== null) {
    return `exit ${job.exit_code}`;
  }
  return '';
}

/** What a job asks for: "2 GPUs", "1 GPU (h100)", "2×2 GPUs", "CPU". */
export function formatRequest(job: IJob): string {
  const r = job.spec.resources;
  if (!r.gpus) {
    return 'CPU';
  }
  const kind = r.gpu_kind.length ? ` (${r.gpu_kind.join('|')})` : '';
  const count = r.nodes > 1 ? `${r.nodes}×${r.gpus}` : `${r.gpus}`;
  return `${count} ${r.gpus === 1 && r.nodes === 1 ? 'GPU' : 'GPUs'}${kind}`;
}

/** The short id shown in lists; ids are unique by any 4+ character prefix. */
export function shortId(id: string): string {
  return id.slice(0, 8);
}

/** A state's human name and whether it is a "good", "bad" or "live" one (for colour). */
export function stateTone(state: JobState): 'ok' | 'bad' | 'live' | 'idle' {
  switch (state) {
    case 'succeeded':
      return 'ok';
    case 'failed':
    case 'lost':
      return 'bad';
    case 'placed':
    case 'running':
      return 'live';
    default:
      return 'idle';
  }
}

/**
 * The command that makes another machine join this control plane (docs/remote-workers.md).
 * The join token goes in the environment, not argv (argv shows in `ps`).
 */
export function workerCommand(serverUrl: string): string {
  return `GPULAYER_JOIN_TOKEN=<join token> gpulayer worker --server ${serverUrl}`;
}

/**
 * The notebook that submitted a job, as a path for `docmanager:open` (relative to the
 * server's root). The `%%gpulayer` magic records the kernel's `JPY_SESSION_NAME`, which
 * is absolute; `serverRoot` is JupyterLab's page config option of the same name.
 * Null when the notebook is outside the server's root (it cannot be opened from here).
 */
export function notebookPath(label: string, serverRoot: string): string | null {
  const path = label.replace(/\\/g, '/');
  if (!path.startsWith('/') && !/^[A-Za-z]:\//.test(path)) {
    return path.replace(/^\.\//, '');
  }
  const root = serverRoot.replace(/\\/g, '/').replace(/\/+$/, '');
  if (root && path.startsWith(`${root}/`)) {
    return path.slice(root.length + 1);
  }
  return null;
}

/** A log record's prefix: "[r1] " for rank 1 of a gang, "" for a single-process job. */
export function rankPrefix(rank: number | null): string {
  return rank === null ? '' : `[r${rank}] `;
}

/**
 * What a terminal shows of a log line written with carriage returns: its last redraw.
 * A progress bar (tqdm, pip) redraws one line with `\r`, and the worker ships the line when
 * its newline comes, every redraw in it; shown raw that reads "1/202/203/20…". The same
 * rule as `render.visible` in Python (the CLI, the text view and the cell widget).
 */
export function visibleText(text: string): string {
  if (!text.includes('\r')) {
    return text;
  }
  const parts = text.split('\r');
  for (let i = parts.length - 1; i >= 0; i--) {
    if (parts[i]) {
      return parts[i] as string;
    }
  }
  return '';
}

/** Where a log view's follower is (logfollower.ts `LogStatus`). */
export type LogViewStatus =
  'loading' | 'following' | 'complete' | 'retrying' | 'missing';

/**
 * The log view's status words. A queued job has written nothing yet and may wait long:
 * "waiting to start", not "loading…" until its first line.
 */
export function logStatusText(
  status: LogViewStatus,
  lines: number,
  state: JobState | null,
  error = ''
): string {
  const count = `${lines} line${lines === 1 ? '' : 's'}`;
  const waiting = lines === 0 && (state === 'queued' || state === 'placed');
  switch (status) {
    case 'loading':
    case 'following':
      if (waiting) {
        return state === 'queued' ? 'waiting to start' : 'starting…';
      }
      return status === 'loading' ? 'loading…' : `${count} · following`;
    case 'complete':
      return `${count} · complete`;
    case 'retrying':
      return `${count} · reconnecting (${error})`;
    case 'missing':
      return error;
  }
}

/** The cancel dialog's words: a queued job has no processes to stop and is not running. */
export function cancelDialogText(job: IJob): { body: string; keep: string } {
  const who = `${job.spec.name} (${shortId(job.id)})`;
  if (job.state === 'queued') {
    return {
      body: `${who} is queued and has not started. Cancelling takes it out of the queue.`,
      keep: 'Keep it queued'
    };
  }
  return {
    body: `${who} is ${job.state}. Cancelling stops all its processes.`,
    keep: 'Keep it running'
  };
}

/**
 * A session's idle clock: "idle 3m 05s · ends in 26m 55s" (the server's `ends_at`), "running
 * cell 12", "broken", "starting". `now` is server seconds.
 */
export function formatSessionClock(session: ISessionInfo, now: number): string {
  switch (session.status) {
    case 'busy':
      return session.busy_cell !== null && session.busy_cell !== undefined
        ? `running cell ${session.busy_cell}`
        : 'busy';
    case 'idle': {
      const since = session.idle_since ?? now;
      const idle = `idle ${formatDuration(now - since)}`;
      const ends = session.ends_at;
      return ends === null || ends === undefined
        ? idle
        : `${idle} · ends in ${formatDuration(ends - now)}`;
    }
    case 'waiting':
      return 'waiting for its GPUs';
    case 'broken':
      return 'broken: restart it';
    default:
      return 'ended';
  }
}

/** Who holds a session: its notebook's file name, else "another client". */
export function formatHolder(session: ISessionInfo): string {
  const notebook = session.holder.notebook;
  if (!notebook) {
    return 'a client without a notebook';
  }
  return notebook.split('/').pop() ?? notebook;
}

/**
 * What a session runs, for its row: a GPU kernel (ADR 0021) is the notebook's kernel and takes
 * no session cells, so its cell count (always 0) would mislead; a session counts ranks and cells.
 */
export function formatSessionUse(session: ISessionInfo): string {
  if (session.kernel) {
    return 'GPU kernel picked in the launcher';
  }
  const ranks = `${session.ranks} rank${session.ranks === 1 ? '' : 's'}`;
  return `${ranks} · ${session.cells} cell${session.cells === 1 ? '' : 's'}`;
}
