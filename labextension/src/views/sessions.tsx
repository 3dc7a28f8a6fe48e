/**
 * The panel's Sessions section (ADR 0019): each live session with the notebook that holds it,
 * its GPUs, how long it has been idle and when its idle timeout ends it, and buttons to
 * interrupt its running cell or stop it (which frees its GPUs). A GPU kernel (ADR 0021) is a
 * session too, marked "kernel".
 */
import * as React from 'react';

import type { ISessionInfo, IWorkspaceView } from '../api';
import {
  formatHolder,
  formatPlacement,
  formatSessionClock,
  formatSessionUse,
  shortId
} from '../model';
import type { ISessionActions } from './actions';

const TONE: Record<ISessionInfo['status'], string> = {
  waiting: 'idle',
  idle: 'ok',
  busy: 'live',
  broken: 'bad',
  ended: 'idle'
};

export function SessionList(props: {
  sessions: readonly ISessionInfo[];
  now: number;
  actions: ISessionActions;
}): JSX.Element {
  if (props.sessions.length === 0) {
    return (
      <p className="gl-Empty">
        No session. Start one in a notebook with{' '}
        <code>%gpulayer session start --gpus 1</code>: its GPUs keep your
        variables between cells.
      </p>
    );
  }
  return (
    <ul className="gl-List">
      {props.sessions.map(s => (
        <SessionRow
          key={s.id}
          session={s}
          now={props.now}
          actions={props.actions}
        />
      ))}
    </ul>
  );
}

/** How a session's folder is made (ADR 0022): the words `gpulayer sessions` uses too. */
const WORKSPACE_WORDS: Record<IWorkspaceView['mode'], string> = {
  in_place: 'in place',
  synced: 'synced',
  none: 'no workspace'
};

function workspaceTitle(w: IWorkspaceView): string {
  const where = w.path ? ` (there: ${w.path})` : '';
  return `${w.folder ?? ''}${where}: ${w.reason}`;
}

function SessionRow(props: {
  session: ISessionInfo;
  now: number;
  actions: ISessionActions;
}): JSX.Element {
  const { session: s, now, actions } = props;
  const placement = formatPlacement(s.job) || 'not placed yet';
  const notebook = s.holder.notebook;
  return (
    <li
      className="gl-Row gl-Session"
      data-session={s.name}
      data-status={s.status}
      data-kind={s.kernel ? 'kernel' : 'session'}
    >
      <div className="gl-Row-head">
        <span className="gl-Row-name">{s.name}</span>
        <span className="gl-Id">{shortId(s.id)}</span>
        {s.kernel && (
          <span
            className="gl-Badge gl-mod-idle"
            data-testid="session-kind"
            title="a GPU kernel: the whole notebook runs on its GPUs"
          >
            kernel
          </span>
        )}
        {s.workspace && (
          <span
            className="gl-Badge gl-mod-idle"
            data-testid="session-workspace"
            data-mode={s.workspace.mode}
            title={workspaceTitle(s.workspace)}
          >
            {WORKSPACE_WORDS[s.workspace.mode]}
          </span>
        )}
        <span
          className={`gl-Badge gl-mod-${TONE[s.status]}`}
          data-state={s.status}
        >
          {s.status}
        </span>
      </div>
      <div className="gl-Row-meta" data-testid="session-holder">
        held by {formatHolder(s)} · {formatSessionUse(s)}
      </div>
      <div className="gl-Row-meta">{placement}</div>
      <div className="gl-Row-meta" data-testid="session-clock">
        {formatSessionClock(s, now)}
      </div>
      {s.reason && <div className="gl-Row-meta gl-Reason">{s.reason}</div>}
      <div className="gl-Actions">
        {notebook && (
          <button
            className="gl-Button"
            onClick={() => actions.openNotebook(notebook)}
            title={notebook}
            aria-label={`Open notebook ${notebook}`}
          >
            Notebook
          </button>
        )}
        {s.status === 'busy' && (
          <button
            className="gl-Button"
            onClick={() => actions.interruptSession(s)}
            aria-label={`Interrupt session ${s.name}`}
          >
            Interrupt
          </button>
        )}
        <button
          className="gl-Button gl-mod-danger"
          onClick={() => actions.stopSession(s)}
          aria-label={`Stop session ${s.name}`}
        >
          Stop
        </button>
      </div>
    </li>
  );
}
