"""The magics in a real InteractiveShell (``run_cell`` / ``run_cell_magic``), no browser.

One small PyTorch problem (a learning rate far too low) is walked Reproduce -> Verify; other
tests check what the magics refuse, a cell that raises / runs out of memory / is interrupted,
``%%evidence`` and ``%unload_ext``.
"""

from __future__ import annotations

import os

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import model_debugger
from model_debugger import notebook

pytest.importorskip("torch")

DATA = """import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(2048, 20)
y = (X[:, :5].sum(dim=1) > 0).long()
"""
MODEL = "model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 2))\n"
UNRELATED = "unrelated = [1, 2, 3]\n"
LOOP = """optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
loss_fn = nn.CrossEntropyLoss()
for epoch in range(4):
    perm = torch.randperm(len(X))
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        optimizer.zero_grad()
        loss = loss_fn(model(X[idx]), y[idx])
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch}: loss={loss.item():.4f}")
"""
FIXED = LOOP.replace("lr=1e-5", "lr=0.1")


@pytest.fixture
def shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "model_debugger")
    yield ip
    ip.run_line_magic("unload_ext", "model_debugger")
    for name in ("X", "y", "model", "optimizer", "loss", "unrelated"):
        ip.user_ns.pop(name, None)


def run(ip, code: str) -> str:
    """Run a cell as the kernel would (stored in ``In``); the text of everything it showed."""
    with capture_output() as cap:
        result = ip.run_cell(code, store_history=True)
    assert result.error_in_exec is None, result.error_in_exec
    return cap.stdout + "\n".join(o.data.get("text/plain", "") for o in cap.outputs)


def magic(ip, name: str, line: str = "", cell: str | None = None) -> str:
    with capture_output() as cap:
        if cell is None:
            ip.run_line_magic(name, line)
        else:
            ip.run_cell_magic(name, line, cell)
    return cap.stdout + "\n".join(o.data.get("text/plain", "") for o in cap.outputs)


def test_walkthrough_reproduce_to_verify(shell):
    for cell in (DATA, MODEL, UNRELATED):
        run(shell, cell)
    out = run(shell, "%%reproduce --seed 0\n" + LOOP)
    ns = model_debugger.current_session()
    s = ns.session
    assert "Classification: loss_not_decreasing" in out and "loss_relative_drop" in out
    assert "reproduced 1/1" in out
    assert os.path.dirname(s.directory) == os.path.join(os.getcwd(), ".model_debugger")
    artifact = open(os.path.join(s.directory, "artifact.py")).read()
    assert "import torch" in artifact and "X = torch.randn" in artifact and "model = nn" in artifact
    assert "unrelated" not in artifact and artifact.count("optimizer = torch.optim.SGD") == 1
    assert ns.curves.redraws >= 1 and "steps" in ns.curves.status.value

    events = len(s.events)
    out = magic(shell, "classify")
    assert "Classification: loss_not_decreasing" in out and "loss_relative_drop" in out
    assert len(s.events) == events  # shown, not re-classified

    assert ns.tracker.fix_button.disabled
    out = magic(shell, "isolate", "--budget 20")
    assert "[confirmed] lr_range (hyperparameter) at %%reproduce cell, line 1" in out
    assert ns.report()["fix_allowed"] and ns.tracker.fix_button.disabled  # nothing to approve

    out = magic(shell, "evidence", "", "print('lr_sweep_best: 0.33')\n")
    assert "lr_sweep_best: 0.33" in out and "attached to lr_range" in out
    assert s.events[-1]["kind"] == "evidence" and s.events[-1]["numbers"] == {
        "lr_sweep_best": 0.33}

    wider = "model = nn.Sequential(nn.Linear(20, 256), nn.ReLU(), nn.Linear(256, 2))\n"
    out = magic(shell, "fix", "", wider + FIXED)
    assert "Fix refused" in out and "architecture" in out and s.pending_fix is None

    out = magic(shell, "fix", "", FIXED)
    assert "Fix plan for lr_range" in out and "+optimizer = torch.optim.SGD(model.parameters(), " \
        "lr=0.1)" in out
    assert s.pending_fix is None and s.state.plan.finding == "lr_range"  # shown, not approved
    tracker = ns.tracker  # the one %%fix showed
    assert not tracker.fix_button.disabled
    tracker.fix_button.click()
    assert s.pending_fix["finding"] == "lr_range" and tracker.fix_button.disabled

    out = magic(shell, "verify", "--seeds 2")
    assert "Verify: resolved" in out
    assert ns.report()["verification"]["verdict"] == "resolved"
    out = magic(shell, "md_status")
    assert "last verdict: resolved" in out


