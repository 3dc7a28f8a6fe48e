/**
 * GENERATED FILE: do not edit. The GPUlayer contracts as TypeScript types, generated from
 * gpulayer_kernel/contracts/schema.json by labextension/scripts/gen-contracts.mjs
 * (json-schema-to-typescript).
 *
 * Regenerate after changing a contract:
 *   python -m gpulayer_kernel.contracts.schema && jlpm build:contracts
 *
 * Every property is required: these are the shapes the server sends, with every field.
 */

/**
 * Any top-level contract (gpulayer/v1).
 */
export type AnyContract =
  | IArtifact
  | IAttachRequest
  | IAttemptRecord
  | IBudget
  | IBudgetList
  | IBudgetStatus
  | ICellList
  | ICellPage
  | ICellReport
  | ICellRequest
  | ICellResult
  | ICostEntry
  | ICostReport
  | IEvent
  | IEventCursor
  | IEventPage
  | IFinishReport
  | IInstance
  | IInstanceList
  | IJob
  | IJobAssignment
  | IJobFollow
  | IJobList
  | IJobReport
  | IJobSpec
  | ILogBatch
  | ILogLine
  | ILogPage
  | ILogRecord
  | IOffer1
  | IPlacementReport
  | IProgressReport
  | IProviderCheck
  | IProviderList
  | IRefusal
  | IRendezvous
  | IReportAnswer
  | IReportBatch
  | IRunRequest
  | ISessionInfo
  | ISessionList
  | ISessionReport
  | ISessionSpec
  | ISubmitAnswer
  | ISubmitBatch
  | IWork
  | IWorkerCapabilities
  | IWorkerInfo
  | IWorkerRegistration;
export type BudgetPolicy = 'warn' | 'cancel';
export type JsonValue =
  null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };
export type CellState = 'queued' | 'running' | 'ok' | 'error' | 'aborted';
export type CostKind = 'estimate' | 'charge';
/**
 * Stable reason codes. ``filtered`` ones never clear by waiting; ``exhausted`` ones may.
 */
export type Reason =
  | 'worker_not_ready'
  | 'cordoned'
  | 'selector_mismatch'
  | 'name_mismatch'
  | 'no_gpus'
  | 'gpu_kind'
  | 'gpu_memory'
  | 'too_few_gpus_total'
  | 'mps_distributed'
  | 'unsupported_vendor'
  | 'cpus_total'
  | 'draining'
  | 'too_few_nodes'
  | 'unschedulable'
  | 'gpus_busy'
  | 'reserved'
  | 'cpus_busy'
  | 'not_enough_nodes'
  | 'worker_suspect';
/**
 * What the autoscaler can do for a waiting job (``PlacementReport.scaling``).
 */
export type ScalingCode =
  | 'launching'
  | 'booting'
  | 'over_budget'
  | 'max_price'
  | 'provider_limit'
  | 'provider_backoff'
  | 'provider_error'
  | 'no_offer';
export type JobState =
  | 'queued'
  | 'placed'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'lost';
/**
 * Where a session is in its life (its job's state says where the job is).
 */
export type SessionStatus = 'waiting' | 'idle' | 'busy' | 'broken' | 'ended';
export type WorkerState =
  'ready' | 'busy' | 'draining' | 'cordoned' | 'lost' | 'offline';
export type InstanceState =
  | 'requested'
  | 'booting'
  | 'joined'
  | 'draining'
  | 'terminated'
  | 'failed'
  | 'preempted';

export interface IArtifact {
  api_version: 'gpulayer/v1';
  digest: string;
  name: string;
  rank: number | null;
  size: number;
}
/**
 * Take a session over: its cells are this client's from now on (a restarted kernel).
 */
export interface IAttachRequest {
  api_version: 'gpulayer/v1';
  holder: ISessionHolder;
}
/**
 * Who holds a session: the client (one kernel's connection) that may run cells in it.
 */
export interface ISessionHolder {
  api_version: 'gpulayer/v1';
  /**
   * an opaque id of the holding client (each kernel makes its own); only it (and an admin) may run cells, until another client attaches
   */
  client: string;
  /**
   * the holder's kernel id
   */
  kernel: string | null;
  /**
   * the holder's notebook path
   */
  notebook: string | null;
}
/**
 * One attempt of a job: where it ran, how it ended, what it was expected to cost and cost.
 */
export interface IAttemptRecord {
  api_version: 'gpulayer/v1';
  attempt: number;
  /**
   * dollars charged when it ended
   */
  charge: number | null;
  ended_at: number | null;
  /**
   * dollars expected at placement
   */
  estimate: number;
  estimate_hours: number;
  exit_code: number | null;
  /**
   * unit-seconds actually held
   */
  gpu_seconds: number | null;
  /**
   * provider instance ids
   */
  instances: string[];
  /**
   * None while the attempt is placed/running
   */
  outcome:
    | ('succeeded' | 'failed' | 'cancelled' | 'lost' | 'preempted' | 'requeued')
    | null;
  placed_at: number;
  provider: string | null;
  reason: string | null;
  /**
   * a new attempt followed this one
   */
  retried: boolean;
  /**
   * when the next attempt may start (backoff)
   */
  retry_at: number | null;
  started_at: number | null;
  /**
   * dollars per unit-hour at placement
   */
  unit_price: number;
  /**
   * GPUs held (machines, for a CPU-only worker)
   */
  units: number;
  /**
   * worker names, node order
   */
  workers: string[];
}
/**
 * A spending limit for a user's or a project's jobs (matched on the job's labels).
 */
