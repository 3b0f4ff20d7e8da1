"""Widget state without a browser: a recording comm stands in for the frontend.

The tracker's ``fix_button`` follows the session (never toggled by hand) and ``click()``
approves; the panels render from records; the live follower redraws a few times per second.
"""

from __future__ import annotations

import json
import os
import threading
import time

import comm
import pytest

from model_debugger.notebook import NotebookSession
from model_debugger.records import Classification, Evidence, Finding, Run
from model_debugger.session import GateError
from model_debugger.widgets import FindingsTable, GradientPanel, LossCurves, PhaseTracker
from model_debugger.widgets.curves import RecordFollower
from model_debugger.widgets.tracker import phase_states

CODE = "opt = SGD(lr=1e-5)\nfor step in range(3):\n    train(step)\n"


class RecordingComm:
    """A comm that keeps every message the widgets send (what a frontend would receive)."""

    comm_id = "recording"
    kernel = "Truthy"

    def __init__(self, **kwargs):
        self.messages = []

    def open(self, *args, **kwargs):
        pass

    def on_msg(self, *args, **kwargs):
        pass

    def send(self, data=None, metadata=None, buffers=None):
        self.messages.append(data)

    def close(self, *args, **kwargs):
        pass


@pytest.fixture
def comms(monkeypatch):
    made: list[RecordingComm] = []

    def create(**kwargs):
        made.append(RecordingComm(**kwargs))
        return made[-1]

    monkeypatch.setattr(comm, "create_comm", create)
    return made


class FakeArtifact:
    """Stands in for KernelArtifact: records what a real Isolate would, without training."""

    def __init__(self, session, confirmed=True):
        self.session = session
        self.confirmed = confirmed

    def isolate(self, ids=None, budget=30.0):
        where = {"file": os.path.join(self.session.directory, "runs", "0", "cell.py"), "line": 1}
        self.session.record_findings([Finding("lr_range", "hyperparameter", self.confirmed,
                                              "the learning rate is 1000x too small", where,
                                              {"lr": 1e-5, "safe_lr": 0.1})])


def reproduced(tmp_path, confirmed=True) -> NotebookSession:
    """A notebook session past Reproduce/Classify, with a fake artifact for Isolate."""
    ns = NotebookSession({"__name__": "__main__"}, root=str(tmp_path / ".model_debugger"))
    s = ns.session
    with open(os.path.join(s.directory, "cell.py"), "w") as fh:
        fh.write(CODE)
    s.append("artifact", type="cell", code=CODE, prelude="", seed=0, args=[], copy="cell.py")
    s.record_reproduce({"status": "reproduced", "summary": "reproduced 1/1", "steps": 3})
    s.record_classification(Classification("loss_not_decreasing", (), (
        Evidence("loss_relative_drop", -0.01, "relative decrease < 0.05"),)), {})
    ns._artifact = FakeArtifact(s, confirmed)
    return ns


def test_phase_states_done_current_blocked(tmp_path):
    ns = reproduced(tmp_path)
    states = {p: (st, why) for p, st, why in phase_states(ns.report())}
    assert states["reproduce"][0] == states["classify"][0] == "done"
    assert states["isolate"] == ("current", None)
    assert states["fix"] == ("blocked", "needs a confirmed finding from Isolate")
    assert states["verify"] == ("blocked", "needs an approved fix")


def test_fix_button_follows_session_and_click_approves(tmp_path, comms):
    ns = reproduced(tmp_path)
    tracker = ns.tracker
    assert isinstance(tracker, PhaseTracker)
    assert tracker.fix_button.disabled is True  # no confirmed evidence yet
    ns.evidence("print('x=1')", "x=1", {"x": 1.0})
    assert tracker.fix_button.disabled is True  # evidence alone confirms nothing
    ns.isolate()
    assert ns.session.fix_allowed
    assert tracker.fix_button.disabled is False
    sent = [m for c in comms for m in c.messages
            if m and m.get("method") == "update" and "disabled" in m.get("state", {})]
    assert sent and sent[-1]["state"]["disabled"] is False  # the frontend was told

    tracker.fix_button.click()  # no plan yet: refused, nothing recorded
    assert "no plan to approve" in tracker.message.value
    assert ns.session.pending_fix is None

    ns.plan_fix(CODE.replace("1e-5", "0.1"))
    tracker.fix_button.click()
    assert ns.session.pending_fix["finding"] == "lr_range"
    assert tracker.fix_button.disabled is True  # a fix awaits Verify
    assert "verify" in tracker.message.value
    assert "<b>verify</b>" in tracker.phases.value