def test_fix_with_yes_approves_and_refusals_change_nothing(shell):
    run(shell, DATA)
    run(shell, MODEL)
    out = magic(shell, "fix", "--yes", FIXED)
    assert "fix refused" in out  # no reproduction yet
    magic(shell, "reproduce", "--seed 0", LOOP)
    out = magic(shell, "verify")
    assert "verify refused" in out
    out = magic(shell, "fix", "--yes", FIXED)
    assert "needs a confirmed finding" in out  # no Isolate yet: no fix
    magic(shell, "isolate", "--probe lr_range --budget 20")
    s = model_debugger.current_session().session
    n = len(s.events)
    out = magic(shell, "fix", "--yes", LOOP)
    assert "identical" in out and len(s.events) == n
    out = magic(shell, "fix", "--yes", FIXED)
    assert "approved" in out and s.pending_fix["finding"] == "lr_range"


def test_isolate_probe_adds_to_the_findings(shell):
    """``%isolate --probe X`` adds X's findings; the confirmed one stays queued, Fix open."""
    run(shell, DATA)
    run(shell, MODEL)
    magic(shell, "reproduce", "--seed 0", LOOP)
    magic(shell, "isolate", "--budget 20")
    ns = model_debugger.current_session()
    s = ns.session
    queue = [f.check for f in s.state.queue]
    assert queue[0] == "lr_range" and "gradient_flow" not in queue and s.fix_allowed
    out = magic(shell, "isolate", "--probe gradient_flow --budget 10")
    assert "lr_range" in out  # still shown: the findings now recorded
    assert [f.check for f in s.state.queue] == queue and s.fix_allowed
    assert s.state.isolations == 2 and s.events[-1]["added"] is True
    assert dict(s.state.strip)["fix"] == "current"
    assert _phases(ns.tracker) == dict(s.state.strip)

    # a new kernel knows the session from disk, but its starting state lived in this one
    directory = s.directory
    shell.run_line_magic("unload_ext", "model_debugger")
    shell.run_line_magic("load_ext", "model_debugger")
    from model_debugger.session import DebugSession

    again = model_debugger.current_session()
    again.use(DebugSession.load(directory))
    out = magic(shell, "isolate", "--probe lr_range --budget 5")
    assert "rerun it there" in out and again.session.state.isolations == 2
    assert again.tracker.fix_button.disabled  # no plan recorded: nothing to approve


def _phases(tracker) -> dict[str, str]:
    import re

    return {p.lower(): st for p, st in re.findall(
        r"<b>(\w+)</b><br><span style='color:[^']+'>(\w+)</span>", tracker.phases.value)}


@pytest.mark.parametrize("failure, expect", [
    ("raise RuntimeError('boom')", "RuntimeError: boom"),
    ("raise MemoryError('out of memory')", "MemoryError"),
    ("raise KeyboardInterrupt", "interrupted"),
])
def test_failing_cell_keeps_partial_record_and_kernel(shell, failure, expect):
    run(shell, DATA)
    run(shell, MODEL)
    cell = LOOP.replace("    print(", f"    if epoch == 1:\n        {failure}\n    print(")
    out = magic(shell, "reproduce", "", cell)
    assert expect in out
    ns = model_debugger.current_session()
    rep = ns.report()
    assert rep["reproduce"]["steps"] > 0 and rep["classification"] is not None
    assert rep["phase"] == "isolate"
    assert run(shell, "print(1 + 1)").strip() == "2"  # the kernel goes on
    out = magic(shell, "classify")
    assert "Classification:" in out


def test_second_reproduce_starts_new_session(shell):
    run(shell, DATA)
    run(shell, MODEL)
    short = LOOP.replace("range(3)", "range(1)")
    magic(shell, "reproduce", "", short)
    first = model_debugger.current_session().session.directory
    magic(shell, "reproduce", "", short)
    second = model_debugger.current_session().session.directory
    assert first != second and os.path.exists(os.path.join(first, "session.json"))


def test_classify_before_reproduce_says_why(shell):
    out = magic(shell, "classify")
    assert "needs a reproduce record" in out


def test_md_export_writes_and_says_what_it_replaced(shell, tmp_path):
    from model_debugger.session import DebugSession

    out = magic(shell, "md_export", "record.ipynb")
    assert "no session to export yet" in out and not (tmp_path / "record.ipynb").exists()
    model_debugger.current_session().use(DebugSession.create(str(tmp_path / ".model_debugger")))
    (tmp_path / "repro.py").write_text("# the user's own file\n")
    out = magic(shell, "md_export", "record.ipynb")
    assert "exported the session record to" in out
    assert f"replaced {tmp_path / 'repro.py'}" in out  # never a silent overwrite
    assert "the user's own file" not in (tmp_path / "repro.py").read_text()
    import nbformat

    nbformat.validate(nbformat.read(str(tmp_path / "record.ipynb"), as_version=4))
    folder = model_debugger.current_session().session.directory
    out = magic(shell, "md_export", "")  # no path: into the session's own (ignored) folder
    assert f"exported the session record to {folder}{os.sep}" in out
    assert os.path.isfile(os.path.join(folder, "repro.py"))


