/**
 * JupyterLab plugin: the "Model Debugger" panel in the right sidebar, following the active
 * notebook's kernel over the `model_debugger` comm.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';

import { DebuggerPanel } from './panel';
import { openAt, revealCellLinks } from './reveal';

const ICON_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M3 20h18v2H3z"/>
    <path d="M4 18l4.5-7 3.5 4 3-6 5 9z" opacity="0.35"/>
    <path d="M4 3h2v13.6l4.2-6.3 3.6 4.1 3.9-7.8L21 12.4V16l-3.4-5.6-3.6 7.2-3.7-4.2L5 18H4z"/>
    <circle cx="18" cy="5" r="2.4"/>
  </g>
</svg>`;

export const modelDebuggerIcon = new LabIcon({ name: 'model-debugger:icon', svgstr: ICON_SVG });

const FIX_TEMPLATE = '%%fix\n# the changed training code: one change, for the confirmed finding\n';

async function exportViaServer(sessionPath: string): Promise<{ notebook: string; repro: string }> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'model-debugger', 'export');
  const response = await ServerConnection.makeRequest(
    url,
    { method: 'POST', body: JSON.stringify({ session: sessionPath }) },
    settings
  );
  const data = await response.json();
  if (!response.ok) {
    throw new Error(data.message || response.statusText);
  }
  return data;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'model-debugger:sidebar',
  description: 'The Model Debugger sidebar panel.',
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker) => {
    const panel = new DebuggerPanel({
      openFile: (path: string, line: number | null) => openAt(app, path, line),
      insertFixCell: (nb: NotebookPanel, source?: string) => {
        NotebookActions.insertBelow(nb.content);
        nb.content.activeCell?.model.sharedModel.setSource(source ?? FIX_TEMPLATE);
        nb.content.activeCell?.editor?.focus();
      },
      exportViaServer
    });
    panel.title.icon = modelDebuggerIcon;
    panel.title.caption = 'Model Debugger';
    app.shell.add(panel, 'right', { rank: 900 });

    const follow = () => panel.setNotebook(tracker.currentWidget);
    tracker.currentChanged.connect(follow);
    follow();
    revealCellLinks(tracker);

    app.commands.addCommand('model-debugger:open', {
      label: 'Show the Model Debugger panel',
      icon: modelDebuggerIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    app.commands.addCommand('model-debugger:export', {
      label: 'Export the Model Debugger session',
      execute: () => panel.exportSession()
    });
  }
};

export default plugin;
