/**
 * Reveal a finding's line: a line of the notebook's `%%reproduce` or `%%fix` cell, or a file
 * opened in JupyterLab's editor at the line.
 *
 * Used by the sidebar (its finding locations) and by the findings view in cell outputs, whose
 * cell locations are `<a class="md-location" data-md-cell="reproduce" data-md-line="7">`:
 * a click there reveals that cell of the notebook the output belongs to.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

export type CellKind = 'reproduce' | 'fix';

/**
 * Make the last `%%reproduce` (or `%%fix`) cell active, scroll to it and put the cursor on
 * `line` (a line of the cell's code: the magic's own line is the editor's line 0, so the
 * code's 1-based line N is the editor's 0-based line N). False when there is no such cell.
 */
export async function revealCell(
  panel: NotebookPanel,
  kind: CellKind,
  line: number | null
): Promise<boolean> {
  const magic = kind === 'fix' ? '%%fix' : '%%reproduce';
  const cells = panel.content.widgets;
  for (let i = cells.length - 1; i >= 0; i--) {
    const src = cells[i].model.sharedModel.getSource();
    if (src.startsWith(magic)) {
      panel.content.activeCellIndex = i;
      // a windowed notebook renders the cell (and its editor) once it is scrolled to
      await panel.content.scrollToItem(i).catch(() => undefined);
      await cells[i].ready;
      const editor = cells[i].editor;
      if (editor && line) {
        const position = { line: Math.max(0, line), column: 0 };
        editor.setCursorPosition(position);
        editor.revealPosition(position);
      }
      return true;
    }
  }
  return false;
}

/** Open `path` (relative to the server root) in the editor with the cursor on 1-based `line`. */
export async function openAt(app: JupyterFrontEnd, path: string, line: number | null): Promise<void> {
  const widget = (await app.commands.execute('docmanager:open', { path })) as
    | { setFragment?: (fragment: string) => void }
    | undefined;
  if (widget?.setFragment && line && line > 0) {
    widget.setFragment(`#line=${line - 1}`); // the editor's 0-based line (RFC 5147)
  }
}

/** Clicks on cell locations in the findings view of any notebook output reveal the cell. */
export function revealCellLinks(tracker: INotebookTracker): void {
  document.addEventListener(
    'click',
    (event: MouseEvent) => {
      const target = event.target as HTMLElement | null;
      const link = target?.closest?.('a.md-location[data-md-cell]') as HTMLElement | null;
      if (!link) {
        return;
      }
      const kind = link.dataset.mdCell === 'fix' ? 'fix' : 'reproduce';
      const line = parseInt(link.dataset.mdLine ?? '', 10);
      const panel = tracker.find(p => p.node.contains(link)) ?? tracker.currentWidget;
      if (panel) {
        event.preventDefault();
        void revealCell(panel, kind, Number.isFinite(line) ? line : null);
      }
    },
    true
  );
}