export interface IBudget {
  api_version: 'gpulayer/v1';
  /**
   * dollars per period
   */
  limit: number;
  /**
   * the user or project name
   */
  match: string;
  name: string;
  period: 'total' | 'day' | 'week' | 'month';
  policy: BudgetPolicy;
  scope: 'user' | 'project';
}
export interface IBudgetList {
  api_version: 'gpulayer/v1';
  budgets: IBudgetStatus[];
}
export interface IBudgetStatus {
  api_version: 'gpulayer/v1';
  budget: IBudget;
  /**
   * estimates of attempts placed or running now
   */
  committed: number;
  left: number;
  period_start: number | null;
  /**
   * charges of ended attempts this period
   */
  spent: number;
}
export interface ICellList {
  api_version: 'gpulayer/v1';
  cells: ICellRun[];
}
/**
 * One cell run in a session: recorded like a job (code digest, logs, outcome, duration).
 */
export interface ICellRun {
  all_ranks: boolean;
  api_version: 'gpulayer/v1';
  /**
   * the session broke during this cell (why): it needs a restart
   */
  broken: string | null;
  /**
   * the cell's source (redacted)
   */
  code: string;
  code_sha256: string;
  /**
   * the root cause: the first rank to fail
   */
  error: ICellError | null;
  finished_at: number | null;
  /**
   * the session log seq before this cell's records
   */
  first_seq: number;
  history: boolean;
  number: number;
  /**
   * --out/pull values that are plain JSON
   */
  outputs: {
    [k: string]: JsonValue;
  };
  /**
   * --out/pull values as a tensor-safe blob
   */
  outputs_blob: string | null;
  ranks: IRankOutcome[];
  ranks_expected: number;
  /**
   * why it was aborted, or what else went wrong
   */
  reason: string | null;
  session_id: string;
  started_at: number | null;
  state: CellState;
  submitted_at: number;
  /**
   * rank 0's displayed value
   */
  value: {
    [k: string]: JsonValue;
  } | null;
}
/**
 * An exception raised in a cell, as IPython shows it (the traceback's lines, ANSI colours).
 */
export interface ICellError {
  api_version: 'gpulayer/v1';
  ename: string;
  evalue: string;
  rank: number | null;
  /**
   * @maxItems 2000
   */
  traceback: string[];
}
/**
 * How one rank ran one cell.
 */
export interface IRankOutcome {
  api_version: 'gpulayer/v1';
  duration: number;
  error: ICellError | null;
  rank: number;
  status: 'ok' | 'error' | 'aborted';
  /**
   * the cell's displayed value (Out[n]) as Jupyter's display content: {"data": {mime: ...}, "metadata": {...}}
   */
  value: {
    [k: string]: JsonValue;
  } | null;
}
/**
 * A cell as it is now, with its log records after ``since`` (the answer to a run or a
 * follow: one request carries the result and the output of a short cell).
 */
export interface ICellPage {
  api_version: 'gpulayer/v1';
  cell: ICellRun;
  /**
   * more of the cell's records wait after `next_since`: ask again at once (a cell that has ended has all its output only once a page says no more)
   */
  more: boolean;
  /**
   * follow on from here
   */
  next_since: number;
  records: ILogRecord[];
}
export interface ILogRecord {
  api_version: 'gpulayer/v1';
  /**
   * the session cell this record belongs to (None: not a session cell's)
   */
  cell: number | null;
  /**
   * a display's MIME bundle (stream "display"; `text` is its text/plain form), as Jupyter's
   */
  data: {
    [k: string]: JsonValue;
  } | null;
  rank: number | null;
  seq: number;
  stream: 'stdout' | 'stderr' | 'system' | 'display';
  text: string;
  time: number;
}
/**
 * One worker's ranks' outcome of one cell, with the output records not yet shipped.
 */
export interface ICellReport {
  api_version: 'gpulayer/v1';
  attempt: number | null;
  /**
   * the session broke during this cell (why): it needs a restart
   */
  broken: string | null;
  finished_at: number | null;
  /**
   * @maxItems 10000
   */
  lines: ILogLine[];
  number: number;
  outputs: {
    [k: string]: JsonValue;
  };
  outputs_blob: string | null;
  ranks: IRankOutcome[];
  /**
   * what else went wrong: a rank that exited, --out values that could not move
   */
  reason: string | null;
  started_at: number | null;
}
/**
 * A log line as a worker sends it, before the control plane numbers it.
 */
export interface ILogLine {
  api_version: 'gpulayer/v1';
  /**
   * the session cell this record belongs to (None: not a session cell's)
   */
  cell: number | null;
  /**
   * a display's MIME bundle (stream "display"; `text` is its text/plain form), as Jupyter's
   */
  data: {
    [k: string]: JsonValue;
  } | null;
  rank: number | null;
  stream: 'stdout' | 'stderr' | 'system' | 'display';
  /**
   * the line, without its newline (a longer one is sent in pieces)
   */
  text: string;
  time: number;
}
/**
 * One cell to run in a session, on every rank.
 */
