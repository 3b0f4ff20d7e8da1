/**
 * The "Model Debugger" sidebar: a view of the kernel's session snapshot, nothing more.
 *
 * It renders the phase tracker (Fix is enabled only when `report.fix_allowed`; every blocked
 * phase shows its gate's reason), the classification with its numbers, the findings with
 * file:line (click: reveal the cell or open the file), fix and verify status, and Export.
 */
import { PathExt } from '@jupyterlab/coreutils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { Widget } from '@lumino/widgets';

import { ConnectionState, KernelConnection } from './connection';
import { revealCell } from './reveal';
import { Finding, PhaseStatus, Report, Running, Snapshot } from './snapshot';

export const PHASES = ['reproduce', 'classify', 'isolate', 'fix', 'verify'] as const;

export interface IPanelActions {
  /** Open a file (path relative to the server root) in JupyterLab, at a 1-based line. */
  openFile(path: string, line: number | null): Promise<void>;
  /** Insert a `%%fix` cell below the active cell of the notebook (`source`: its text). */
  insertFixCell(panel: NotebookPanel, source?: string): void;
  /** Export through the REST endpoint (when the kernel cannot). */
  exportViaServer(sessionPath: string): Promise<{ notebook: string; repro: string }>;
}

interface IExportResult {
  notebook: string;
  repro: string;
  relative: { notebook: string; repro: string };
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function num(value: unknown): string {
  if (typeof value === 'number') {
    const size = Math.abs(value);
    if (size !== 0 && (size >= 1e6 || size < 1e-3)) {
      return value.toExponential(3);
    }
    return Number.isInteger(value) ? String(value) : String(Number(value.toPrecision(4)));
  }
  return value === null || value === undefined ? '—' : String(value);
}

export class DebuggerPanel extends Widget {
  constructor(private readonly actions: IPanelActions) {
    super();
    this.id = 'model-debugger-panel';
    this.addClass('jp-ModelDebugger');
    this.node.tabIndex = 0;
    this.render();
  }

  /** Follow this notebook (null: no notebook is active). */
  setNotebook(panel: NotebookPanel | null): void {
    if (panel === this._notebook) {
      return;
    }
    this._connection?.dispose();
    this._connection = null;
    this._notebook = panel;
    this._status = '';
    if (panel) {
      this._connection = new KernelConnection(panel.sessionContext);
      this._connection.changed.connect(() => this.render());
      panel.disposed.connect(() => {
        if (this._notebook === panel) {
          this.setNotebook(null);
        }
      });
    }
    this.render();
  }

  get connection(): KernelConnection | null {
    return this._connection;
  }

  render(): void {
    const root = this.node;
    root.textContent = '';
    const header = el('div', 'jp-ModelDebugger-header');
    header.appendChild(el('h2', 'jp-ModelDebugger-title', 'Model Debugger'));
    const state: ConnectionState | 'no-notebook' = this._connection
      ? this._connection.state
      : 'no-notebook';
    const badge = el('span', 'jp-ModelDebugger-state', state);
    badge.dataset.state = state;
    header.appendChild(badge);
    root.appendChild(header);
    root.dataset.state = state;
    if (this._notebook) {
      root.appendChild(el('div', 'jp-ModelDebugger-notebook', this._notebook.context.path));
    }
    const message = this._message(state);
    if (message) {
      root.appendChild(message);
    }
    const snapshot = this._connection?.snapshot ?? null;
    const report = snapshot?.report ?? null;
    root.appendChild(this._tracker(report));
    if (snapshot?.running) {
      root.appendChild(this._running(snapshot.running));
    }
    if (snapshot && report) {
      root.appendChild(this._classification(report));
      root.appendChild(this._findings(snapshot, report));
      root.appendChild(this._fixVerify(report));
    } else if (state === 'connected') {
      root.appendChild(
        el('p', 'jp-ModelDebugger-empty', 'No session yet: run a %%reproduce cell.')
      );
    }
    const actions = el('div', 'jp-ModelDebugger-actions');
    const exportButton = el('button', 'jp-mod-styled jp-ModelDebugger-export', 'Export');
    exportButton.disabled = !report || this._busy;
    exportButton.title = report
      ? 'Write the session record notebook and repro.py'
      : 'Nothing to export yet';
    exportButton.onclick = () => void this.exportSession();
    actions.appendChild(exportButton);
    root.appendChild(actions);
    if (this._status) {
      root.appendChild(el('div', 'jp-ModelDebugger-status', this._status));
    }
  }

