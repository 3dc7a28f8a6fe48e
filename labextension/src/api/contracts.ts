/**
 * What the contracts say beyond their shapes: the types generated from the Python contracts
 * (`contracts.generated.ts`), re-exported under the names the panel uses, and the few
 * values the server gives a fixed meaning to (final job states, labels, sentinels).
 */
import type { JobState } from './contracts.generated';

// The contracts, generated from `gpulayer_kernel/contracts/schema.json` (see that file's
// header); only the values below are written by hand.
export type {
  IAttemptRecord,
  IDevice,
  IEvent,
  IEventCursor,
  IEventPage,
  IJob,
  IJobList,
  IJobSpec,
  ILogPage,
  ILogRecord,
  INodePlacement,
  IPlacementReport,
  ISessionInfo,
  ISessionList,
  IWorkerInfo,
  IWorkspaceView,
  JobState,
  JsonValue,
  WorkerState
} from './contracts.generated';

/**
 * Whether each job state is final. A record, not a list, so a state added to the contracts
 * fails `tsc` here until someone says whether it is final (the job table's rule in Python).
 */
const FINAL: Readonly<Record<JobState, boolean>> = {
  queued: false,
  placed: false,
  running: false,
  succeeded: true,
  failed: true,
  cancelled: true,
  lost: true
};

export const TERMINAL_STATES: ReadonlySet<JobState> = new Set(
  (Object.keys(FINAL) as JobState[]).filter(state => FINAL[state])
);

/** The label the `%%gpulayer` magic puts on a job: the notebook that submitted it. */
export const NOTEBOOK_LABEL = 'gpulayer.io/notebook';

/**
 * What a user reads in a worker's `device_jobs` for a device another user's job holds
 * (`HIDDEN_JOB` in `gpulayer_kernel/contracts/workers.py`; tests/test_panel_contracts.py
 * checks the two agree): the device is busy, and whose work it is is not theirs to know.
 */
export const HIDDEN_JOB = 'hidden';