export interface ICellRequest {
  /**
   * show every rank's value, not rank 0's only
   */
  all_ranks: boolean;
  api_version: 'gpulayer/v1';
  /**
   * the requesting client (see SessionHolder.client)
   */
  client: string | null;
  code: string;
  /**
   * the kernel's execution count: tracebacks say In[n]
   */
  count: number | null;
  /**
   * False: a push/pull, not a cell of the history
   */
  history: boolean;
  /**
   * JSON values bound before the cell runs (--in)
   */
  inputs: {
    [k: string]: JsonValue;
  };
  /**
   * a tensor-safe blob (safetensors) of values bound before the cell (push, --in)
   */
  inputs_blob: string | null;
  /**
   * variables sent back after the cell (--out, pull), from rank 0
   *
   * @maxItems 64
   */
  outputs: string[];
}
/**
 * A one-shot cell's result: a JSON ``value``, or a ``shown`` value (see the module).
 */
export interface ICellResult {
  api_version: 'gpulayer/v1';
  shown: IShownValue | null;
  value: unknown;
}
/**
 * A cell's last value JSON could not carry, as the notebook shows it.
 */
export interface IShownValue {
  api_version: 'gpulayer/v1';
  /**
   * --out: the artifact holding it, tensor-safe
   */
  artifact: string | null;
  /**
   * its MIME bundle: {data: {mime: content}, metadata}
   */
  display: {
    [k: string]: unknown;
  } | null;
  /**
   * its text form (bounded)
   */
  'gpulayer/shown': string;
  /**
   * --out: why it could not travel even so
   */
  refused: string | null;
  refused_hint: string | null;
  /**
   * its type, module.qualname
   */
  type: string;
  /**
   * why JSON could not carry it
   */
  why: string;
}
/**
 * One ledger row: the estimate or the charge of one attempt (unique per job/attempt/kind).
 */
export interface ICostEntry {
  /**
   * dollars
   */
  amount: number;
  api_version: 'gpulayer/v1';
  /**
   * when it was recorded (placement or end)
   */
  at: number;
  attempt: number;
  instances: string[];
  job_id: string;
  job_name: string;
  kind: CostKind;
  project: string | null;
  /**
   * None: hardware not launched by a provider
   */
  provider: string | null;
  /**
   * charge: unit-seconds held
   */
  seconds: number | null;
  unit_price: number;
  units: number;
  user: string | null;
  workers: string[];
}
export interface ICostReport {
  api_version: 'gpulayer/v1';
  by: 'user' | 'job' | 'provider' | 'day' | 'project';
  rows: ICostRow[];
  since: number | null;
  total_charge: number;
  total_estimate: number;
}
/**
 * Costs summed over one group (a user, a job, a provider, a UTC day, a project).
 */
export interface ICostRow {
  api_version: 'gpulayer/v1';
  attempts: number;
  charge: number;
  estimate: number;
  gpu_hours: number;
  /**
   * the group ("-" for none: no user label, owned hardware)
   */
  key: string;
  /**
   * attempts still running (estimate, no charge yet)
   */
  open: number;
  /**
   * by provider: what the provider itself billed for its instances
   */
  reported: number | null;
}
/**
 * A change a UI should show: a job or a worker, as it is now.
 */
export interface IEvent {
  api_version: 'gpulayer/v1';
  job: IJob | null;
  kind: 'job' | 'worker' | 'session';
  seq: number;
  session: ISessionInfo | null;
  time: number;
  worker: IWorkerInfo | null;
}
/**
 * The control plane's record of one job.
 */
export interface IJob {
  api_version: 'gpulayer/v1';
  artifacts: IArtifact[];
  attempts: number;
  cancel_requested: boolean;
  exit_code: number | null;
  finished_at: number | null;
  /**
   * every attempt placed so far: where, how it ended, its estimate and charge
   */
  history: IAttemptRecord[];
  id: string;
  /**
   * the user who submitted it (set by the control plane from the caller's identity; jobs from before users belong to the admin)
   */
  owner: string;
  pending: IPlacementReport | null;
  placed_at: number | null;
  placement: IPlacement | null;
  progress: {
    [k: string]: JsonValue;
  } | null;
  /**
   * why it failed, was cancelled or lost
   */
  reason: string | null;
  /**
   * attempts put back in the queue before they started (their worker was lost first): each got a new attempt number, but none counts against `retries`
   */
  requeues: number;
  result: JsonValue;
  /**
   * a retried job waits (capped exponential backoff) until this time
   */
  retry_at: number | null;
  seq: number;
  spec: IJobSpec;
  started_at: number | null;
  state: JobState;
  submitted_at: number;
}
/**
 * One report per placement attempt (nomad's AllocMetric, Kubernetes' FitError).
 */