  /** Ask the kernel to export (falls back to the server's REST endpoint). */
  async exportSession(): Promise<void> {
    const snapshot = this._connection?.snapshot;
    const report = snapshot?.report;
    if (!report || !snapshot) {
      return;
    }
    this._busy = true;
    this._status = 'exporting…';
    this.render();
    try {
      if (this._connection?.state === 'connected') {
        const result = await this._connection.request<IExportResult>('export');
        this._status = `exported: ${result.relative.notebook}, ${result.relative.repro}`;
      } else {
        const session = this._serverPath(snapshot, report.session_dir);
        if (!session) {
          throw new Error('the session folder is outside the server root');
        }
        const result = await this.actions.exportViaServer(session);
        this._status = `exported (server): ${result.notebook}, ${result.repro}`;
      }
    } catch (e) {
      this._status = `export failed: ${(e as Error).message}`;
    } finally {
      this._busy = false;
      this.render();
    }
  }

  /** An absolute kernel path as a path relative to the server root, when we can tell. */
  private _serverPath(snapshot: Snapshot, file: string): string | null {
    if (!this._notebook) {
      return null;
    }
    const cwd = snapshot.cwd.replace(/\/+$/, '');
    const notebookDir = PathExt.dirname(this._notebook.context.path);
    let inside: string | null = null;
    if (!file.startsWith('/')) {
      inside = file;
    } else if (file.startsWith(cwd + '/')) {
      inside = file.slice(cwd.length + 1);
    }
    if (inside === null) {
      return null;
    }
    const joined = PathExt.normalize(PathExt.join(notebookDir, inside));
    return joined.startsWith('..') ? null : joined;
  }

  private _message(state: ConnectionState | 'no-notebook'): HTMLElement | null {
    const box = el('div', 'jp-ModelDebugger-message');
    switch (state) {
      case 'no-notebook':
        box.textContent = 'Open a notebook to follow its kernel.';
        break;
      case 'no-kernel':
        box.textContent = 'The notebook has no running kernel.';
        break;
      case 'connecting':
        box.textContent = 'Connecting to the kernel…';
        break;
      case 'restarting':
        box.textContent = 'The kernel is restarting…';
        break;
      case 'missing': {
        box.classList.add('jp-ModelDebugger-hint');
        box.appendChild(document.createTextNode('No model_debugger session in this kernel: run '));
        box.appendChild(el('code', '', '%load_ext model_debugger'));
        break;
      }
      default:
        return null;
    }
    return box;
  }

  private _tracker(report: Report | null): HTMLElement {
    const list = el('ol', 'jp-ModelDebugger-tracker');
    // the phase strip is the session's (report.phases); before a session, that of an empty one
    const strip: PhaseStatus[] =
      report?.phases ??
      PHASES.map(phase => ({ phase, status: phase === 'reproduce' ? 'current' : 'blocked' }));
    strip.forEach(({ phase, status: state }) => {
      const item = el('li', 'jp-ModelDebugger-phase');
      item.dataset.phase = phase;
      const gate = report ? report.gates[phase] : 'no session yet';
      item.dataset.state = state;
      item.appendChild(el('span', 'jp-ModelDebugger-phaseName', phase[0].toUpperCase() + phase.slice(1)));
      if (phase === 'fix') {
        const button = el('button', 'jp-mod-styled jp-ModelDebugger-fix', 'Fix');
        const allowed = !!report && report.fix_allowed === true;
        button.disabled = !allowed;
        button.title = allowed
          ? `Insert a %%fix cell for ${report!.queue[0] ?? 'the confirmed finding'}`
          : `Fix is gated: ${gate ?? 'no confirmed finding'}`;
        button.onclick = async () => {
          if (this._notebook && allowed) {
            // the kernel's current code under %%fix: the user edits one change into it
            const notebook = this._notebook;
            let source: string | undefined;
            try {
              source = (await this._connection?.request<{ source: string }>('fix_cell'))?.source;
            } catch {
              source = undefined; // an older kernel or a closed comm: the empty template
            }
            this.actions.insertFixCell(notebook, source);
          }
        };
        item.appendChild(button);
      }
      if (gate && state !== 'done') {
        item.appendChild(el('span', 'jp-ModelDebugger-gate', gate));
      }
      list.appendChild(item);
    });
    return list;
  }

