"""Widget state without a browser: a recording comm stands in for the frontend.

The tracker and the findings table follow the DebugSession (``on_change``: whichever object
appends) and render its state; the tracker's ``fix_button`` is never toggled by hand, only the
newest tracker is live, and ``click()`` approves the recorded plan; the panels render from
records; the live follower redraws a few times per second.
"""

from __future__ import annotations

import json
import re
import threading
import time

import comm
import numpy as np
import pytest

from model_debugger import session as session_module
from model_debugger.notebook import NotebookSession
from model_debugger.phases import plan_fix
from model_debugger.records import ArtifactInfo, Classification, Evidence, Finding, Run
from model_debugger.session import DebugSession, GateError
from model_debugger.widgets import FindingsTable, GradientPanel, LossCurves, PhaseTracker
from model_debugger.widgets.curves import RecordFollower

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


def reproduced(tmp_path) -> NotebookSession:
    """A kernel session past Reproduce/Classify (recorded through the DebugSession)."""
    ns = NotebookSession({"__name__": "__main__"}, root=str(tmp_path / ".model_debugger"))
    s = ns.session
    s.store.write("cell.py", CODE)
    s.record_artifact(ArtifactInfo("cell", seed=0, copy="cell.py"), code=CODE, prelude="")
    s.record_reproduce({"status": "reproduced", "summary": "reproduced 1/1", "steps": 3})
    s.record_classification(Classification("loss_not_decreasing", (), (
        Evidence("loss_relative_drop", -0.01, "relative decrease < 0.05"),)), {})
    return ns


def isolated(session, confirmed=True, check="lr_range") -> None:
    """Record what a real Isolate would, without training."""
    where = {"file": session.store.path("runs/0/cell.py"), "line": 1}
    session.record_findings([Finding(check, "hyperparameter", confirmed,
                                     "the learning rate is 1000x too small", where,
                                     {"lr": 1e-5, "safe_lr": 0.1})])


def planned(session) -> dict:
    """Plan the fix of the current finding and record it as awaiting approval."""
    plan = plan_fix(session, CODE.replace("1e-5", "0.1"))
    session.record_plan(plan)
    return plan


def _strip(tracker) -> dict[str, str]:
    """What the tracker's HTML says of each phase."""
    cells = re.findall(r"<b>(\w+)</b><br><span style='color:[^']+'>(\w+)</span>",
                       tracker.phases.value)
    return {p.lower(): st for p, st in cells}


def test_tracker_renders_the_phase_strip_of_the_state(tmp_path):
    ns = reproduced(tmp_path)
    tracker = ns.tracker
    state = ns.session.state
    assert _strip(tracker) == dict(state.strip)
    assert _strip(tracker) == {"reproduce": "done", "classify": "done", "isolate": "current",
                               "fix": "blocked", "verify": "blocked"}
    assert "needs a confirmed finding from Isolate" in tracker.phases.value
    assert [(p["phase"], p["status"]) for p in ns.report()["phases"]] == list(state.strip)


def test_fix_button_follows_the_session_and_click_approves(tmp_path, comms):
    ns = reproduced(tmp_path)
    tracker = ns.tracker
    assert isinstance(tracker, PhaseTracker)
    assert tracker.fix_button.disabled is True  # no confirmed evidence yet
    ns.session.record_evidence("print('x=1')", "x=1", {"x": 1.0})
    assert tracker.fix_button.disabled is True  # evidence alone confirms nothing
    isolated(ns.session)
    assert ns.session.fix_allowed and _strip(tracker)["fix"] == "current"
    assert tracker.fix_button.disabled is True  # nothing to approve yet
    assert "%%fix" in tracker.fix_button.tooltip
    tracker.fix_button.click()  # and a click approves nothing
    assert "no plan to approve" in tracker.message.value
    assert ns.session.pending_fix is None

    planned(ns.session)  # through the DebugSession directly: the tracker follows
    assert tracker.fix_button.disabled is False
    sent = [m for c in comms for m in c.messages
            if m and m.get("method") == "update" and "disabled" in m.get("state", {})]
    assert sent and sent[-1]["state"]["disabled"] is False  # the frontend was told
    tracker.fix_button.click()
    assert ns.session.pending_fix["finding"] == "lr_range"
    assert tracker.fix_button.disabled is True  # a fix awaits Verify
    assert "verify" in tracker.message.value
    assert "<b>verify</b>" in tracker.phases.value
    sent = [m for c in comms for m in c.messages
            if m and m.get("method") == "update" and "disabled" in m.get("state", {})]
    assert sent[-1]["state"]["disabled"] is True
    assert tracker.fix_button.button_style == ""  # disabled, and it looks it (not green)
    ns.session.record_verification({"verdict": "resolved", "category": "gradient_instability",
                                    "seeds": [0], "remaining": []})
    assert "%verify" not in tracker.message.value  # no stale "run %verify" after Verify
    assert "Done (resolved)" in tracker.message.value and "%md_export" in tracker.message.value