export interface IPlacementReport {
  api_version: 'gpulayer/v1';
  /**
   * up to 3 workers (names) that could run it once capacity frees, best first
   */
  candidates: string[];
  exhausted: IReasonCount[];
  /**
   * how many later jobs of other users fair share put ahead of it
   */
  fair_share: string | null;
  filtered: IReasonCount[];
  job_id: string;
  /**
   * jobs asking for CPUs: the most CPUs on any one worker
   */
  largest_cpus: number | null;
  /**
   * GPU jobs: the most GPUs of an acceptable kind and memory on any one worker (whatever its state): what exists, for a job that can never fit
   */
  largest_gpus: number | null;
  /**
   * workers the job needs at once (multi-node gang)
   */
  nodes: number;
  /**
   * place in the queue, 1 = next
   */
  position: number | null;
  /**
   * why its user's or group's GPU quota holds it back now (waiting helps)
   */
  quota: string | null;
  /**
   * worker ids this waiting gang job has reserved
   */
  reservation: string[];
  /**
   * the job whose reservation holds devices this one could otherwise use
   */
  reserved_by: string | null;
  /**
   * what the autoscaler launches for it, or why it cannot (providers)
   */
  scaling: IScalingNote | null;
  sentence: string;
  /**
   * sessions holding GPUs on the workers that could run it once they free up
   */
  sessions: ISessionHold[];
  workers_feasible: number;
  workers_total: number;
}
export interface IReasonCount {
  api_version: 'gpulayer/v1';
  code: Reason;
  detail: string;
  waiting_helps: boolean;
  workers: number;
}
/**
 * The autoscaler's word on a waiting job: what it launches for it, or why it cannot.
 */
export interface IScalingNote {
  api_version: 'gpulayer/v1';
  boot_seconds: number | null;
  budget: string | null;
  budget_left: number | null;
  code: ScalingCode;
  /**
   * e.g. the provider's last error
   */
  detail: string;
  /**
   * dollars it would cost on that offer
   */
  estimate: number | null;
  /**
   * launching/booting for it
   */
  instances: string[];
  /**
   * max $/h or max instances in the way
   */
  limit: number | null;
  /**
   * machines it needs (a multi-node gang: more)
   */
  machines: number;
  /**
   * the cheapest offer that fits (provider/name)
   */
  offer: string | null;
  /**
   * dollars per hour, every machine
   */
  price_per_hour: number | null;
  /**
   * provider backoff: seconds (from the note) until it launches again
   */
  retry_in: number | null;
}
/**
 * GPUs a session holds on a worker the waiting job could use (ADR 0019).
 */
export interface ISessionHold {
  api_version: 'gpulayer/v1';
  gpus: number;
  /**
   * who holds it, as sentences name it (its notebook)
   */
  holder: string;
  /**
   * None while a cell runs
   */
  idle_since: number | null;
  name: string;
  session_id: string;
  worker: string;
}
export interface IPlacement {
  api_version: 'gpulayer/v1';
  explanation: string;
  /**
   * @minItems 1
   */
  nodes: [INodePlacement, ...INodePlacement[]];
}
/**
 * One worker's share of a placed job.
 */
export interface INodePlacement {
  api_version: 'gpulayer/v1';
  cpu_fallback: boolean;
  devices: number[];
  node_rank: number;
  simulated: boolean;
  worker_id: string;
  worker_name: string;
}
/**
 * What a user asks for. Validated strictly: an unknown field is an error naming it.
 */
export interface IJobSpec {
  api_version: 'gpulayer/v1';
  env: {
    [k: string]: string;
  };
  labels: {
    [k: string]: string;
  };
  name: string;
  priority: number;
  resources: IResources;
  /**
   * opt-in re-runs after a failure of a kind in `retry_on` (ADR 0011); a gang (multi-GPU) job only with `retry_gang`
   */
  retries: number;
  /**
   * seconds before the first retry; doubled each attempt, capped by `retry_backoff_max`, with jitter (a random half of it)
   */
  retry_backoff: number;
  retry_backoff_max: number;
  /**
   * failing exits with these codes retry too (without `failed` in `retry_on`)
   *
   * @maxItems 64
   */
  retry_exit_codes: number[];
  /**
   * let a gang be retried too (gangs fail fast and never retry unless)
   */
  retry_gang: boolean;
  /**
   * which failures retry: "lost" (its worker stopped answering), "preempted" (its instance was taken back), "failed" (any failing exit, timeouts included)
   */
  retry_on: ('lost' | 'preempted' | 'failed')[];
  /**
   * names resolved on the worker
   */
  secrets: string[];
  /**
   * seconds; the job is killed past it
   */
  timeout: number | null;
  /**
   * keep waiting when no worker can ever run the job as asked (one may join); otherwise such a job fails at once, saying what exists
   */
  wait_for_capacity: boolean;
  /**
   * directory on the worker to run a command in (it must exist there); default: the job's own scratch directory
   */
  workdir: string | null;
  workload: ICommandWorkload | IPythonWorkload | ISessionWorkload;
}
/**
 * What a job needs. ``gpus`` is per node; ``nodes`` > 1 makes a multi-node gang.
 */
export interface IResources {
  api_version: 'gpulayer/v1';
  cpus: number | null;
  /**
   * ["cpu"] lets a GPU job run on a CPU-only worker
   */
  fallback: 'cpu'[];
  /**
   * acceptable GPU kinds, tried in the order given
   */
  gpu_kind: string[];
  /**
   * bytes per GPU
   */
  gpu_memory_min: number | null;
  gpus: number;
  nodes: number;
  /**
   * worker labels that must all match
   */
  selector: {
    [k: string]: string;
  };
  /**
   * run only on the worker with this name
   */
  worker: string | null;
}
/**
 * Run an argv as it is (no shell); with ``bundle``, inside that bundle unpacked.
 */
