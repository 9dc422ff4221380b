/**
 * lancefn-jupyter JupyterLab extension: the "GPU Functions" left side panel.
 *
 * The panel talks only to the lancefn server extension (`<base_url>/lancefn/`), which proxies to
 * the control plane and adds its API key server-side: the key never reaches the browser, and the
 * panel keeps working while a kernel is busy.
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

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'GPU Functions side panel: GPU classes, live jobs with Cancel, function versions.',
  autoStart: true,
  requires: [ICommandPalette],
  optional: [ILayoutRestorer, ISettingRegistry, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    notebooks: INotebookTracker | null
  ) => {
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
    palette.addItem({ command: CommandIDs.open, category: 'GPU Functions' });

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
