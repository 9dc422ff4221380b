/**
 * lancefn-jupyter JupyterLab extension: the "GPU Functions" left side panel.
 *
 * The panel talks only to the lancefn server extension (`<base_url>/lancefn/`), which proxies to
 * the control plane and adds its API key server-side: the key never reaches the browser, and the
 * panel keeps working while a kernel is busy.
 *
 * It runs in every front end that loads JupyterLab extensions (docs/ARCHITECTURE.md, "Front ends"): it
 * requires nothing, so it activates in JupyterLab, Notebook 7 (View → Left Sidebar → Show GPU Functions)
 * and Voilà alike; the palette, restorer, settings and notebook tracker are used where the front end has
 * them. A shell without a left area (Voilà's) gets no panel and opens no connection.
 */

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { IEventSourceLike, LiveConnection } from './connection';
import { CodeInserter, GpuFunctionsPanel } from './panel';

const PLUGIN_ID = 'lancefn-jupyter:plugin';

export namespace CommandIDs {
  export const open = 'lancefn-jupyter:open';
}

/** Insert `code` as a new code cell below the active cell of the current notebook, and show it. */
function notebookInserter(app: JupyterFrontEnd, tracker: INotebookTracker): CodeInserter {
  return code => {
    const current = tracker.currentWidget;
    if (!current) {
      return false;
    }
    const notebook = current.content;
    NotebookActions.insertBelow(notebook);
    const cell = notebook.activeCell;
    if (!cell) {
      return false;
    }
    cell.model.sharedModel.setSource(code);
    app.shell.activateById(current.id);
    return true;
  };
}

function makeConnection(jobsLimit: number): LiveConnection {
  const settings = ServerConnection.makeSettings();
  return new LiveConnection(
    {
      baseUrl: settings.baseUrl,
      token: settings.token,
      request: (url, init) => ServerConnection.makeRequest(url, init, settings),
      eventSource: url =>
        new EventSource(url, { withCredentials: true }) as unknown as IEventSourceLike
    },
    { jobsLimit }
  );
}

/**
 * Whether the shell has a left side area: JupyterLab's and Notebook 7's shells can collapse it, Voilà's
 * has none (its `add(..., 'left')` only warns "Area left is not implemented yet!").
 */
export function hasLeftArea(shell: JupyterFrontEnd.IShell): boolean {
  return typeof (shell as { collapseLeft?: unknown }).collapseLeft === 'function';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU Functions side panel: GPU classes, live jobs with Cancel, function versions.',
  autoStart: true,
  requires: [],
  optional: [ICommandPalette, ILayoutRestorer, ISettingRegistry, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null
  ) => {
    if (!hasLeftArea(app.shell)) {
      return;
    }
    const connection = makeConnection(50);
    const panel = new GpuFunctionsPanel(
      connection,
      notebooks ? notebookInserter(app, notebooks) : null
    );
    panel.title.label = '';
    app.shell.add(panel, 'left', { rank: 600, type: 'GPU Functions' });

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open GPU Functions Panel',
      caption: 'Show GPU classes, live jobs and function versions (lancefn)',
      execute: () => {
        app.shell.activateById(panel.id);
      }
    });
    if (palette) {
      palette.addItem({ command: CommandIDs.open, category: 'GPU Functions' });
    }

    if (restorer) {
      restorer.add(panel, 'lancefn-gpu-functions');
    }

    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          const apply = () => {
            const limit = settings.get('jobsLimit').composite;
            if (typeof limit === 'number') {
              connection.jobsLimit = limit;
            }
          };
          apply();
          settings.changed.connect(apply);
        })
        .catch(reason => {
          console.warn('lancefn-jupyter: could not load settings', reason);
        });
    }
  }
};

export default plugin;
