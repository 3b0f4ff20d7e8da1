"""The view layer: one document per phase result, the same words in the CLI and the magics, and
every recorded string escaped in HTML."""

from __future__ import annotations

import io
import os
from html.parser import HTMLParser

import pytest

from model_debugger import views
from model_debugger.records import (
    Classification,
    Evidence,
    Finding,
    FixPlan,
    Reproduction,
    Verification,
)
from model_debugger.session import DebugSession

XSS = "<img src=x onerror=alert(1)> <script>alert('b')</script> & \"q\""

REP = Reproduction("reproduced", "reproduced 2/3", "gradient_instability",
                   {"total": 3, "reproduced": 2, "categories": []}, 40,
                   extra={"epochs": 2, "seconds": 4.25, "error": None,
                          "tried": ["run 1: seed=0, 40 steps -> gradient_instability"],
                          "code": {"backward": {"file": "/w/train.py", "line": 12}}})
CLS = Classification("gradient_instability", ("overfitting",),
                     (Evidence("first_nonfinite_step", 3, "first non-finite grad"),))
FOUND = (Finding("lr_range", "hyperparameter", True, "lr 3 diverges",
                 {"file": "/w/s/runs/0/cell.py", "line": 1}, {}),
         Finding("gradient_flow", "hyperparameter", False, "norms grow", None, {}))
PLAN = FixPlan("lr_range", "hyperparameter", diff="-lr=3\n+lr=0.05\n",
               suggestion="lower the rate", expected="finite losses",
               overrides=("architecture change allowed",))
VER = Verification("resolved", "gradient_instability", "lr_range", "finite_fraction", (0, 1),
                   {"values": [0.25, 0.5], "mean": 0.375, "present": "2/2"},
                   {"values": [1.0, 1.0], "mean": 1.0, "present": "0/2"},
                   extra={"direction": "higher", "noise_band": 0.05, "improvement": 0.625})


def test_each_record_reads_as_its_json_and_as_text():
    for build, record in ((views.reproduction, REP), (views.classification, CLS),
                          (views.plan, PLAN), (views.verification, VER)):
        assert views.text(build(record)) == views.text(build(record.to_json()))
    assert views.text(views.findings(FOUND, "/w/s")) == \
        views.text(views.findings([f.to_json() for f in FOUND], "/w/s"))
    rep = views.text(views.reproduction(REP))
    assert rep.splitlines()[0] == ("Reproduce: reproduced 2/3 (reproduced) - 40 steps, 2 epochs, "
                                   "4.2 s")
    assert "  tried run 1: seed=0, 40 steps -> gradient_instability" in rep
    assert "  code: backward at /w/train.py:12" in rep
    assert views.text(views.classification(CLS)) == (
        "Classification: gradient_instability (secondary: overfitting)\n"
        "  first_nonfinite_step = 3  (first non-finite grad)")
    found = views.text(views.findings(FOUND, "/w/s"))
    assert "  [confirmed] lr_range (hyperparameter) at runs/0/cell.py:1\n      lr 3 diverges" \
        in found  # inside the session folder: relative
    assert "  [hypothesis] gradient_flow (hyperparameter) at -" in found
    ver = views.text(views.verification(VER))
    assert ver.startswith("Verify: resolved (gradient_instability: finite_fraction, higher is "
                          "better; seeds [0, 1])")
    assert "  before [0.25, 0.5] mean 0.375; gradient_instability in 2/2" in ver
    assert "  noise band 0.05, improvement 0.625" in ver
    plan = views.text(views.plan(PLAN))
    assert plan.startswith("Fix plan for lr_range (hyperparameter) at -\n  suggestion: lower")
    assert plan.endswith("-lr=3\n+lr=0.05")


def test_missing_results_say_why():
    assert views.text(views.reproduction(None)) == "Reproduce: not recorded"
    assert views.text(views.classification(None, "needs a reproduce record")) == \
        "Classification: not classified (needs a reproduce record)"
    assert views.text(views.findings([], ran=False, reason="needs a classification")) == \
        "Isolate: not run (needs a classification)"
    assert views.text(views.findings([])) == \
        "Isolate: no findings (nothing measured points at a cause)"
    assert views.verification(None) is None and views.fix(None) is None