export interface ICommandWorkload {
  api_version: 'gpulayer/v1';
  /**
   * @minItems 1
   */
  argv: [string, ...string[]];
  /**
   * a content-addressed bundle (`gpulayer run --files`), unpacked on the worker as the command's working directory (instead of `workdir`)
   */
  bundle: string | null;
  kind: 'command';
  /**
   * the notebook's folder (ADR 0022): the job runs in it, in place, or in a copy on a worker that does not see it (left out when none)
   */
  workspace: IWorkspaceSource | null;
}
/**
 * Where a kernel's, session's or one-shot job's notebook is: a folder on the Jupyter host.
 *
 * A one-shot job (``%%gpulayer``) carries it on its workload, with ``manifest`` when a worker
 * that does not see the folder may take it: the digest of a :class:`WorkspaceManifest` in the
 * control plane's store (the folder's files, each there too, for the job's owner).
 */
export interface IWorkspaceSource {
  api_version: 'gpulayer/v1';
  /**
   * a one-shot job's outputs: bytes one file may have to come back unasked (bigger ones stay on the worker, listed); left out: the default
   */
  cap: number | null;
  /**
   * absolute path there
   */
  folder: string;
  /**
   * the Jupyter host's id (its machine id): a worker with the same id sees the same disk
   */
  host: string;
  /**
   * a one-shot job's copy of the folder: the digest of its manifest in the store (left out when none: a worker that does not see the folder runs it without)
   */
  manifest: string | null;
  /**
   * files of the worker's copy to send back whatever their size (`%gpulayer pull` after a one-shot cell); left out when none
   *
   * @maxItems 1000
   */
  pull: string[];
}
/**
 * Run Python from a content-addressed bundle.
 *
 * ``entrypoint`` is ``"pkg.mod:func"`` (called with ``**args``; its return value is the result),
 * a script path inside the bundle (``"train.py"``, run as ``__main__`` with ``args`` available
 * through ``gpulayer_kernel.job.args()``), or ``"cell:<file>"`` (a notebook cell: the value of
 * its last expression is the result).
 */
export interface IPythonWorkload {
  api_version: 'gpulayer/v1';
  args: {
    [k: string]: JsonValue;
  };
  bundle: string;
  entrypoint: string;
  kind: 'python';
  /**
   * the notebook's folder (ADR 0022): the job runs in it, in place, or in a copy on a worker that does not see it (left out when none)
   */
  workspace: IWorkspaceSource | null;
}
/**
 * The workload of a session's job: processes that keep state until stopped or idle.
 */
export interface ISessionWorkload {
  api_version: 'gpulayer/v1';
  /**
   * seconds without a running cell after which the session ends and frees its GPUs
   */
  idle_timeout: number;
  /**
   * a GPU kernel (ADR 0021): rank 0 is an ipykernel whose messages the control plane relays, in place of the session's cells (left out when false)
   */
  kernel: boolean;
  kind: 'session';
  /**
   * the notebook's folder (ADR 0022): the ranks run in it, in place or synced (left out when none)
   */
  workspace: IWorkspaceSource | null;
}
/**
 * A session as the API, the CLI and the panel show it.
 */
export interface ISessionInfo {
  api_version: 'gpulayer/v1';
  /**
   * the cell running now
   */
  busy_cell: number | null;
  /**
   * cells run so far
   */
  cells: number;
  /**
   * computed by the server: when an idle session ends unless a cell runs first (idle_since + idle_timeout); clients read it rather than repeat the rule
   */
  ends_at: number | null;
  holder: ISessionHolder;
  /**
   * the session's job id
   */
  id: string;
  /**
   * when the last cell ended (or it came up)
   */
  idle_since: number | null;
  idle_timeout: number;
  job: IJob;
  /**
   * a GPU kernel picked in JupyterLab's launcher (ADR 0021), not a session of cells: the panel marks it
   */
  kernel: boolean;
  name: string;
  /**
   * processes: one per GPU of each node (one on CPU)
   */
  ranks: number;
  /**
   * why it is broken or ended
   */
  reason: string | null;
  status: SessionStatus;
  /**
   * where its code runs (ADR 0022): the notebook's folder in place, a synced copy, or none and why (left out when the session named no folder)
   */
  workspace: IWorkspaceView | null;
}
/**
 * A session's workspace as the sidebar and ``gpulayer sessions`` show it.
 */
export interface IWorkspaceView {
  api_version: 'gpulayer/v1';
  bytes: number;
  files: number;
  /**
   * the notebook's folder on the Jupyter host
   */
  folder: string | null;
  mode: 'in_place' | 'synced' | 'none';
  /**
   * where the code runs on the worker
   */
  path: string | null;
  reason: string;
  /**
   * syncs applied (synced)
   */
  version: number;
}
export interface IWorkerInfo {
  /**
   * advertised address for rendezvous
   */
  address: string | null;
  api_version: 'gpulayer/v1';
  capabilities: IWorkerCapabilities;
  /**
   * device index -> id of the job using it
   */
  device_jobs: {
    [k: string]: string;
  };
  id: string;
  labels: {
    [k: string]: string;
  };
  last_heartbeat: number;
  /**
   * computed by the server from `state` (not lost, not offline); clients read it rather than repeat the rule
   */
  live: boolean;
  name: string;
  registered_at: number;
  /**
   * ids of jobs it runs
   */
  running: string[];
  /**
   * its host id and shared folders (ADR 0022); left out when none
   */
  shares: IWorkerShares | null;
  state: WorkerState;
  /**
   * why this worker is under suspicion (its connection closed and it has not come back); no new work goes to it until it answers again or is declared lost
   */
  suspect: string | null;
  transport: 'inprocess' | 'http';
  /**
   * why the scheduler set this worker aside (its data made a scheduling pass fail); no new work goes to it until it joins again or an admin removes it
   */
  unschedulable: string | null;
}
/**
 * What a worker's probe found: host facts, devices, drivers and frameworks.
 */
