/**
 * What the views' buttons ask for. The views only call these; index.ts wires them to
 * JupyterLab commands, so a button and the command palette do the same thing.
 */
import type { IJob, ISessionInfo } from '../api';

/** What a session row's buttons do. */
export interface ISessionActions {
  stopSession(session: ISessionInfo): void;
  interruptSession(session: ISessionInfo): void;
  openNotebook(path: string): void;
}

/** What the panel's and the log view's buttons do. */
export interface IPanelActions extends ISessionActions {
  openLogs(jobId: string): void;
  cancel(job: IJob): void;
  openNotebook(path: string): void;
  copy(text: string): void;
}