def _session(tmp_path) -> DebugSession:
    s = DebugSession.create(str(tmp_path / "sessions"))
    s._append("artifact", type="script", script="/w/train.py", args=[], seed=0)
    s.record_reproduce(REP)
    s.record_classification(CLS, {})
    s.record_findings(list(FOUND))
    return s


def test_the_cli_and_the_magics_print_the_same_words(tmp_path):
    """One view layer: the CLI's report text holds exactly the magics' text/plain of each part."""
    from model_debugger.cli import _print_human
    from model_debugger.widgets import views as shown

    s = _session(tmp_path)
    report = s.report()
    out = io.StringIO()
    _print_human(report, out, s.state.isolations > 0)
    cli = out.getvalue()
    for part in (shown.reproduce(report["reproduce"], root=s.directory),
                 shown.classification(report), shown.classification(s.state),
                 shown.findings(report["findings"], s.directory),
                 shown.findings(s.state.findings, s.directory)):
        assert part.text in cli, part.text
    assert f"Next phase: fix (fix allowed: true)\nSession saved: {s.directory}\nNext: " in cli
    assert cli.endswith(f"model-debugger verify {s.directory} --fixed FIXED.py\n")


class _Live(HTMLParser):
    """Tags and attributes a browser would act on."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("img", "script", "iframe", "svg") or any(n.startswith("on") for n, _ in attrs):
            self.found.append(tag)


@pytest.mark.parametrize("build", [
    lambda: views.reproduction(Reproduction("crashed", XSS, None, {}, 0, reason=XSS,
                                            extra={"error": XSS, "tried": [XSS]})),
    lambda: views.classification(Classification("healthy", (), (Evidence(XSS, XSS, XSS),))),
    lambda: views.findings([Finding(XSS, "data", True, XSS, {"file": XSS, "line": XSS})]),
    lambda: views.plan(FixPlan(XSS, "data", diff=XSS, suggestion=XSS, overrides=(XSS,))),
    lambda: views.refused([XSS]),
    lambda: views.message(XSS, "error"),
    lambda: views.status({"session": XSS, "session_dir": XSS, "queue": [XSS],
                          "gates": {"fix": XSS}, "fix": {"finding": XSS}}),
])
def test_every_recorded_string_is_escaped_in_html(build):
    body = views.html(build())
    parser = _Live()
    parser.feed(body)
    assert parser.found == [], body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "&lt;script&gt;" in body
    assert XSS in views.text(build())  # the text keeps it as written


def test_the_widget_views_carry_both_representations(tmp_path):
    from model_debugger.widgets import views as shown

    s = _session(tmp_path)
    bundle = shown.findings(s.state.findings, s.directory)._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "runs/0/cell.py:1" in bundle["text/plain"] and "md-check" in bundle["text/html"]
    empty = DebugSession.create(str(tmp_path / "other"))
    why = shown.classification(empty.report()).text
    assert "needs a reproduce record" in why and "%%reproduce" in why
    assert shown.location({"file": os.path.join(s.directory, "a.py"), "line": 3},
                          s.directory) == "a.py:3"


def test_status_of_a_finished_session_lists_no_gates():
    from model_debugger import views

    gates = {"fix": "needs a confirmed finding from Isolate", "verify": "needs an approved fix"}
    done = views.text([views.status({"phase": "done", "gates": gates, "session": "s"})])
    assert "gate" not in done and "%md_export" in done
    open_ = views.text([views.status({"phase": "fix", "gates": gates, "session": "s"})])
    assert "gate verify: needs an approved fix" in open_


def test_the_findings_view_reads_like_a_checks_report(tmp_path, monkeypatch):
    """A summary line, a badge per finding (an experiment that ran and failed is ``refuted``),
    the before/after numbers, the rest of the evidence folded and rounded, a link to the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("x = 1\n")
    rerun = {"id": "lr_from_range", "metric": "loss_final", "direction": "lower",
             "before_mean": 2.302585, "after_mean": 0.1234567, "noise_band": 0.0312345,
             "seeds": [0, 1], "moved": True}
    found = [
        Finding("lr_range", "hyperparameter", True, "the rate is too low",
                {"file": str(tmp_path / "train.py"), "line": 1},
                {"category": "loss_not_decreasing", "intervention": rerun, "lr": 1e-05,
                 "finals": [0.123456789, 0.2] * 6, "strength": 0.9}),
        Finding("dropout_rate", "architecture", False, "dropout is high", None,
                {"undone": False, "heldout_changed": 0.51234, "heldout_as_set": 0.5}),
        Finding("feature_scaling", "data", False, "inputs on a large scale", None,
                {"intervention": {**rerun, "id": "standardize_inputs", "moved": False}}),
        Finding("gradient_flow", "architecture", False, "norms shrink", None,
                {"intervention": {"id": "x", "untested": "not re-run: already cured"}}),
    ]
    assert [views.finding_status(f) for f in found] == \
        ["confirmed", "refuted", "refuted", "hypothesis"]
    doc = views.findings(found, str(tmp_path))
    text = views.text(doc)
    summary = text.splitlines()[1]
    assert summary.startswith("  Summary: loss_not_decreasing from hyperparameter (lr_range) at "
                              "train.py:1, confirmed by a re-run with the cause undone "
                              "(1 confirmed, 2 refuted, 1 hypothesis). Next: ")
    assert "%%fix" in summary
    assert "      measured: re-run with lr_from_range: loss_final 2.303 -> 0.1235 (lower is " \
           "better; noise band 0.03123; seeds [0, 1])" in text
    body = views.html(doc)
    assert body.count("md-badge-refuted") == 2 and body.count("md-badge-confirmed") == 1
    # opens the file relative to the working folder, at the line (the editor's 0-based line)
    assert "<a href='train.py#line=0' class='md-location'>train.py:1</a>" in body
    assert "<details>" in body and "<td>finals</td><td>[0.1235, 0.2, 0.1235" in body
    assert "strength" not in body
    unconfirmed = views.text(views.findings(found[1:]))
    assert "Summary: no cause confirmed (2 refuted, 1 hypothesis). Next: %isolate" in unconfirmed


