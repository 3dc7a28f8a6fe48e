/**
 * The GPUlayer JupyterLab extension: the sidebar panel, job log tabs, and the commands
 * notebooks and other extensions use (`gpulayer:show-job {id}` focuses a job in the panel).
 *
 * The sources are in three layers, as on the Python side: `api/` (the contracts and the HTTP
 * calls), `model/` (the live state and the pure shaping of it, no DOM) and `views/` (React);
 * this entry wires them to JupyterLab's commands. A layer imports only the ones before it.
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Clipboard,
  Dialog,
  ICommandPalette,
  MainAreaWidget,
  Notification,
  WidgetTracker,
  showDialog
} from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import type { Session } from '@jupyterlab/services';
import type { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { APIError, GPUlayerAPI, IJob, ISessionInfo } from './api';
import {
  GPUlayerModel,
  IKernelEnd,
  cancelDialogText,
  findJob,
  kernelEnds,
  notebookPath,
  shortId,
  waitingKernels
} from './model';
import type { IPanelActions } from './views/actions';
import { gpulayerIcon } from './views/icon';
import { LogView } from './views/logview';
import { GPUlayerPanel, PANEL_ID } from './views/panel';

/** The commands this extension adds; `gpulayer:show-job {id}` is for notebooks and others. */
export const CommandIDs = {
  openPanel: 'gpulayer:open-panel',
  showJob: 'gpulayer:show-job',
  openLogs: 'gpulayer:open-logs',
  cancelJob: 'gpulayer:cancel-job',
  stopSession: 'gpulayer:stop-session'
} as const;

/**
 * A notice for each GPU kernel that waits for its GPUs, saying the queue's sentence, updated as
 * it changes and dismissed once the kernel is placed or gives up (ADR 0021): JupyterLab itself
 * shows only "Starting" while a kernel provisioner waits.
 */
function showKernelWaits(
  model: GPUlayerModel,
  showJob: (id: string) => void
): void {
  const shown = new Map<string, { note: string; text: string }>();
  model.changed.connect(() => {
    const waits = waitingKernels(model.state);
    const live = new Set(waits.map(w => w.id));
    for (const [id, { note }] of shown) {
      if (!live.has(id)) {
        Notification.dismiss(note);
        shown.delete(id);
      }
    }
    for (const w of waits) {
      // Short, with the sentence first after the notebook: a toast shows 140 characters.
      const text = `${w.holder} waits for GPUs: ${w.sentence}`;
      const was = shown.get(w.id);
      if (was === undefined) {
        const note = Notification.emit(text, 'in-progress', {
          autoClose: false,
          actions: [
            { label: 'Show in GPUlayer', callback: () => showJob(w.job) }
          ]
        });
        shown.set(w.id, { note, text });
      } else if (was.text !== text) {
        Notification.update({ id: was.note, message: text });
        shown.set(w.id, { note: was.note, text });
      }
    }
  });
}

/**
 * A notice when a GPU kernel of this Lab's notebooks ends on purpose (idle past its timeout, or
 * stopped elsewhere), as Colab's "disconnected" one: the kernel stays in Jupyter and answers
 * each cell with the reason, and its "Restart kernel" button is the way to a GPU again (a new
 * session). Only kernels a notebook of this Jupyter server still uses are told: a kernel the user
 * shut down is gone from Jupyter by the time its session ends.
 */
function showKernelEnds(
  model: GPUlayerModel,
  sessions: Session.IManager
): void {
  let watched = new Map<string, ISessionInfo>();
  model.changed.connect(() => {
    const { ended, watching } = kernelEnds(model.state, watched);
    watched = watching;
    for (const end of ended) {
      void tellKernelEnd(end, sessions);
    }
  });
}

async function tellKernelEnd(
  end: IKernelEnd,
  sessions: Session.IManager
): Promise<void> {
  if (!end.kernel) {
    return;
  }
  await sessions.refreshRunning();
  const model = [...sessions.running()].find(s => s.kernel?.id === end.kernel);
  if (!model) {
    return; // shut down in Jupyter, or another server's kernel
  }
  Notification.warning(`${end.holder}'s GPU kernel: ${end.reason}`, {
    autoClose: false,
    actions: [
      {
        label: 'Restart kernel',
        caption:
          'Start a new GPU session for this notebook (its variables are gone)',
        callback: () => {
          const session = sessions.connectTo({ model });
          session.kernel?.restart().then(
            () => session.dispose(),
            error => {
              session.dispose();
              Notification.error(
                `GPUlayer: could not restart the kernel: ${message(error)}`,
                { autoClose: 5000 }
              );
            }
          );
        }
      }
    ]
  });
}