def test_the_plan_survives_a_restart_and_is_approved_by_a_new_kernel(tmp_path):
    ns = reproduced(tmp_path)
    isolated(ns.session)
    planned(ns.session)
    directory = ns.session.directory
    ns.close()  # the kernel dies; only the folder is left

    loaded = DebugSession.load(directory)
    assert loaded.state.plan is not None and loaded.state.plan.finding == "lr_range"
    again = NotebookSession({"__name__": "__main__"}, root=str(tmp_path / ".model_debugger"))
    again.use(loaded)
    tracker = again.tracker
    assert tracker.fix_button.disabled is False  # the plan awaits approval, as saved
    tracker.fix_button.click()
    assert DebugSession.load(directory).pending_fix["finding"] == "lr_range"
    assert DebugSession.load(directory).state.plan is None


def test_another_session_object_refreshes_the_views(tmp_path):
    ns = reproduced(tmp_path)
    tracker, table = ns.tracker, ns.findings_table
    other = DebugSession.load(ns.session.directory)  # e.g. a phase run with its own object
    isolated(other)
    assert _strip(tracker)["fix"] == "current" and "lr_range" in table.value
    assert ns.report()["queue"] == ["lr_range"]  # the kernel's object read the new event
    planned(other)
    assert tracker.fix_button.disabled is False
    tracker.fix_button.click()  # approves what the other object recorded
    assert other.state.pending is None and DebugSession.load(
        other.directory).pending_fix["finding"] == "lr_range"


def test_only_the_newest_tracker_is_live(tmp_path):
    ns = reproduced(tmp_path)
    isolated(ns.session)
    older = ns.new_tracker()
    newer = ns.new_tracker()
    assert ns.tracker is newer and not older.live and newer.live
    planned(ns.session)
    assert newer.fix_button.disabled is False
    assert older.fix_button.disabled is True  # read-only, and it looks it
    assert _strip(older) == _strip(newer) == dict(ns.session.state.strip)  # never stale
    assert "read-only" in older.phases.value and "read-only" not in newer.phases.value
    older.fix_button.click()  # a click on the old copy (its view may lag): nothing happens
    older._approve()
    assert ns.session.pending_fix is None and "read-only" in older.message.value
    newer.fix_button.click()
    assert ns.session.pending_fix["finding"] == "lr_range"
    assert _strip(older)["verify"] == "current"  # still following the session


def test_unconfirmed_finding_keeps_button_disabled(tmp_path):
    ns = reproduced(tmp_path)
    isolated(ns.session, confirmed=False)
    assert ns.tracker.fix_button.disabled is True
    with pytest.raises(GateError):
        planned(ns.session)
    assert "needs a confirmed finding" in ns.tracker.phases.value


def test_refused_plan_changes_nothing(tmp_path):
    from model_debugger.phases import FixRefused

    ns = reproduced(tmp_path)
    isolated(ns.session)
    before = len(ns.session.events)
    with pytest.raises(FixRefused):
        plan_fix(ns.session, CODE)  # identical code is no fix
    assert len(ns.session.events) == before and ns.session.state.plan is None
    assert ns.tracker.fix_button.disabled is True


def test_a_new_session_retires_the_old_views(tmp_path):
    ns = reproduced(tmp_path)
    first, old = ns.tracker, ns.session
    ns.new_session()
    assert ns.session is not old and not first.live and ns.tracker is not first
    isolated(old)  # the old copy keeps following its own session
    assert _strip(first)["fix"] == "current" and _strip(ns.tracker)["isolate"] != "done"


def _steps(n, start=0, nan_at=None):
    out = []
    for i in range(start, start + n):
        loss = "nan" if i == nan_at else 1.0 / (i + 1)
        out.append({"t": "step", "i": i, "loss": loss, "gn": 1.0,
                    "mgn": {"0": 0.5, "2": 0.1}, "dt": 0.01})
    return out


def test_loss_curves_mark_nan_and_oom():
    panel = LossCurves(interactive=False)  # the PNG fallback (no plotly)
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


