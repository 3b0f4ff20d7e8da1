"""A real JupyterLab for the browser tests: ``jupyter lab`` on 127.0.0.1 and Debian's chromium.

:func:`lab_server` starts the server (a free port, a token, private config and runtime folders,
a root holding the given notebook) and stops it; :func:`open_notebook` opens a notebook in a
Playwright page and waits for its cells; :func:`panel_state` reads the Model Debugger sidebar.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
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

needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is missing (apt-get install -y chromium; .ci/run does)")


def write_notebook(path: str, cells: list[str]) -> None:
    """A notebook of code cells on the ``python3`` kernel."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def labextension_installed() -> bool:
    """Whether the model-debugger lab extension is where JupyterLab looks for extensions."""
    from jupyter_core.paths import jupyter_path

    return any(os.path.isfile(os.path.join(p, "model-debugger", "package.json"))
               for p in jupyter_path("labextensions"))


@contextlib.contextmanager
def lab_server(tmp_path, notebook: str, cells: list[str]):
    """``{"base", "token", "root", "log"}`` of a running JupyterLab serving ``notebook``."""
    if not labextension_installed():
        pytest.fail("the model-debugger labextension is not installed: `pip install -e .` (or "
                    "`make`) builds it with hatch-jupyter-builder")
    root = tmp_path / "root"
    root.mkdir()
    write_notebook(str(root / notebook), cells)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                 "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[name] = str(tmp_path / name.lower())
    env["MPLBACKEND"] = "Agg"
    settings = tmp_path / "jupyterlab_settings_dir" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)  # no "get news?" toast over the screenshots
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
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


@contextlib.contextmanager
def browser_page(width: int = 1500, height: int = 950):
    """``(page, errors)``: a headless chromium page and the page errors it raised."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, errors
        finally:
            browser.close()


def open_notebook(page, lab: dict, notebook: str) -> None:
    """Open ``notebook`` in JupyterLab and wait for its cells and the app object."""
    page.goto(f"{lab['base']}/lab/tree/{notebook}?token={lab['token']}",
              wait_until="domcontentloaded", timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
    page.wait_for_function("() => !!window.jupyterapp", timeout=60_000)


def show_panel(page) -> None:
    """Bring the Model Debugger sidebar forward (its tab in the right sidebar)."""
    tab = page.locator(".jp-SideBar.jp-mod-right li[data-id='model-debugger-panel']")
    tab.wait_for(timeout=30_000)
    if "lm-mod-current" not in (tab.get_attribute("class") or ""):
        tab.click()
    page.wait_for_selector("#model-debugger-panel", state="visible", timeout=30_000)


def panel_state(page) -> dict | None:
    """What the sidebar shows: connection state, phases, classification, findings, Fix."""
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
            running: panel.querySelector('.jp-ModelDebugger-running')?.innerText || null,
            overflows: panel.scrollWidth > panel.clientWidth + 1,
            text: panel.innerText,
        };
    }""")