  /** What the kernel runs now (a phase), with a progress bar: determinate when it knows. */
  private _running(running: Running): HTMLElement {
    const box = el('section', 'jp-ModelDebugger-running');
    box.dataset.phase = running.phase;
    box.appendChild(el('div', 'jp-ModelDebugger-runningLabel', `running ${running.phase}: ${running.label}`));
    const bar = el('progress', 'jp-ModelDebugger-runningBar');
    bar.max = 1;
    if (typeof running.fraction === 'number') {
      bar.value = running.fraction;
    } else {
      bar.removeAttribute('value'); // indeterminate: the share done is not known
    }
    box.appendChild(bar);
    return box;
  }

  private _classification(report: Report): HTMLElement {
    const box = el('section', 'jp-ModelDebugger-classification');
    box.appendChild(el('h3', '', 'Classification'));
    const cls = report.classification;
    if (!cls) {
      box.appendChild(el('p', 'jp-ModelDebugger-empty', report.reproduce?.summary ?? 'not classified yet'));
      return box;
    }
    const primary = el('div', 'jp-ModelDebugger-primary', cls.primary);
    primary.dataset.category = cls.primary;
    box.appendChild(primary);
    if (cls.secondary.length) {
      box.appendChild(el('div', 'jp-ModelDebugger-secondary', `then: ${cls.secondary.join(', ')}`));
    }
    const table = el('table', 'jp-ModelDebugger-evidence');
    for (const e of cls.evidence) {
      const row = el('tr', 'jp-ModelDebugger-number');
      row.appendChild(el('td', 'jp-ModelDebugger-signal', e.signal));
      row.appendChild(el('td', 'jp-ModelDebugger-value', num(e.value)));
      table.appendChild(row);
      if (e.detail) {
        const detail = el('tr', 'jp-ModelDebugger-detailRow');
        const cell = el('td', 'jp-ModelDebugger-detail', e.detail);
        cell.colSpan = 2;
        detail.appendChild(cell);
        table.appendChild(detail);
      }
    }
    box.appendChild(table);
    const ranks = this._ranks(report);
    if (ranks) {
      box.appendChild(ranks);
    }
    return box;
  }

  /** A multi-process job's per-rank table, or the note that only this rank was captured. */
  private _ranks(report: Report): HTMLElement | null {
    const rep = report.reproduce;
    if (rep?.single_rank) {
      return el(
        'p',
        'jp-ModelDebugger-singleRank',
        `Only this process was captured: rank ${rep.single_rank.rank} of ${rep.single_rank.world_size}. ` +
          'For every rank: model-debugger diagnose SCRIPT --nproc-per-node N'
      );
    }
    const rows = rep?.rank_table;
    if (!rows || !rows.length) {
      return null;
    }
    const table = el('table', 'jp-ModelDebugger-ranks');
    const head = el('tr', '');
    for (const h of ['rank', 'status', 'steps', 'step ms', 'own ms', 'blocked ms', 'loss']) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    for (const r of rows) {
      const row = el('tr', 'jp-ModelDebugger-rank');
      row.dataset.rank = String(r.rank);
      for (const v of [r.rank, r.status, r.steps, r.step_ms, r.own_ms, r.blocked_ms, r.loss_final]) {
        row.appendChild(el('td', '', num(v)));
      }
      table.appendChild(row);
    }
    const box = el('div', 'jp-ModelDebugger-rankBox');
    box.appendChild(el('h4', '', `Ranks (${rep?.ranks ?? rows.length})`));
    box.appendChild(table);
    return box;
  }