@pytest.mark.slow
def test_md_open_shows_a_terminal_diagnosis_in_the_kernel(shell, tmp_path):
    """A script diagnosed by the CLI is opened in the kernel: its classification and findings
    are shown, the kernel (and so the sidebar) follows it, and Isolate goes on from there."""
    import json
    import subprocess
    import sys

    (tmp_path / "slow_lr.py").write_text(DATA + MODEL + LOOP)
    done = subprocess.run([sys.executable, "-m", "model_debugger.cli", "diagnose", "slow_lr.py",
                           "--json", "--probe-seconds", "10", "--intervene-seconds", "0",
                           "--root", str(tmp_path / "terminal")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout)
    folder = report["session_dir"]
    out = magic(shell, "md_open", folder)
    assert report["classification"]["primary"] in out and "loss_not_decreasing" in out
    kernel = model_debugger.current_session()
    assert kernel.session.directory == folder
    assert kernel.report()["classification"] == report["classification"]
    out = magic(shell, "isolate", "--budget 5")  # the script's session goes on here
    assert "error" not in out.lower()[:200], out[:500]
    out = magic(shell, "md_open", str(tmp_path / "nowhere"))
    assert "open failed: no model_debugger session" in out
    assert kernel.session.directory == folder  # a failed open keeps the session


def test_unload_ext_removes_every_magic():
    ip = InteractiveShell.instance()
    names = ("reproduce", "classify", "isolate", "evidence", "fix", "verify", "md_status",
             "md_export", "md_open")
    callbacks = {k: list(v) for k, v in ip.events.callbacks.items()}
    registry = set(ip.magics_manager.registry)
    configurables = list(ip.configurables)
    ip.run_line_magic("load_ext", "model_debugger")
    assert {n for t in ip.magics_manager.magics.values() for n in t} >= set(names)
    magics = ip.magics_manager.registry["DebuggerMagics"]
    kernel = model_debugger.current_session()
    assert kernel is magics.kernel and kernel.namespace is ip.user_ns  # owned by the magics
    ip.run_line_magic("unload_ext", "model_debugger")
    left = {n for t in ip.magics_manager.magics.values() for n in t}
    assert not left & {"reproduce", "isolate", "evidence", "md_status", "md_export"}
    assert set(ip.magics_manager.registry) == registry
    assert {k: list(v) for k, v in ip.events.callbacks.items()} == callbacks
    assert list(ip.configurables) == configurables  # nothing keeps the dropped session alive
    assert magics.kernel is None
    with pytest.raises(RuntimeError, match="load_ext model_debugger"):
        model_debugger.current_session()
    assert not [k for k, v in vars(notebook).items()
                if not k.startswith("__") and isinstance(v, notebook.NotebookSession)]
    ip.run_line_magic("load_ext", "model_debugger")  # loads again after unloading
    assert model_debugger.current_session() is not kernel
    ip.run_line_magic("unload_ext", "model_debugger")


@pytest.mark.parametrize("name", ["reproduce", "isolate", "fix", "verify", "evidence",
                                  "md_export", "classify", "md_open"])
def test_help_where_people_look(shell, capsys, name):
    """``%name --help`` prints the usage (not a UsageError); ``%name?`` finds every magic."""
    shell.run_line_magic(name, "--help")
    out = capsys.readouterr().out
    assert f"%{name}" in out or f"%%{name}" in out
    assert "usage" in out.lower() or "::" in out
    info = shell.find_line_magic(name)
    assert info is not None and info.__doc__  # what %name? shows
    if name in ("reproduce", "fix", "evidence"):
        assert shell.find_cell_magic(name) is not None


def test_a_cell_magic_on_a_line_says_how_to_use_it(shell, capsys):
    shell.run_line_magic("reproduce", "")
    out = capsys.readouterr().out
    assert "%%reproduce is a cell magic" in out
    assert not (tmp := os.path.join(os.getcwd(), ".model_debugger")) or not os.path.isdir(tmp) \
        or not os.listdir(tmp)  # nothing was run, no session started


def test_the_isolate_bar_stays_true_past_its_budget():
    from model_debugger.magics import _probe_clock

    assert _probe_clock(6.0, 30.0) == (0.2, "probes: 6 s of at most 30 s")
    share, label = _probe_clock(41.0, 30.0)
    assert share == 1.0 and "of at most" not in label and "30 s budget is spent" in label


def test_a_tracked_bar_reads_its_clock_at_once():
    """An action shorter than the tick interval still shows what it is (the sidebar's line)."""
    from model_debugger.widgets import Progress

    moves = []
    bar = Progress("Isolate", on_move=lambda f, label: moves.append(label))
    with bar, bar.track(lambda t: (0.0, f"probes: {t:.0f} s"), interval=60.0):
        pass
    assert "probes: 0 s" in moves