export interface IWorkerCapabilities {
  api_version: 'gpulayer/v1';
  cuda_driver: string | null;
  /**
   * @maxItems 256
   */
  devices: IDevice[];
  /**
   * torch.distributed backend a gang uses here; None: no gangs
   */
  dist_backend: ('nccl' | 'gloo') | null;
  frameworks: IFrameworks;
  host: IHostFacts;
  /**
   * why a probe step found nothing (never a crash)
   *
   * @maxItems 64
   */
  probe_errors: string[];
  /**
   * where the device facts came from: "torch", "nvml", "nvidia-smi", "simulated"
   *
   * @maxItems 64
   */
  probe_sources: string[];
  /**
   * what GPU jobs run on here, from the support matrix (capabilities/support.py)
   */
  runtime: 'cuda' | 'rocm' | 'mps' | 'sim' | 'cpu';
  simulated: boolean;
  workloads: ('command' | 'python')[];
}
/**
 * One accelerator. ``vendor == "sim"`` is a simulated GPU whose maths runs on the CPU.
 */
export interface IDevice {
  api_version: 'gpulayer/v1';
  compute_capability: string | null;
  index: number;
  /**
   * normalized kind, e.g. "h100", "a100", "l4", "m2", "sim"
   */
  kind: string;
  memory_bytes: number;
  name: string;
  /**
   * Apple silicon: memory shared with the CPU
   */
  unified_memory: boolean;
  uuid: string | null;
  vendor: 'nvidia' | 'amd' | 'apple' | 'sim' | 'cpu';
}
export interface IFrameworks {
  api_version: 'gpulayer/v1';
  cuda_available: boolean;
  device_count: number;
  /**
   * torch.distributed backends found, e.g. ["gloo", "nccl"]
   *
   * @maxItems 64
   */
  distributed_backends: string[];
  mps_available: boolean;
  /**
   * CUDA version torch was built with
   */
  torch_cuda: string | null;
  /**
   * ROCm (HIP) version torch was built with
   */
  torch_hip: string | null;
  torch_version: string | null;
}
export interface IHostFacts {
  api_version: 'gpulayer/v1';
  arch: string;
  cpus: number;
  hostname: string;
  memory_bytes: number;
  os: string;
  python: string;
}
/**
 * What a worker sees of the Jupyter hosts' disks (sent when it joins).
 */
export interface IWorkerShares {
  api_version: 'gpulayer/v1';
  /**
   * this machine's id
   */
  host: string;
  /**
   * @maxItems 64
   */
  shared: IPathMap[];
  /**
   * whether it takes synced workspaces
   */
  synced: boolean;
}
/**
 * A folder the worker shares with Jupyter hosts: ``here`` on theirs is ``there`` on it.
 */
export interface IPathMap {
  api_version: 'gpulayer/v1';
  here: string;
  there: string;
}
/**
 * The event log's current position: follow from here to see only what happens next.
 */
export interface IEventCursor {
  api_version: 'gpulayer/v1';
  cursor: string;
}
export interface IEventPage {
  api_version: 'gpulayer/v1';
  /**
   * where to follow on from: `<epoch>:<seq>`; the epoch changes with every control-plane start, so a cursor from before a restart is seen as such
   */
  cursor: string;
  events: IEvent[];
  next_since: number;
  /**
   * events before the cursor were dropped, or the cursor is from before a restart: refetch the lists, then follow from `cursor`
   */
  reset: boolean;
}
export interface IFinishReport {
  api_version: 'gpulayer/v1';
  artifacts: IArtifact[];
  /**
   * the attempt this report comes from (its assignment's `attempt`); a report from an attempt that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt
   */
  attempt: number | null;
  exit_code: number | null;
  reason: string | null;
  result: JsonValue;
  state: 'succeeded' | 'failed' | 'cancelled';
}
/**
 * One machine GPUlayer asked a provider for, from request to end.
 */
export interface IInstance {
  api_version: 'gpulayer/v1';
  /**
   * terminated as failed if not joined by then
   */
  boot_deadline: number;
  /**
   * dollars the provider itself reports for it, where it reports any
   */
  charge_reported: number | null;
  ended_at: number | null;
  /**
   * the provider's own id: a Slurm job id, host:pid, a fake machine id
   */
  external_id: string | null;
  /**
   * jobs it was launched for
   */
  for_jobs: string[];
  id: string;
  /**
   * when its worker last ran nothing
   */
  idle_since: number | null;
  joined_at: number | null;
  launched_at: number | null;
  offer: IOffer;
  provider: string;
  /**
   * why it failed, was preempted or terminated
   */
  reason: string | null;
  requested_at: number;
  state: InstanceState;
  /**
   * its single-use instance token (never the secret)
   */
  token_id: string | null;
  worker_id: string | null;
  /**
   * the name its worker joins with
   */
  worker_name: string;
}
/**
 * the offer it was launched from, as it was then
 */