@pytest.mark.parametrize("odd", ['1,2', '{"t": "step"},{"t": "step"}', '[1]', '{"t": "st'])
def test_record_follower_keeps_only_whole_events(tmp_path, odd):
    """A line that is not one JSON object (numbers, two objects, a cut line) is skipped; its
    neighbours are read, and no non-event reaches the panel (it would fail every redraw)."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"t": "step", "i": 1}\n' + odd + '\n{"t": "step", "i": 2}\n')
    follower = RecordFollower(lambda: str(path))
    assert follower.poll()
    assert follower.events == [{"t": "step", "i": 1}, {"t": "step", "i": 2}]


def test_gradient_panel_histogram_slider():
    hists = [{"t": "hist", "step": s, "param": p, "lo": -1.0, "hi": 1.0, "counts": [1, 2, 3]}
             for s in (10, 20, 30) for p in ("0.weight", "2.weight")]
    panel = GradientPanel(interactive=False)
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
    isolated(ns.session)
    assert "runs/0/cell.py:1" in table.value and "lr_range" in table.value


def test_close_drops_widgets_and_observers(tmp_path):
    ns = reproduced(tmp_path)
    tracker, table = ns.tracker, ns.findings_table
    directory = ns.session.directory
    ns.close()
    assert tracker.comm is None and table.comm is None
    assert not [r for r in session_module._observers.get(directory, []) if r() is not None]
    isolated(DebugSession.load(directory))  # nothing follows it any more, nothing breaks


def test_the_live_figure_has_no_placeholder_axes_and_a_chance_line():
    import _synthetic as syn

    from model_debugger.figures import loss_figure

    loss = syn.steps_events(np.linspace(1.0, 0.4, 50))
    alone = loss_figure(syn.make_run(loss), metrics=True, live=True)
    assert len(alone.axes) == 1  # nothing tracked: no empty "metrics" axis beside the loss
    run = syn.make_run(loss, syn.targets_counts([70, 30]),
                       syn.metric("val_acc", [0.6, 0.7, 0.72]))
    fig = loss_figure(run, metrics=True, live=True)
    assert len(fig.axes) == 2
    lines = [ln for ln in fig.axes[1].get_lines() if "majority-class rate" in ln.get_label()]
    assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(0.7)


# -- the interactive (plotly) panels ------------------------------------------------------------
def _nan_oom_run():
    return Run([{"t": "start"}, *_steps(20, nan_at=12),
                {"t": "metric", "name": "val_acc", "value": 0.5, "step": 10, "epoch": 0},
                {"t": "metric", "name": "val_loss", "value": 0.7, "step": 10, "epoch": 0},
                {"t": "error", "kind": "oom", "type": "OutOfMemoryError", "message": "x"}])


def _vlines(fig) -> dict[float, str]:
    texts = {round(a.x, 6): a.text for a in fig.layout.annotations if a.x is not None and a.text}
    return {s.x0: texts.get(s.x0, "") for s in fig.layout.shapes if s.x0 == s.x1}


def test_the_interactive_chart_marks_nan_and_oom_and_toggles_log():
    panel = LossCurves(interactive=True)
    assert panel.chart is not None and panel.smoothing in panel.children
    panel.update(_nan_oom_run())
    chart = panel.chart
    names = [t.name for t in chart.data]
    assert names == ["train loss", "train loss (smoothed)", "val_loss", "val_acc"]
    raw = chart.data[0]
    assert np.isnan(raw.y[12]) and raw.y[3] == pytest.approx(0.25)  # NaN is a gap, values exact
    marks = _vlines(chart)
    assert "first non-finite (step 12)" in marks[12] and marks[19] == "OOM at step 19"
    (toggle,) = chart.layout.updatemenus
    assert [b.label for b in toggle.buttons] == ["linear", "log"]
    assert toggle.buttons[1].args[0] == {"yaxis.type": "log"}


def test_smoothing_slider_redraws_and_zero_shows_the_raw_curve():
    import _synthetic as syn

    loss = 1.0 + 0.5 * np.sin(np.arange(100))  # noisy: smoothing visibly changes it
    panel = LossCurves(interactive=True)
    panel.update(syn.make_run(syn.steps_events(loss)))
    smoothed = np.array(panel.chart.data[1].y, dtype=float)
    assert smoothed.std() < 0.5 * loss.std()
    panel.smoothing.value = 0.9
    smoother = np.array(panel.chart.data[1].y, dtype=float)
    assert smoother[20:].std() < smoothed[20:].std()
    panel.smoothing.value = 0.0
    assert [t.name for t in panel.chart.data] == ["train loss"]
    assert panel.chart.data[0].opacity == 1.0


def test_one_series_per_quantity_with_chance_and_constant_predictor_lines():
    import _synthetic as syn

    from model_debugger.widgets import charts

    run = syn.make_run(syn.steps_events(np.linspace(1.0, 0.4, 50)), syn.targets_counts([70, 30]),
                       syn.metric("val_loss", [0.9, 0.8]), syn.metric("eval_loss", [0.9, 0.8]),
                       syn.metric("loss", [0.95, 0.85]),  # the per-epoch train loss: not drawn
                       syn.metric("val_accuracy", [0.6, 0.72]))
    fig = charts.loss_chart(run)
    quantities = [t.meta["quantity"] for t in fig.data]
    assert quantities.count("train_loss") == 1 and "loss" not in quantities
    assert len([q for q in quantities if q in ("val_loss", "eval_loss")]) == 1
    levels = {round(s.y0, 4) for s in fig.layout.shapes if s.y0 == s.y1}
    chance, constant = 0.7, -(0.7 * np.log(0.7) + 0.3 * np.log(0.3))
    assert {round(chance, 4), round(constant, 4)} <= levels
    alone = charts.loss_chart(syn.make_run(syn.steps_events(np.linspace(1.0, 0.4, 50))))
    assert not alone.layout.annotations  # nothing tracked: no metrics panel, no titles of one


def test_gradient_panel_heatmap_and_no_histogram_browser_without_histograms():
    panel = GradientPanel(interactive=True)
    hists = [{"t": "hist", "step": s, "param": "0.weight", "lo": -1.0, "hi": 1.0,
              "counts": [1, 2, s]} for s in (10, 20)]
    panel.update(Run([*_steps(40), *hists]))
    (heat,) = panel.heatmap.data
    assert heat.type == "heatmap" and list(heat.y) == ["0", "2"] and len(heat.x) == 40
    assert heat.z[0][0] == pytest.approx(np.log10(0.5))
    assert panel.browser.layout.display is None
    first = panel.hist_chart.data[0].y
    panel.step.value = 1
    assert panel.hist_chart.data[0].y != first and "step 20" in panel.hist_chart.layout.title.text
    panel.update(Run(_steps(5)))  # a Keras run: norms, no histograms
    assert panel.browser.layout.display == "none"
    assert "no gradient histograms recorded" in panel.note.value


def test_verify_overlay_draws_before_dashed_and_after_solid():
    from model_debugger.widgets import charts

    before = {0: Run(_steps(10, nan_at=5)), 1: Run(_steps(10))}
    after = {0: Run(_steps(10)), 1: Run(_steps(10))}
    fig = charts.overlay_chart(before, after, smoothing=0)
    styles = {t.name: t.line.dash for t in fig.data}
    assert styles == {"before, seed 0: train loss": "dash", "after, seed 0: train loss": "solid",
                      "before, seed 1: train loss": "dash", "after, seed 1: train loss": "solid"}
    assert "before, seed 0: first non-finite (step 5)" in _vlines(fig).values()
    colors = {t.name: t.line.color for t in fig.data}
    assert colors["before, seed 1: train loss"] == colors["after, seed 1: train loss"] != \
        colors["after, seed 0: train loss"]  # one colour per seed


def test_a_loss_spanning_decades_starts_on_a_log_axis():
    import _synthetic as syn

    from model_debugger.widgets import charts

    falling = syn.make_run(syn.steps_events(np.geomspace(10.0, 0.01, 50)))
    flat = syn.make_run(syn.steps_events(np.linspace(1.0, 0.5, 50)))
    assert charts.loss_chart(falling).layout.yaxis.type == "log"
    assert charts.loss_chart(flat).layout.yaxis.type == "linear"


def test_a_live_redraw_sends_new_values_into_the_same_traces():
    """While the structure (traces, marks, axis type) stays, a redraw only replaces x and y."""
    panel = LossCurves(interactive=True)
    panel.update(Run(_steps(10)))
    first = panel.chart.data[0]
    panel.update(Run(_steps(30)))
    assert panel.chart.data[0] is first and len(first.x) == 30
    panel.update(Run(_steps(40, nan_at=35)))  # a new mark: the chart is rebuilt
    assert panel.chart.data[0] is not first
    assert any("first non-finite (step 35)" in (a.text or "") for a in panel.chart.layout.annotations)


def test_recorded_names_are_text_in_the_charts():
    """A metric name is recorded text: plotly reads tags in trace names as markup (links,
    bold), so they are escaped."""
    import _synthetic as syn

    from model_debugger.widgets import charts

    evil = '<a href="javascript:alert(1)">val_acc</a>'
    run = syn.make_run(syn.steps_events(np.linspace(1.0, 0.4, 20)), syn.metric(evil, [0.5, 0.6]))
    names = [t.name for t in charts.loss_chart(run).data]
    assert not any("<" in n for n in names) and any("&lt;a href" in n for n in names)