def test_unconfirmed_finding_keeps_button_disabled(tmp_path):
    ns = reproduced(tmp_path, confirmed=False)
    ns.isolate()
    assert ns.tracker.fix_button.disabled is True
    with pytest.raises(GateError):
        ns.plan_fix(CODE.replace("1e-5", "0.1"))
    assert "needs a confirmed finding" in ns.tracker.phases.value


def test_refused_plan_changes_nothing(tmp_path):
    from model_debugger.fix import FixRefused

    ns = reproduced(tmp_path)
    ns.isolate()
    before = len(ns.session.events)
    with pytest.raises(FixRefused):
        ns.plan_fix(CODE)  # identical code is no fix
    assert len(ns.session.events) == before and ns.plan is None
    assert ns.tracker.fix_button.disabled is False


def _steps(n, start=0, nan_at=None):
    out = []
    for i in range(start, start + n):
        loss = "nan" if i == nan_at else 1.0 / (i + 1)
        out.append({"t": "step", "i": i, "loss": loss, "gn": 1.0,
                    "mgn": {"0": 0.5, "2": 0.1}, "dt": 0.01})
    return out


def test_loss_curves_mark_nan_and_oom():
    panel = LossCurves()
    events = [{"t": "start"}, *_steps(20, nan_at=12),
              {"t": "metric", "name": "val_acc", "value": 0.5, "step": 10, "epoch": 0},
              {"t": "metric", "name": "val_loss", "value": 0.7, "step": 10, "epoch": 0},
              {"t": "error", "kind": "oom", "type": "OutOfMemoryError", "message": "x"}]
    panel.update(Run(events))
    assert panel.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "20 steps" in panel.status.value and "OutOfMemoryError" in panel.status.value


def test_follow_redraws_live_and_throttled(tmp_path):
    path = tmp_path / "record.jsonl"
    panel = LossCurves()

    def writer():
        with open(path, "a", buffering=1) as fh:
            for k in range(30):
                for e in _steps(2, start=2 * k):
                    fh.write(json.dumps(e) + "\n")
                time.sleep(0.03)
            fh.write('{"t": "step", "i": 60')  # a half-written line is not read

    with panel.follow(lambda: str(path), interval=0.2):
        t = threading.Thread(target=writer)
        t.start()
        t.join()
        time.sleep(0.3)
        live = panel.redraws
    assert 1 <= live <= 10  # about one redraw per interval, not one per event
    assert "60 steps" in panel.status.value


def test_record_follower_switches_files(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"t": "step"}) + "\n")
    current = [str(a)]
    follower = RecordFollower(lambda: current[0])
    assert follower.poll() and len(follower.events) == 1
    assert not follower.poll()
    b.write_text("")
    current[0] = str(b)
    assert not follower.poll() and follower.events == []


def test_gradient_panel_histogram_slider():
    hists = [{"t": "hist", "step": s, "param": p, "lo": -1.0, "hi": 1.0, "counts": [1, 2, 3]}
             for s in (10, 20, 30) for p in ("0.weight", "2.weight")]
    panel = GradientPanel()
    panel.update(Run([*_steps(40), *hists]))
    assert list(panel.param.options) == ["0.weight", "2.weight"]
    assert panel.step.max == 2
    first = panel.histogram.value
    panel.step.value = 2
    assert panel.step.description == "step 30"
    assert panel.histogram.value != first
    assert panel.norms.value[:4] == b"\x89PNG"


def test_findings_table_shows_file_line(tmp_path):
    ns = reproduced(tmp_path)
    table = ns.findings_table
    assert isinstance(table, FindingsTable)
    assert "no findings" in table.value
    ns.isolate()
    assert "runs/0/cell.py:1" in table.value and "lr_range" in table.value


def test_close_drops_widgets_and_observers(tmp_path):
    ns = reproduced(tmp_path)
    tracker = ns.tracker
    ns.close()
    assert ns._observers == [] and tracker.comm is None