export interface IOffer {
  api_version: 'gpulayer/v1';
  /**
   * typical seconds from launch to joined
   */
  boot_seconds: number;
  /**
   * most instances of this offer at once (an SSH host: 1)
   */
  capacity: number | null;
  cpus: number;
  /**
   * normalized kind, e.g. "a100"; "" with no GPUs
   */
  gpu_kind: string;
  /**
   * bytes per GPU
   */
  gpu_memory: number;
  gpus: number;
  labels: {
    [k: string]: string;
  };
  /**
   * the longest an instance may live (a batch job's time limit)
   */
  max_hours: number | null;
  memory_bytes: number;
  /**
   * the offer's name within its provider
   */
  name: string;
  /**
   * dollars per hour for the whole machine; 0 for owned hardware
   */
  price_per_hour: number;
  /**
   * the provider's name in the config
   */
  provider: string;
  region: string;
  /**
   * its worker advertises simulated GPUs
   */
  simulated: boolean;
}
export interface IInstanceList {
  api_version: 'gpulayer/v1';
  instances: IInstance[];
}
/**
 * One attempt of one job handed to one worker: the job, this worker's share, and secrets.
 */
export interface IJobAssignment {
  api_version: 'gpulayer/v1';
  /**
   * which attempt of the job this is (the job's `attempts` count when it was placed): the worker keys what it runs by (job id, attempt) and names it in every report; absent (an older control plane): the job's `attempts`
   */
  attempt: number;
  job: IJob;
  nnodes: number;
  node: INodePlacement;
  /**
   * resolved secret values; sent only to the worker
   */
  secrets: {
    [k: string]: string;
  };
}
/**
 * A job as it is now and its log records after ``since``: one page of following it.
 */
export interface IJobFollow {
  api_version: 'gpulayer/v1';
  /**
   * pass as `cursor` for the next page: it answers when the job changes after this point (a restart of the control plane counts as a change)
   */
  cursor: string;
  job: IJob;
  /**
   * more records are waiting: ask again at once
   */
  more: boolean;
  /**
   * pass as `since` for the next page
   */
  next_since: number;
  records: ILogRecord[];
}
export interface IJobList {
  api_version: 'gpulayer/v1';
  jobs: IJob[];
}
/**
 * What a worker says about one attempt of one job, in one go (applied in this order).
 */
export interface IJobReport {
  api_version: 'gpulayer/v1';
  /**
   * the attempt this report comes from (its assignment's `attempt`); a report from an attempt that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt
   */
  attempt: number | null;
  /**
   * its end; with `started` in the same report, the start and the end are recorded together (one write of the job)
   */
  finished: IFinishReport | null;
  job_id: string;
  /**
   * @maxItems 10000
   */
  lines: ILogLine[];
  progress: {
    [k: string]: JsonValue;
  } | null;
  /**
   * its process started (placed → running)
   */
  started: boolean;
}
export interface ILogBatch {
  api_version: 'gpulayer/v1';
  /**
   * the attempt this report comes from (its assignment's `attempt`); a report from an attempt that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt
   */
  attempt: number | null;
  /**
   * @maxItems 10000
   */
  lines: ILogLine[];
}
export interface ILogPage {
  api_version: 'gpulayer/v1';
  job_id: string;
  next_since: number;
  records: ILogRecord[];
  state: JobState;
}
/**
 * A machine a provider can launch, as the scheduler would see the worker on it.
 */
export interface IOffer1 {
  api_version: 'gpulayer/v1';
  /**
   * typical seconds from launch to joined
   */
  boot_seconds: number;
  /**
   * most instances of this offer at once (an SSH host: 1)
   */
  capacity: number | null;
  cpus: number;
  /**
   * normalized kind, e.g. "a100"; "" with no GPUs
   */
  gpu_kind: string;
  /**
   * bytes per GPU
   */
  gpu_memory: number;
  gpus: number;
  labels: {
    [k: string]: string;
  };
  /**
   * the longest an instance may live (a batch job's time limit)
   */
  max_hours: number | null;
  memory_bytes: number;
  /**
   * the offer's name within its provider
   */
  name: string;
  /**
   * dollars per hour for the whole machine; 0 for owned hardware
   */
  price_per_hour: number;
  /**
   * the provider's name in the config
   */
  provider: string;
  region: string;
  /**
   * its worker advertises simulated GPUs
   */
  simulated: boolean;
}
export interface IProgressReport {
  api_version: 'gpulayer/v1';
  /**
   * the attempt this report comes from (its assignment's `attempt`); a report from an attempt that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt
   */
  attempt: number | null;
  fields: {
    [k: string]: JsonValue;
  };
}
/**
 * What ``gpulayer providers`` says about one configured provider.
 */