  private _findings(snapshot: Snapshot, report: Report): HTMLElement {
    const box = el('section', 'jp-ModelDebugger-findings');
    box.appendChild(el('h3', '', `Findings (${report.findings.length})`));
    if (!report.findings.length) {
      box.appendChild(el('p', 'jp-ModelDebugger-empty', report.gates.isolate ? 'Isolate has not run.' : 'Run %isolate.'));
      return box;
    }
    const list = el('ul', '');
    for (const f of report.findings) {
      const item = el('li', 'jp-ModelDebugger-finding');
      item.dataset.confirmed = String(f.confirmed);
      item.appendChild(el('span', 'jp-ModelDebugger-check', f.check));
      item.appendChild(el('span', 'jp-ModelDebugger-kind', `${f.root_cause} · ${f.confirmed ? 'confirmed' : 'hypothesis'}`));
      const onRank = (f.evidence as { rank?: unknown }).rank;
      if (typeof onRank === 'number') {
        item.appendChild(el('span', 'jp-ModelDebugger-rankBadge', `rank ${onRank}`));
      }
      if (f.location?.file) {
        const line = f.location.line ?? '?';
        const where = el('a', 'jp-ModelDebugger-location', f.location.cell
          ? `%%${f.location.cell} cell, line ${line}`
          : `${PathExt.basename(f.location.file)}:${line}`);
        where.title = f.location.cell ? `reveal the %%${f.location.cell} cell` : `${f.location.file}:${line}`;
        where.href = '#';
        where.onclick = (ev: MouseEvent) => {
          ev.preventDefault();
          void this._reveal(snapshot, f);
        };
        item.appendChild(where);
      }
      item.appendChild(el('div', 'jp-ModelDebugger-explanation', f.explanation));
      list.appendChild(item);
    }
    box.appendChild(list);
    return box;
  }

  private _fixVerify(report: Report): HTMLElement {
    const box = el('section', 'jp-ModelDebugger-fixverify');
    box.appendChild(el('h3', '', 'Fix and Verify'));
    const fix = report.plan ?? report.fix;
    box.appendChild(
      el('div', 'jp-ModelDebugger-fixStatus', fix ? `fix for ${fix.finding}: ${report.plan ? 'planned, awaiting approval' : fix.approved ? 'approved' : 'planned'}${fix.suggestion ? ` — ${fix.suggestion}` : ''}` : `fix: ${report.gates.fix ?? 'allowed, not planned yet'}`)
    );
    const v = report.verification;
    const verdict = el('div', 'jp-ModelDebugger-verifyStatus', v ? `verify: ${v.verdict}${v.remaining_symptom ? ` — ${v.remaining_symptom}` : ''}` : `verify: ${report.gates.verify ?? 'ready'}`);
    if (v) {
      verdict.dataset.verdict = v.verdict;
    }
    box.appendChild(verdict);
    return box;
  }

  /** Reveal a finding's code: the `%%reproduce` or `%%fix` cell it is a line of, else the file. */
  private async _reveal(snapshot: Snapshot, finding: Finding): Promise<void> {
    const loc = finding.location!;
    const line = loc.line ?? null;
    if (loc.cell && this._notebook) {
      this._status = (await revealCell(this._notebook, loc.cell, line))
        ? `revealed the %%${loc.cell} cell (line ${line})`
        : `no %%${loc.cell} cell in this notebook`;
      this.render();
      return;
    }
    const path = this._serverPath(snapshot, loc.file);
    if (!path) {
      this._status = `${loc.file} is outside the server root`;
      this.render();
      return;
    }
    await this.actions.openFile(path, line);
  }

  private _notebook: NotebookPanel | null = null;
  private _connection: KernelConnection | null = null;
  private _status = '';
  private _busy = false;
}
