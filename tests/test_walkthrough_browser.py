"""All five phases in JupyterLab in a real browser (chromium via Playwright), as a user walks them.

A notebook reproduces SGD at a far too high rate (the loss becomes NaN), runs Isolate, and then
the user does what the product asks: clicks the sidebar's Fix button (a ``%%fix`` cell appears,
pre-filled with the reproduced code), makes the one change (the rate), approves it with
``--yes``, runs ``%verify`` and ``%md_status``. Checked in the page itself: the live loss chart
is interactive (a hover tooltip with a number, the log toggle changes the axis), the findings
view has its summary and badges, Verify overlays the runs before and after the fix, no stale
state is left (older trackers read-only with their Approve disabled, nothing says "run %verify"
after Verify, the sidebar shows Verify done). Screenshots: ``tests/artifacts/walkthrough-*.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest
from _lab import (
    ARTIFACTS,
    browser_page,
    lab_server,
    needs_chromium,
    open_notebook,
    panel_state,
    show_panel,
)

pytestmark = [pytest.mark.slow, needs_chromium]

REPRODUCE = """%%reproduce --seed 0
import torch
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=5.0)
loss_fn = torch.nn.MSELoss()
for step in range(60):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()"""

CELLS = ["%load_ext model_debugger", REPRODUCE, "%isolate --budget 20"]

FILE_FINDING = """from IPython.display import HTML
from model_debugger import views
from model_debugger.records import Finding
with open("helper.py", "w") as fh:
    fh.write("".join(f"value_{i} = {i}\\n" for i in range(1, 13)))
