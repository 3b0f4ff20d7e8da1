"""The JupyterLab sidebar in a real browser: jupyter lab + Debian chromium driven by Playwright.

Starts ``jupyter lab`` on 127.0.0.1 (a free port, a token, a temporary root holding a small
notebook: ``%load_ext model_debugger``, a ``%%reproduce`` cell with SGD at a far too high learning
rate, ``%isolate``), opens the notebook, runs all cells, and checks that the Model Debugger panel
shows the phase tracker, the classification with its numbers, and the Fix button going from
disabled to enabled once Isolate confirms a finding. Screenshot: the pytest tmp dir and
``tests/artifacts/sidebar.png``.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from _lab import ARTIFACTS, browser_page, lab_server, needs_chromium, open_notebook, show_panel
from _lab import panel_state as _state

pytestmark = [pytest.mark.slow, needs_chromium]

SETUP = "%load_ext model_debugger"  # registers the sidebar's comm target

REPRODUCE = """%%reproduce --seed 0
import torch
torch.manual_seed(0)
x = torch.randn(256, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=5.0)  # far too high: the loss becomes NaN
loss_fn = torch.nn.MSELoss()
for step in range(40):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()"""

ISOLATE = "%isolate --budget 20"


@pytest.fixture
def lab(tmp_path):
    with lab_server(tmp_path, "debug.ipynb", [SETUP, REPRODUCE, ISOLATE]) as server:
        yield server


def test_sidebar_follows_the_kernel_session(lab, tmp_path):
    with browser_page(1500, 950) as (page, errors):
        open_notebook(page, lab, "debug.ipynb")
        # the panel's own tab in the right sidebar (its SVG LabIcon)
        tab = page.locator(".jp-SideBar.jp-mod-right li[data-id='model-debugger-panel']")
        tab.wait_for(timeout=30_000)
        assert tab.locator("svg").count() == 1
        show_panel(page)
        page.wait_for_function(
            "() => window.jupyterapp && document.querySelector("
            "'.jp-NotebookPanel .jp-Notebook-ExecutionIndicator, .jp-KernelStatus')"
            " !== undefined", timeout=60_000)
        # before anything runs: the kernel has no comm target -> the load_ext hint
        page.wait_for_function(
            "() => ['missing','connected'].includes("
            "document.querySelector('#model-debugger-panel')?.dataset.state)",
            timeout=90_000)
        first = _state(page)
        if first["state"] == "missing":
            assert "%load_ext model_debugger" in first["text"]
        assert first["fixDisabled"] is True

        page.evaluate(  # not awaited: sample the panel while the cells run
            "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        samples: list[dict] = []
        stamps: list[float] = []
        start = time.time()
        deadline = time.time() + 300
        while time.time() < deadline:
            s = _state(page)
            samples.append(s)
            stamps.append(time.time() - start)
            if s["fixDisabled"] is False:
                break
            page.wait_for_timeout(100)
        final = samples[-1]
        shot = tmp_path / "sidebar.png"
        page.screenshot(path=str(shot))
        os.makedirs(ARTIFACTS, exist_ok=True)
        shutil.copy(shot, os.path.join(ARTIFACTS, "sidebar.png"))
        assert final["fixDisabled"] is False, (final, lab["log"].read_text()[-3000:])
        assert final["state"] == "connected"
        classified = [s for s in samples if s["primary"]]
        assert classified, samples[-1]
        # the classification was shown while Fix was still gated (before Isolate finished)
        transitions = [(round(t, 1), s["primary"], s["fixDisabled"]) for t, s in
                       zip(stamps, samples) if s["primary"]][:5]
        assert any(s["fixDisabled"] is True for s in classified), (len(samples), transitions)
        assert final["primary"] == "gradient_instability"
        assert final["numbers"] and any(any(c.isdigit() for c in n) for n in final["numbers"])
        assert [p for p, _ in final["phases"]] == ["reproduce", "classify", "isolate",
                                                   "fix", "verify"]
        assert dict(final["phases"])["fix"] == "current"
        assert dict(final["phases"])["reproduce"] == "done"
        assert any("lr_range" in f and "confirmed" in f for f in final["findings"])

        # a finding's location is the cell's line, and a click reveals the %%reproduce cell
        where = page.locator(".jp-ModelDebugger-location").first
        assert where.inner_text().startswith("%%reproduce cell, line "), where.inner_text()
        where.click()
        page.wait_for_selector(".jp-ModelDebugger-status", timeout=10_000)
        assert "revealed the %%reproduce cell" in _state(page)["text"]

        # Export asks the kernel over the comm (the record notebook and repro.py)
        page.locator("button.jp-ModelDebugger-export").click()
        page.wait_for_function(
            "() => /exported/.test(document.querySelector("
            "'.jp-ModelDebugger-status')?.textContent || '')", timeout=120_000)
        exported = list((lab["root"] / ".model_debugger").glob("*/*.ipynb"))
        assert exported, _state(page)["text"]
        page.screenshot(path=str(tmp_path / "sidebar-exported.png"))
        assert not [e for e in errors if "model" in e.lower()], errors


def test_a_terminal_multi_rank_diagnosis_opened_in_the_kernel_shows_its_ranks(tmp_path):
    """A 2-rank gloo job diagnosed by the CLI is opened with ``%md_open``: the sidebar
    follows it and shows its per-rank table (every rank's status and steps) and which rank
    each finding is about (a straggler: rank 1)."""
    from test_ranks import SPAWN, _diagnose

    report = _diagnose(tmp_path, SPAWN, "straggler")
    assert report["reproduce"]["ranks"] == 2
    cells = [SETUP, f"%md_open {report['session_dir']}"]
    (tmp_path / "lab").mkdir()
    with lab_server(tmp_path / "lab", "ranks.ipynb", cells) as lab, \
            browser_page(1500, 950) as (page, errors):
        open_notebook(page, lab, "ranks.ipynb")
        show_panel(page)
        page.wait_for_function(
            "() => ['missing','connected'].includes("
            "document.querySelector('#model-debugger-panel')?.dataset.state)",
            timeout=90_000)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        page.wait_for_function(
            "() => document.querySelectorAll('#model-debugger-panel "
            "tr.jp-ModelDebugger-rank').length === 2", timeout=120_000)
        rows = page.evaluate(
            "() => [...document.querySelectorAll('#model-debugger-panel "
            "tr.jp-ModelDebugger-rank')].map(r => [...r.cells].map(c => c.textContent))")
        page.screenshot(path=str(tmp_path / "sidebar-ranks.png"))
        os.makedirs(ARTIFACTS, exist_ok=True)
        shutil.copy(tmp_path / "sidebar-ranks.png", os.path.join(ARTIFACTS, "sidebar-ranks.png"))
        assert [r[0] for r in rows] == ["0", "1"], rows
        assert all(r[1] == "ok" and r[2] == "40" for r in rows), rows
        assert _state(page)["primary"] == "performance_issue"
        assert "Ranks (2)" in _state(page)["text"]
        badges = page.evaluate(
            "() => [...document.querySelectorAll('#model-debugger-panel "
            ".jp-ModelDebugger-rankBadge')].map(b => b.textContent)")
        assert badges and set(badges) == {"rank 1"}, badges
        assert not _state(page)["overflows"]  # the wide table scrolls in its box
        assert not [e for e in errors if "model" in e.lower()], errors