function jobIdArg(args: ReadonlyPartialJSONObject): string {
  const id = args.id;
  if (typeof id !== 'string' || !id) {
    throw new Error('this command needs a job id: {"id": "<job id>"}');
  }
  return id;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@gpulayer/jupyterlab:plugin',
  description: 'GPUlayer sidebar: workers, GPUs, queue, jobs and live logs.',
  autoStart: true,
  optional: [ILayoutRestorer, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ): void => {
    const { commands, shell } = app;
    const model = new GPUlayerModel({ api: GPUlayerAPI.forServer() });
    const logs = new WidgetTracker<MainAreaWidget<LogView>>({
      namespace: 'gpulayer-logs'
    });

    const resolveJob = async (id: string): Promise<IJob> =>
      findJob(model.state, id) ?? (await model.api.job(id));

    const actions: IPanelActions & { showInPanel(id: string): void } = {
      openLogs: id => void commands.execute(CommandIDs.openLogs, { id }),
      cancel: job =>
        void commands.execute(CommandIDs.cancelJob, { id: job.id }),
      openNotebook: label => {
        const path = notebookPath(label, PageConfig.getOption('serverRoot'));
        if (path === null) {
          Notification.warning(
            `GPUlayer: the notebook ${label} is outside this server's folder`,
            { autoClose: 5000 }
          );
          return;
        }
        void commands.execute('docmanager:open', { path });
      },
      copy: text => {
        Clipboard.copyToSystem(text);
        Notification.info('Copied to the clipboard', { autoClose: 2000 });
      },
      showInPanel: id => void commands.execute(CommandIDs.showJob, { id }),
      stopSession: session =>
        void commands.execute(CommandIDs.stopSession, { id: session.id }),
      interruptSession: session => {
        model.api.interruptSession(session.id).then(
          info => model.noteSession(info),
          error =>
            Notification.error(
              `GPUlayer: could not interrupt: ${message(error)}`,
              { autoClose: 5000 }
            )
        );
      }
    };

    const panel = new GPUlayerPanel(model, actions);
    shell.add(panel, 'left', { rank: 700 });
    restorer?.add(panel, PANEL_ID);
    model.start();
    showKernelWaits(model, id => actions.showInPanel(id));
    showKernelEnds(model, app.serviceManager.sessions);

    commands.addCommand(CommandIDs.openPanel, {
      label: 'GPUlayer: Show Workers, Queue and Jobs',
      icon: gpulayerIcon,
      execute: () => shell.activateById(panel.id)
    });

    commands.addCommand(CommandIDs.showJob, {
      label: args =>
        `GPUlayer: Show Job ${typeof args.id === 'string' ? shortId(args.id) : ''}`,
      describedBy: {
        args: {
          type: 'object',
          properties: {
            id: { type: 'string', description: 'job id or unique prefix' }
          },
          required: ['id']
        }
      },
      execute: async args => {
        const id = jobIdArg(args);
        shell.activateById(panel.id);
        try {
          const job = await resolveJob(id);
          if (!model.state.jobs.has(job.id)) {
            model.noteJob(job);
          }
          panel.focusJob(job.id);
        } catch (error) {
          Notification.error(`GPUlayer: ${message(error)}`, {
            autoClose: 5000
          });
        }
      }
    });

    commands.addCommand(CommandIDs.openLogs, {
      label: args =>
        `GPUlayer: Job Logs ${typeof args.id === 'string' ? shortId(args.id) : ''}`,
      execute: async args => {
        const id =
          (await resolveJob(jobIdArg(args)).catch(() => null))?.id ??
          jobIdArg(args);
        const open = logs.find(w => w.content.jobId === id);
        if (open) {
          shell.activateById(open.id);
          return open;
        }
        const content = new LogView(model, id, actions);
        const widget = new MainAreaWidget({ content });
        widget.id = `gpulayer-logs-${id}`;
        widget.title.label = `Job ${shortId(id)}`;
        widget.title.icon = gpulayerIcon;
        widget.title.closable = true;
        const job = findJob(model.state, id);
        if (job) {
          widget.title.label = `${job.spec.name} · ${shortId(id)}`;
        }
        widget.title.caption = `GPUlayer job ${id}: logs`;
        await logs.add(widget);
        shell.add(widget, 'main');
        shell.activateById(widget.id);
        return widget;
      }
    });

    commands.addCommand(CommandIDs.cancelJob, {
      label: 'GPUlayer: Cancel Job…',
      execute: async args => {
        const id = jobIdArg(args);
        try {
          const job = await resolveJob(id);
          const words = cancelDialogText(job);
          const answer = await showDialog({
            title: 'Cancel this job?',
            body: words.body,
            buttons: [
              Dialog.cancelButton({ label: words.keep }),
              Dialog.warnButton({ label: 'Cancel job' })
            ]
          });
          if (!answer.button.accept) {
            return;
          }
          model.noteJob(await model.api.cancel(job.id));
        } catch (error) {
          Notification.error(`GPUlayer: could not cancel: ${message(error)}`, {
            autoClose: 5000
          });
        }
      }
    });

    commands.addCommand(CommandIDs.stopSession, {
      label: 'GPUlayer: Stop Session…',
      execute: async args => {
        const id = jobIdArg(args);
        const session = model.state.sessions.get(id);
        const name = session?.name ?? shortId(id);
        const answer = await showDialog({
          title: `Stop session ${name}?`,
          body:
            'Its processes end and its GPUs are freed; the variables it holds are lost. ' +
            'The notebook can start a new session.',
          buttons: [
            Dialog.cancelButton({ label: 'Keep it' }),
            Dialog.warnButton({ label: 'Stop session' })
          ]
        });
        if (!answer.button.accept) {
          return;
        }
        try {
          model.noteSession(await model.api.stopSession(id));
        } catch (error) {
          Notification.error(`GPUlayer: could not stop: ${message(error)}`, {
            autoClose: 5000
          });
        }
      }
    });

    palette?.addItem({ command: CommandIDs.openPanel, category: 'GPUlayer' });

    if (restorer) {
      void restorer.restore(logs, {
        command: CommandIDs.openLogs,
        args: w => ({ id: w.content.jobId }),
        name: w => w.content.jobId
      });
    }
  }
};

function message(error: unknown): string {
  if (error instanceof APIError) {
    return error.hint ? `${error.message} (${error.hint})` : error.message;
  }
  return error instanceof Error ? error.message : String(error);
}

export default plugin;