def test_a_line_of_a_notebook_cell_reads_as_the_cells_line(tmp_path, monkeypatch):
    """A location in a notebook session's copy of its cell names the ``%%reproduce`` cell (or
    the ``%%fix`` cell when the copy holds other code) and carries what the extension needs to
    reveal it; a user's own ``cell.py`` stays a file location with a link at its line."""
    from model_debugger.store import CELL, SESSION_FILE, Store, cell_copy

    monkeypatch.chdir(tmp_path)
    session = tmp_path / ".model_debugger" / "abc"
    (session / "runs" / "0").mkdir(parents=True)
    (session / "isolate" / "2").mkdir(parents=True)
    (session / SESSION_FILE).write_text("{}")
    (session / CELL).write_text("x = 1\ny = 2\n")
    (session / "runs" / "0" / CELL).write_text("x = 1\ny = 2\n")
    (session / "isolate" / "2" / CELL).write_text("x = 1\ny = 3\n")
    (tmp_path / CELL).write_text("x = 1\ny = 2\n")  # the user's own file of that name
    assert cell_copy(str(session / "runs" / "0" / CELL)) == "reproduce"
    assert cell_copy(str(session / "isolate" / "2" / CELL)) == "fix"
    assert cell_copy(str(tmp_path / CELL)) is None
    assert cell_copy(str(session / "runs" / "0" / "train.py")) is None
    assert Store.code_beside(str(session / "runs" / "0" / "record.jsonl")) == \
        str(session / "runs" / "0" / CELL)

    found = [Finding("lr_range", "hyperparameter", True, "the rate",
                     {"file": str(session / "runs" / "0" / CELL), "line": 2}),
             Finding("dropout_rate", "architecture", False, "dropout",
                     {"file": str(session / "isolate" / "2" / CELL), "line": 1}),
             Finding("feature_scaling", "data", False, "scale",
                     {"file": str(tmp_path / CELL), "line": 2})]
    doc = views.findings(found, str(session))
    text = views.text(doc)
    assert "at %%reproduce cell, line 2" in text and "at %%fix cell, line 1" in text
    assert "runs/0" not in text and "isolate/2" not in text
    body = views.html(doc)
    assert ("<a class='md-location' data-md-cell='reproduce' data-md-line='2' "
            "title='reveal the cell'>%%reproduce cell, line 2</a>") in body
    assert "data-md-cell='fix' data-md-line='1'" in body
    assert "href='cell.py#line=1'" in body  # the user's file: a link at its line