export interface IProviderCheck {
  api_version: 'gpulayer/v1';
  /**
   * no launch before this (failures)
   */
  backoff_until: number | null;
  /**
   * what was checked, or why it failed
   */
  detail: string;
  /**
   * instances of it that are not ended
   */
  instances: number;
  kind: string;
  last_error: string | null;
  max_instances: number;
  name: string;
  offers: IOffer1[];
  ok: boolean;
}
export interface IProviderList {
  api_version: 'gpulayer/v1';
  /**
   * whether this control plane runs the autoscaler
   */
  autoscaling: boolean;
  /**
   * the provider config file read
   */
  config: string;
  providers: IProviderCheck[];
}
/**
 * One entry of a batch that was not taken: which, and why (the error's own fields).
 */
export interface IRefusal {
  api_version: 'gpulayer/v1';
  attempt: number | null;
  code: string;
  hint: string | null;
  index: number;
  job_id: string | null;
  message: string;
  status: number;
}
/**
 * Where the ranks of a multi-node gang meet: published by the rank-0 worker.
 */
export interface IRendezvous {
  api_version: 'gpulayer/v1';
  /**
   * the attempt this report comes from (its assignment's `attempt`); a report from an attempt that is no longer current is refused with 409 `stale_attempt`; absent: the current attempt
   */
  attempt: number | null;
  master_addr: string;
  master_port: number;
}
/**
 * The entries of a report batch that were refused (none: the answer is 204).
 */
export interface IReportAnswer {
  api_version: 'gpulayer/v1';
  refused: IRefusal[];
}
/**
 * Reports about several attempts; each entry is a :class:`JobReport`, checked on its own.
 */
export interface IReportBatch {
  api_version: 'gpulayer/v1';
  /**
   * @maxItems 1000
   */
  reports: JsonValue[];
}
/**
 * Submit a job and follow it in the same request.
 */
export interface IRunRequest {
  api_version: 'gpulayer/v1';
  /**
   * the spec's bundle itself, base64, when the control plane may lack it (at most 1 MiB; larger ones are uploaded with PUT /bundles/{sha256} first)
   */
  bundle: string | null;
  spec: IJobSpec;
}
export interface ISessionList {
  api_version: 'gpulayer/v1';
  sessions: ISessionInfo[];
}
/**
 * A change of a session's processes outside a cell: up again after a restart, or broken.
 */
export interface ISessionReport {
  api_version: 'gpulayer/v1';
  attempt: number | null;
  reason: string | null;
  status: 'ready' | 'broken';
}
/**
 * What ``%gpulayer session start`` asks for; the control plane makes it a session's job.
 */
export interface ISessionSpec {
  api_version: 'gpulayer/v1';
  env: {
    [k: string]: string;
  };
  holder: ISessionHolder;
  idle_timeout: number;
  /**
   * a GPU kernel (ADR 0021): started by a kernel provisioner, not cells
   */
  kernel: boolean;
  labels: {
    [k: string]: string;
  };
  /**
   * unique among live sessions
   */
  name: string;
  resources: IResources;
  secrets: string[];
  wait_for_capacity: boolean;
  /**
   * the notebook's folder, where the ranks run (ADR 0022)
   */
  workspace: IWorkspaceSource | null;
}
/**
 * The jobs of a batch that were queued (in the order given) and the entries refused.
 */
export interface ISubmitAnswer {
  api_version: 'gpulayer/v1';
  jobs: IJob[];
  refused: IRefusal[];
}
/**
 * Several jobs in one request (a sweep); each entry is a JobSpec, checked on its own.
 */
export interface ISubmitBatch {
  api_version: 'gpulayer/v1';
  /**
   * @maxItems 1000
   */
  specs: JsonValue[];
}
/**
 * The answer to a worker's long-poll: new jobs to start and jobs to stop.
 */
export interface IWork {
  api_version: 'gpulayer/v1';
  assignments: IJobAssignment[];
  /**
   * protocol 1.1: small bundles of these assignments, base64 by sha256, so the worker need not fetch them (never sent to a worker that did not say 1.1)
   */
  bundles: {
    [k: string]: string;
  };
  /**
   * jobs to stop, whichever attempt of them runs here
   */
  cancel: string[];
  /**
   * session cells to run (ADR 0019), in order
   */
  cells: ICellAssignment[];
  /**
   * sessions whose running cell to interrupt (KeyboardInterrupt on every rank)
   */
  interrupts: string[];
  /**
   * sessions whose processes to kill and start again (their state is lost)
   */
  restarts: string[];
  /**
   * stale attempts to stop and drop: the job moved on (it was retried, or ended), so their reports are refused; a current attempt of the same job keeps running
   */
  stop: IAttemptRef[];
}
/**
 * A cell for one worker of a session to run on its ranks.
 */
export interface ICellAssignment {
  api_version: 'gpulayer/v1';
  number: number;
  request: ICellRequest;
  /**
   * a cell of the control plane's previous life: do not run it; report it (again) if it ran here, as not run if it never came (left out when false)
   */
  resume: boolean;
  session_id: string;
}
/**
 * One attempt of one job (a job's attempts share its id).
 */
export interface IAttemptRef {
  api_version: 'gpulayer/v1';
  attempt: number;
  job_id: string;
}
/**
 * What a worker sends when it joins.
 */
export interface IWorkerRegistration {
  address: string | null;
  api_version: 'gpulayer/v1';
  capabilities: IWorkerCapabilities;
  labels: {
    [k: string]: string;
  };
  name: string;
  /**
   * its host id and shared folders (ADR 0022); left out when none
   */
  shares: IWorkerShares | null;
  transport: 'inprocess' | 'http';
}
