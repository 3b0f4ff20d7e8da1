"""The JupyterLab sidebar in a real browser: jupyter lab + Debian chromium driven by Playwright.

Starts ``jupyter lab`` on 127.0.0.1 (a free port, a token, a temporary root holding a small
notebook: ``%load_ext model_debugger``, a ``%%reproduce`` cell with SGD at a far too high learning
rate, ``%isolate``), opens the notebook, runs all cells, and checks that the Model Debugger panel
shows the phase tracker, the classification with its numbers, and the Fix button going from
disabled to enabled once Isolate confirms a finding. Screenshot: the pytest tmp dir and
``tests/artifacts/sidebar.png``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

CHROMIUM = "/usr/bin/chromium"
HERE = os.path.dirname(os.path.abspath(__file__))
ARTIFACTS = os.path.join(HERE, "artifacts")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
        "--disable-dev-shm-usage"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is missing (apt-get install -y chromium; .ci/run does)"),
]

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


def _notebook(path: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in (SETUP, REPRODUCE, ISOLATE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _labextension_installed() -> bool:
    from jupyter_core.paths import jupyter_path

    return any(os.path.isfile(os.path.join(p, "model-debugger", "package.json"))
               for p in jupyter_path("labextensions"))


@pytest.fixture
def lab(tmp_path):
    if not _labextension_installed():
        pytest.fail("the model-debugger labextension is not installed: `pip install -e .` (or "
                    "`make`) builds it with hatch-jupyter-builder")
    root = tmp_path / "root"
    root.mkdir()
    _notebook(str(root / "debug.ipynb"))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                 "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[name] = str(tmp_path / name.lower())
    env["MPLBACKEND"] = "Agg"
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--allow-root",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=str(root), env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.flush()
                    pytest.fail("jupyter lab did not start:\n" +
                                (tmp_path / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield {"base": base, "token": token, "root": root, "log": tmp_path / "lab.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _state(page) -> dict:
    return page.evaluate("""() => {
        const panel = document.querySelector('#model-debugger-panel');
        if (!panel) return null;
        const fix = panel.querySelector('button.jp-ModelDebugger-fix');
        const primary = panel.querySelector('.jp-ModelDebugger-primary');
        return {
            state: panel.dataset.state,
            phases: [...panel.querySelectorAll('.jp-ModelDebugger-phase')].map(
                li => [li.dataset.phase, li.dataset.state]),
            primary: primary ? primary.textContent : null,
            numbers: [...panel.querySelectorAll('.jp-ModelDebugger-evidence tr.jp-ModelDebugger-number')].map(
                tr => tr.textContent),
            findings: [...panel.querySelectorAll('.jp-ModelDebugger-finding')].map(
                li => li.textContent),
            fixDisabled: fix ? fix.disabled : null,
            text: panel.innerText,
        };
    }""")


def test_sidebar_follows_the_kernel_session(lab, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab['base']}/lab/tree/debug.ipynb?token={lab['token']}",
                      wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
            # the panel's own tab in the right sidebar (its SVG LabIcon)
            tab = page.locator(".jp-SideBar.jp-mod-right li[data-id='model-debugger-panel']")
            tab.wait_for(timeout=30_000)
            assert tab.locator("svg").count() == 1
            if "lm-mod-current" not in (tab.get_attribute("class") or ""):
                tab.click()
            page.wait_for_selector("#model-debugger-panel", state="visible", timeout=30_000)
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

            # a finding's file:line reveals the %%reproduce cell
            page.locator(".jp-ModelDebugger-location").first.click()
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
        finally:
            browser.close()