HTML(views.html(views.findings([Finding("lr_range", "hyperparameter", True, "measured",
                                        {"file": "helper.py", "line": 7})])))"""


def _cell(i: int) -> str:
    return f"document.querySelectorAll('.jp-Notebook .jp-Cell')[{i}]"


def _plot_of(i: int) -> str:
    return f"{_cell(i)}?.querySelector('.js-plotly-plot')"


def _shot(page, tmp_path, name: str) -> None:
    path = tmp_path / f"walkthrough-{name}.png"
    page.screenshot(path=str(path))
    os.makedirs(ARTIFACTS, exist_ok=True)
    shutil.copy(path, os.path.join(ARTIFACTS, path.name))


def _run_from(page, index: int) -> None:
    page.evaluate(f"""() => {{
        const nb = window.jupyterapp.shell.currentWidget.content;
        nb.activeCellIndex = {index};
        window.jupyterapp.commands.execute('notebook:run-all-below');
    }}""")


def _add_cell_below(page, source: str) -> None:
    page.evaluate("""async (source) => {
        const app = window.jupyterapp;
        await app.commands.execute('notebook:insert-cell-below');
        app.shell.currentWidget.content.activeCell.model.sharedModel.setSource(source);
    }""", source)


@pytest.fixture
def lab(tmp_path):
    with lab_server(tmp_path, "walk.ipynb", CELLS) as server:
        yield server


def test_a_notebook_walks_all_five_phases_in_the_browser(lab, tmp_path):
    with browser_page(1600, 1000) as (page, errors):
        open_notebook(page, lab, "walk.ipynb")
        show_panel(page)
        page.wait_for_function(
            "() => ['missing','connected'].includes("
            "document.querySelector('#model-debugger-panel')?.dataset.state)",
            timeout=90_000)
        # every "running" line the sidebar shows, however briefly (a MutationObserver)
        page.evaluate("""() => {
            window.__mdRunning = [];
            const panel = document.querySelector('#model-debugger-panel');
            new MutationObserver(() => {
                const line = panel.querySelector('.jp-ModelDebugger-running');
                if (line) window.__mdRunning.push(line.innerText);
            }).observe(panel, {childList: true, subtree: true, characterData: true});
        }""")
        page.evaluate("() => { window.jupyterapp.commands.execute("
                      "'notebook:run-all-cells'); }")
        deadline = time.time() + 300
        while time.time() < deadline and panel_state(page)["fixDisabled"] is not False:
            page.wait_for_timeout(250)
        page.wait_for_function("() => !document.querySelector("
                               "'#model-debugger-panel .jp-ModelDebugger-running')",
                               timeout=30_000)  # nothing runs: no stale "running" line
        state = panel_state(page)
        assert state["fixDisabled"] is False, (state, lab["log"].read_text()[-3000:])
        assert state["primary"] == "gradient_instability"
        # while the cells ran, the sidebar said what ran, with numbers
        seen = page.evaluate("() => window.__mdRunning")
        assert any(re.match(r"running reproduce: training: \d+ steps", t) for t in seen), seen
        assert any(t.startswith("running isolate: probes: ") for t in seen), seen
        assert not state["overflows"], "the sidebar clips its content"

        # Reproduce: the live chart is interactive (plotly, drawn in the page)
        page.wait_for_function(f"() => !!{_plot_of(1)}?._fullLayout", timeout=60_000)
        names = page.evaluate(f"() => {_plot_of(1)}.data.map(t => t.name)")
        assert "train loss" in names, names
        drag = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(
            ".js-plotly-plot .nsewdrag").first
        drag.scroll_into_view_if_needed()
        box = drag.bounding_box()
        hover = ""
        for frac in (0.1, 0.2, 0.3, 0.05):  # a point with a finite loss (NaN later on)
            page.mouse.move(box["x"] + box["width"] * frac, box["y"] + box["height"] / 2)
            page.wait_for_timeout(400)
            hover = page.evaluate(
                f"() => [...{_cell(1)}.querySelectorAll('.hoverlayer .hovertext')]"
                ".map(n => n.textContent).join(' | ')")
            if re.search(r"\d", hover):
                break
        assert re.search(r"\d", hover), hover  # a tooltip with the value
        _shot(page, tmp_path, "1-reproduce-hover")
        # a loss that spans decades starts on a log axis; the toggle switches it
        assert page.evaluate(f"() => {_plot_of(1)}._fullLayout.yaxis.type") == "log"
        for scale in ("linear", "log"):
            page.locator(".jp-Notebook .jp-Cell").nth(1).locator(
                ".updatemenu-button", has_text=scale).first.click()
            page.wait_for_function(
                f"() => {_plot_of(1)}._fullLayout.yaxis.type === '{scale}'", timeout=10_000)

        # Isolate: the findings view reads like a checks report
        report = page.evaluate(f"() => {_cell(2)}.querySelector('.md-view')?.innerText")
        assert report and "Summary: gradient_instability" in report, report
        assert page.evaluate(f"() => {_cell(2)}.querySelectorAll("
                             "'.md-check .md-badge-confirmed').length") >= 1
        _shot(page, tmp_path, "2-isolate-findings")
        # a location in the cell reads as the cell's line, and a click reveals that cell there
        link = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(
            "a.md-location[data-md-cell='reproduce']").first
        assert re.fullmatch(r"%%reproduce cell, line \d+", link.inner_text()), link.inner_text()
        line = int(link.get_attribute("data-md-line"))
        link.click()
        page.wait_for_function(
            "() => window.jupyterapp.shell.currentWidget.content.activeCellIndex === 1",
            timeout=10_000)
        cursor = page.evaluate("() => window.jupyterapp.shell.currentWidget.content"
                               ".activeCell.editor.getCursorPosition().line")
        source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content"
                               ".activeCell.model.sharedModel.getSource()")
        assert cursor == line, (cursor, line)  # the editor's line 0 is the magic's
        assert source.splitlines()[cursor].strip(), source  # a line of code, not a blank

        # Fix: the sidebar inserts a %%fix cell holding the reproduced code to edit
        page.evaluate("() => { window.jupyterapp.shell.currentWidget.content"
                      ".activeCellIndex = 2; }")
        page.locator("#model-debugger-panel button.jp-ModelDebugger-fix").click()
        page.wait_for_function(
            "() => window.jupyterapp.shell.currentWidget.content.widgets.length === 4",
            timeout=20_000)
        source = page.evaluate("() => window.jupyterapp.shell.currentWidget.content"
                               ".widgets[3].model.sharedModel.getSource()")
        assert source.startswith("%%fix\n") and "lr=5.0" in source, source
        assert source.rstrip("\n").endswith("opt.step()")
        _shot(page, tmp_path, "3-fix-cell")
        fixed = source.replace("%%fix\n", "%%fix --yes\n", 1).replace("lr=5.0", "lr=0.05")
        page.evaluate("(s) => window.jupyterapp.shell.currentWidget.content"
                      ".widgets[3].model.sharedModel.setSource(s)", fixed)
        page.evaluate("() => { window.jupyterapp.shell.currentWidget.content"
                      ".activeCellIndex = 3; }")
        _add_cell_below(page, "%verify --seeds 2")
        _add_cell_below(page, "%md_status")
        _run_from(page, 3)
        page.wait_for_function(f"() => /Session /.test({_cell(5)}?.querySelector("
                               "'.jp-OutputArea')?.innerText || '')", timeout=300_000)

        # Verify: the verdict, and the runs before and after overlaid
        verdict = page.evaluate(f"() => {_cell(4)}.querySelector('.md-view')?.innerText")
        assert verdict and verdict.startswith("Verify: resolved"), verdict
        page.wait_for_function(f"() => !!{_plot_of(4)}?._fullLayout", timeout=60_000)
        overlay = page.evaluate(f"() => {_plot_of(4)}.data.map(t => [t.name, t.line.dash])")
        assert ["before, seed 0: train loss", "dash"] in overlay, overlay
        assert ["after, seed 0: train loss", "solid"] in overlay, overlay
        _shot(page, tmp_path, "4-verify-overlay")

        # no stale state: one live tracker, nothing left to approve, Verify done everywhere
        trackers = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook button')]
            .filter(b => b.textContent.includes('Approve fix'))
            .map(b => [b.disabled, b.closest('.jp-OutputArea').innerText])""")
        assert trackers and all(disabled for disabled, _ in trackers), trackers
        assert all("read-only" in text for _, text in trackers[:-1]), trackers
        assert "%verify" not in trackers[-1][1] and "phase done" in trackers[-1][1], trackers
        status = page.evaluate(f"() => {_cell(5)}.querySelector('.md-view').innerText")
        assert "gate " not in status, status
        page.wait_for_function(
            "() => [...document.querySelectorAll('#model-debugger-panel "
            ".jp-ModelDebugger-phase')].every(li => li.dataset.state === 'done')",
            timeout=30_000)
        final = panel_state(page)
        assert "awaiting approval" not in final["text"] and final["running"] is None
        assert not final["overflows"]
        _shot(page, tmp_path, "5-done")

        # a finding located in a file: its link opens the file in the editor at that line
        page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                      " nb.activeCellIndex = nb.widgets.length - 1; }")
        _add_cell_below(page, FILE_FINDING)
        _run_from(page, 6)
        file_link = page.locator(".jp-Notebook .jp-Cell").nth(6).locator(
            "a.md-location")
        try:
            file_link.wait_for(timeout=60_000)
        except Exception:
            raise AssertionError(page.evaluate(
                f"() => {_cell(6)}?.innerText")) from None
        assert file_link.inner_text() == "helper.py:7"
        file_link.click()
        page.wait_for_function(
            "() => window.jupyterapp.shell.currentWidget?.context?.path === 'helper.py'",
            timeout=20_000)
        page.wait_for_function(
            "() => window.jupyterapp.shell.currentWidget.content.editor"
            ".getCursorPosition().line === 6", timeout=10_000)  # 0-based: line 7
        assert not [e for e in errors if "model" in e.lower() or "plotly" in e.lower()], \
            errors
