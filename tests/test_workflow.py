"""One workflow: each phase once, against an Artifact and a DebugSession (issue #15).

Real training in child processes and in this process; canned runs (``_synthetic.CannedArtifact``)
where only the phase's bookkeeping is under test.
"""

from __future__ import annotations

import ast
import gc
import os
import re
import textwrap
from pathlib import Path

import _synthetic as syn
import pytest

from model_debugger.artifacts import CellArtifact, Intervention, ScriptArtifact, Version
from model_debugger.phases import isolate, plan_fix, reproduce, verify
from model_debugger.records import Classification, Evidence, Finding, RecordError
from model_debugger.session import DebugSession, GateError

PACKAGE = Path(__file__).resolve().parents[1] / "model_debugger"

SEEDED = textwrap.dedent("""\
    import torch
    from torch import nn

    lr = 0.05 if torch.initial_seed() == 0 else 40.0  # seed 0 trains, the others blow up
    torch.manual_seed(0)
    X = torch.randn(256, 8)
    y = (X[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(6):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = loss_fn(model(X[i:i + 32]), y[i:i + 32])
            loss.backward()
            opt.step()
""")

CELL = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(256, 8)
    y = (X[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for epoch in range(4):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(X[i:i + 32]), y[i:i + 32])
            loss.backward()
            opt.step()
""")


# -- Reproduce -> Isolate uses the recorded classification -----------------------------------

@pytest.mark.slow
def test_isolate_probes_the_recorded_classification_not_run_0s(tmp_path):
    """--runs 3 whose run 0 is healthy: Isolate still finds the cause of the recorded problem.

    On 758bf2b the probes ran in run 0's child under run 0's own classification (healthy) and
    recorded no finding at all.
    """
    script = tmp_path / "seeded.py"
    script.write_text(SEEDED)
    s = DebugSession.create(str(tmp_path / "root"))
    reproduce(s, ScriptArtifact(str(script)), runs=3, seed=0, probe_budget=20.0)
    st = s.state
    # run 0 (a small rate) is not unstable (at most a tentative plateau)
    assert st.reproduction.runs["categories"][0] in ("healthy", "loss_not_decreasing")
    assert st.classification.primary == "gradient_instability"
    assert st.findings and any(f.confirmed for f in st.findings), st.findings
    assert {f.category for f in st.findings} <= {"gradient_instability",
                                                 *st.classification.secondary}
    # the probes ran in a re-run of the run that showed the problem (seed 1), not in run 0
    assert os.path.exists(os.path.join(s.directory, "isolate", "1", "record.jsonl"))
    assert st.phase == "fix"


# -- probes by id add to the round -----------------------------------------------------------

def _at_fix(tmp_path, findings) -> DebugSession:
    s = DebugSession.create(str(tmp_path / "root"))
    art = syn.CannedArtifact({"reproduced": syn.make_run(syn.healthy_steps(30))})
    s.store.write("artifact.py", art.code)
    from model_debugger.records import ArtifactInfo

    s.record_artifact(ArtifactInfo("script", script="/nonexistent/train.py", seed=0,
                                   copy="artifact.py"))
    s.record_reproduce({"status": "reproduced", "problem": "gradient_instability",
                        "runs": {"total": 1, "reproduced": 1,
                                 "categories": ["gradient_instability"]}})
    s.record_classification(Classification("gradient_instability", (), (
        Evidence("first_nonfinite_step", 3, ""),)), {})
    s.record_findings(findings)
    return s


def _f(check, root="hyperparameter", confirmed=True, category="gradient_instability"):
    return Finding(check, root, confirmed, f"{check} explains it", None, {"category": category})


def test_probes_run_by_id_add_to_the_findings_and_keep_the_fix_gate(tmp_path):
    s = _at_fix(tmp_path, [_f("lr_range")])
    assert s.state.gates["fix"] is None
    run = syn.make_run(syn.steps_events(syn.decay(40)))
    art = syn.CannedArtifact({"current": run})
    found = isolate(s, art, ids=["constant_baseline"], budget=5.0)
    assert "lr_range" in [f.check for f in found]  # kept
    assert s.state.queue[0].check == "lr_range" and s.state.gates["fix"] is None
    assert s.events[-1]["added"] is True
    # a new round (no ids) replaces them
    s._append("isolate", findings=[], added=False)
    assert s.state.findings == () and s.state.gates["fix"] is not None


# -- the plan is an event ----------------------------------------------------------------------

def test_the_fix_plan_survives_a_restart_and_is_approved_after_it(tmp_path):
    s = _at_fix(tmp_path, [_f("lr_range")])
    plan = plan_fix(s, "x = 2\n")
    s.record_plan(plan)
    again = DebugSession.load(s.directory)  # a new kernel
    assert again.state.plan is not None and again.state.plan.finding == "lr_range"
    assert again.report()["plan"]["diff"] == plan["diff"]
    again.approve()
    assert again.state.pending is not None and again.state.plan is None
    assert again.phase == "verify"
    with pytest.raises(GateError, match="no plan to approve"):
        again.approve()


def test_a_plan_for_another_finding_or_without_a_gate_is_refused(tmp_path):
    s = _at_fix(tmp_path, [_f("lr_range"), _f("missing_zero_grad", "training_loop")])
    plan = plan_fix(s, "x = 2\n")
    with pytest.raises(GateError, match="current finding is 'lr_range'"):
        s.record_plan({**plan, "finding": "missing_zero_grad", "root_cause": "training_loop"})
    with pytest.raises(GateError, match="not a fix plan"):
        s.record_plan({"finding": "lr_range"})
    assert s.state.plan is None


# -- one state, every observer -----------------------------------------------------------------

def test_every_event_notifies_observers_of_any_session_object_of_the_folder(tmp_path):
    s = _at_fix(tmp_path, [_f("lr_range")])
    seen = []

    class View:
        def refresh(self, state):
            seen.append(state.phase)

    view = View()
    s.on_change(view.refresh)
    other = DebugSession.load(s.directory)  # e.g. the REST handler, or a script in the kernel
    other.record_plan(plan_fix(other, "x = 2\n"))
    assert seen == ["fix"]
    other.approve()
    assert seen == ["fix", "verify"]
    del view
    gc.collect()
    other.record_note("the view is gone: no callback, no error")
    assert seen == ["fix", "verify"]
    remove = s.on_change(lambda state: seen.append("lambda"))
    s.record_note("x")
    remove()
    s.record_note("y")
    assert seen[-1] == "lambda" and seen.count("lambda") == 1


def test_state_is_replayed_once_per_event_and_report_agrees_with_it(tmp_path, monkeypatch):
    from model_debugger import session as session_module

    s = _at_fix(tmp_path, [_f("lr_range")])
    calls = []
    real = session_module.replay
    monkeypatch.setattr(session_module, "replay", lambda ev: calls.append(1) or real(ev))
    s._cache = None
    rep = s.report()
    assert len(calls) == 1  # one replay for the whole report (was ~8 on 758bf2b)
    st = s.state
    assert rep["phase"] == st.phase == "fix"
    assert rep["phases"] == [{"phase": p, "status": x} for p, x in st.strip]
    assert dict(st.strip) == {"reproduce": "done", "classify": "done", "isolate": "done",
                              "fix": "current", "verify": "blocked"}
    with pytest.raises(AttributeError):
        st.phase = "verify"  # immutable


def test_the_log_only_grows_through_record_methods(tmp_path):
    s = DebugSession.create(str(tmp_path))
    assert not hasattr(s, "append")
    with pytest.raises(RecordError):
        s.record_reproduce({"status": "fine"})
    with pytest.raises(GateError, match="classify refused"):
        s.record_classification(Classification("overfitting"), {})
    with pytest.raises(RecordError, match="unknown category"):
        Classification("divergence")
    with pytest.raises(RecordError, match="root cause"):
        Finding("x", "optimizer", True, "")
    assert s.events == []


# -- Verify names its records; a second Verify reuses the kept fix's runs --------------------

def test_verify_names_the_record_of_each_side_and_reuses_known_runs(tmp_path):
    s = _at_fix(tmp_path, [_f("lr_range")])
    nan_steps = syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5)
    bad = syn.make_run(nan_steps)
    good = syn.make_run(syn.healthy_steps(30))
    art = syn.CannedArtifact({"current": bad, "fixed": good})
    s.record_fix(plan_fix(s, "x = 2\n"), approved=True)
    v = verify(s, art, [0, 1])
    assert v.records["before"] == {"0": "verify/1/before-0.jsonl", "1": "verify/1/before-1.jsonl"}
    assert v.records["after"] == {"0": "verify/1/after-0.jsonl", "1": "verify/1/after-1.jsonl"}
    for rel in (*v.records["before"].values(), *v.records["after"].values()):
        assert s.store.exists(rel)
    assert art.calls == [("current", 0), ("current", 1), ("fixed", 0), ("fixed", 1)]


# -- interventions and the step budget, in a cell and in a child -------------------------------

def test_a_cell_run_with_an_intervention_and_a_step_budget(tmp_path):
    ns = {"LR": 0.05}
    art = CellArtifact(ns, CELL)
    rec = str(tmp_path / "r0.jsonl")
    v = Version("reproduced", str(tmp_path / "copy.py"))
    base = art.run(v, 0, rec)
    assert base.error is None and len(base.run.steps) == 32
    lr0 = base.run.first("optimizer")
    short = art.run(v, 0, str(tmp_path / "r1.jsonl"), max_steps=5)
    assert len(short.run.steps) == 5
    assert type(short.error).__name__ == "StepBudget"
    from model_debugger.phases.reproduce import _result_of

    assert _result_of(short.run, "healthy")["status"] == "stopped_at_time_limit"  # planned
    scaled = art.run(v, 0, str(tmp_path / "r2.jsonl"),
                     intervention=Intervention("lr_scale", {"factor": 1000.0}))
    assert scaled.error is None
    assert ns["opt"].param_groups[0]["lr"] == pytest.approx(50.0)  # 0.05 x 1000
    import numpy as np

    assert not np.isfinite(scaled.run.series("loss")).all() or \
        np.nanmax(scaled.run.series("gn")) > 10 * np.nanmax(base.run.series("gn"))
    # nothing stays installed: a plain run is the baseline again
    again = art.run(v, 0, str(tmp_path / "r3.jsonl"))
    assert ns["opt"].param_groups[0]["lr"] == pytest.approx(0.05)
    assert len(again.run.steps) == 32 and lr0 is not None
    with pytest.raises(ValueError, match="unknown intervention"):
        art.run(v, 0, str(tmp_path / "r4.jsonl"), intervention=Intervention("nope"))


@pytest.mark.slow
def test_a_script_run_with_an_intervention_and_a_step_budget(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SEEDED.replace("lr = 0.05 if torch.initial_seed() == 0 else 40.0",
                                     "lr = 0.05"))
    art = ScriptArtifact(str(script))
    v = Version("reproduced", str(script))
    short = art.run(v, 0, str(tmp_path / "a.jsonl"), max_steps=7)
    assert len(short.run.steps) == 7 and short.run.error["type"] == "StepBudget"
    scaled = art.run(v, 0, str(tmp_path / "b.jsonl"), max_steps=20,
                     intervention=Intervention("lr_scale", {"factor": 800.0}))
    plain = art.run(v, 0, str(tmp_path / "c.jsonl"), max_steps=20)
    import numpy as np

    gn_scaled, gn_plain = scaled.run.series("gn"), plain.run.series("gn")
    assert not np.isfinite(scaled.run.series("loss")).all() or \
        np.nanmax(gn_scaled) > 5 * np.nanmax(gn_plain)


# -- the layout: one owner of the session folder, one of each phase ----------------------------

_LAYOUT = re.compile(r"""["'](record\.jsonl|session\.json|artifact\.py|cell\.py|findings\.json|"""
                     r"""\.model_debugger|fixes|runs|isolate|verify)["']""")


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        yield path, path.read_text(encoding="utf-8")


def test_no_module_outside_store_builds_a_session_path():
    """Every session path is built in store.py: no other module joins its layout names."""
    offenders = []
    for path, text in _sources():
        if path.name == "store.py":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "join":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                            _LAYOUT.fullmatch(repr(arg.value).replace("'", '"')):
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} "
                                         f"{arg.value!r}")
            if isinstance(node, ast.JoinedStr):  # f"runs/{i}/record.jsonl"
                lits = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                if re.search(r"(^|/)(runs|isolate|verify|fixes)/", lits) and "/" in lits:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} f-string")
    assert offenders == []


def test_each_phase_is_written_once():
    """One reproduce, one isolate, one verify: the functions that loop over runs, record a
    phase's result, or judge a verdict exist in phases/ only."""
    defs: dict[str, list[str]] = {}
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and not any(
                    getattr(d, "id", "") == "property" for d in node.decorator_list):
                defs.setdefault(node.name, []).append(str(path.relative_to(PACKAGE)))
    for name in ("reproduce", "isolate", "verify", "judge", "measure", "seeds_for",
                 "plan_fix", "seed_everything", "_verdict", "_result_of", "run_code"):
        where = [p for p in defs.get(name, [])
                 if not p.startswith(("widgets/", "notebook.py", "magics.py", "comm.py",
                                      "inprocess.py", "cli.py"))]
        assert len(where) <= 1, (name, where)
    # the front ends' methods of these names only call the phase (no loop over runs there)
    for path, text in _sources():
        if path.name in ("notebook.py", "magics.py", "inprocess.py", "comm.py"):
            assert "record_reproduce(" not in text and "record_verification(" not in text, path
            assert "record_findings(" not in text, path


def _import_graph() -> dict[str, set[str]]:
    """Every ``model_debugger`` module -> the package modules it imports (top level and inside
    functions alike: a lazy import is still a dependency)."""
    mods = {}
    for path, _ in _sources():
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    cand = f"{mod}.{alias.name}"
                    deps.add(cand if cand in mods else mod)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def test_no_import_circle_in_the_package():
    """No module imports (at any depth, even lazily) a module that imports it back. The package
    root's extension entry points (``load_ipython_extension``) are the one allowed way in."""
    graph = _import_graph()
    graph["model_debugger"] = set()
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for dep in sorted(graph[node]):
            if seen.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep] if dep in path else [node, dep])
            elif dep not in seen:
                visit(dep, path + [dep])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])
    assert cycles == []


def test_capture_and_probes_stay_below_the_workflow():
    """capture imports nothing above records; probes import no classification or workflow."""
    graph = _import_graph()
    low = {"model_debugger.records", "model_debugger._validate", "model_debugger.safe_write",
           "model_debugger.redact"}
    for name, deps in graph.items():
        if name.startswith("model_debugger.capture"):
            assert {d for d in deps if not d.startswith("model_debugger.capture")} <= low, name
        if name.startswith("model_debugger.probes"):
            assert not deps & {"model_debugger.classify", "model_debugger.session",
                               "model_debugger.phases", "model_debugger.diagnose"}, name


# -- confirmation by intervention --------------------------------------------------------------

@pytest.mark.slow
def test_a_learning_rate_finding_is_confirmed_by_re_running_at_the_safe_rate(tmp_path):
    """lr_range names lr_scale to its safe rate; re-running with it removes the instability, so
    the finding is confirmed by experiment and carries the before/after numbers."""
    script = tmp_path / "hot.py"
    script.write_text(SEEDED.replace("lr = 0.05 if torch.initial_seed() == 0 else 40.0",
                                     "lr = 40.0"))
    s = DebugSession.create(str(tmp_path / "root"))
    reproduce(s, ScriptArtifact(str(script)), runs=1, seed=0, probe_budget=20.0,
              intervene_seconds=120.0)
    lr = next(f for f in s.state.findings if f.check == "lr_range")
    ev = lr.evidence["intervention"]
    assert lr.evidence["confirmed_by"] == "intervention"
    assert ev["id"] == "lr_scale" and 0 < ev["params"]["factor"] < 0.1
    assert lr.confirmed and ev["moved"], ev
    assert len(ev["before"]) == len(ev["after"]) == 2
    assert "Re-running with lr_scale" in lr.explanation
    for label in ("baseline", "lr_scale"):
        for seed in (0, 1):
            assert s.store.exists(f"isolate/1/{label}-{seed}.jsonl")


def test_hypotheses_are_re_run_before_findings_an_experiment_already_settled(tmp_path):
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    art = syn.CannedArtifact({"current": nan, "current+default_init": syn.make_run(
        syn.healthy_steps(20))})
    settled = Finding("lr_range", "hyperparameter", True, "lr 10 diverges", None,
                      {"category": "gradient_instability", "lr": 10.0, "safe_lr": 0.01,
                       "undone": True})
    guess = Finding("initialization", "architecture", False, "weights 100x the default", None,
                    {"category": "gradient_instability"})
    out = confirm(s, art, [settled, guess], Version("current", s.store.path("artifact.py")), 1,
                  60.0)
    assert [f.check for f in out] == ["lr_range", "initialization"]  # the order given
    assert art.calls == [("current", 0), ("current", 1), ("current+default_init", 0),
                         ("current+default_init", 1),  # the hypothesis first: it cured the run
                         ("current+lr_scale", 0), ("current+lr_scale", 1)]  # still re-run
    assert out[1].confirmed and out[1].evidence["confirmed_by"] == "intervention"
    # a settled finding whose re-run did not move the signal stays confirmed, weakened
    assert out[0].confirmed and out[0].evidence["intervention"]["moved"] is False
    third = Finding("dropout_rate", "hyperparameter", False, "dropout 0.9", None,
                    {"category": "gradient_instability"})  # another hypothesis after a cure
    art.calls.clear()
    out = confirm(s, art, [guess, third], Version("current", s.store.path("artifact.py")), 2,
                  60.0)
    assert "already removed" in out[1].evidence["intervention"]["untested"]
    assert ("current+dropout_off", 0) not in art.calls


def test_a_symptom_gone_from_every_re_run_confirms_when_the_seeds_differ_too_widely(tmp_path):
    """One baseline seed goes NaN, the other only rises: no band can be crossed, yet the
    intervention removed the category from both."""
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    rising = syn.make_run(syn.steps_events([1.0 + 0.4 * i for i in range(20)]))
    art = syn.CannedArtifact({"current": lambda seed: nan if seed == 0 else rising,
                              "current+default_init": syn.make_run(syn.healthy_steps(20))})
    guess = Finding("initialization", "architecture", False, "weights 100x the default", None,
                    {"category": "gradient_instability"})
    got = confirm(s, art, [guess], Version("current", s.store.path("artifact.py")), 1, 60.0)[0]
    ev = got.evidence["intervention"]
    assert ev["improvement"] < ev["noise_band"] and ev["symptom_gone"]
    assert got.confirmed and ev["moved"]
    assert "removed gradient_instability from every re-run that showed it" in got.explanation


def test_a_finding_whose_intervention_changes_nothing_is_refuted(tmp_path):
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    art = syn.CannedArtifact({"current": nan})  # lr_scale re-runs are as bad as the baseline
    lr = _f("lr_range", confirmed=True)
    lr = Finding(lr.check, lr.root_cause, True, "lr 10 diverges", None,
                 {"category": "gradient_instability", "lr": 10.0, "safe_lr": 0.01})
    other = _f("detached_output", "training_loop")  # no intervention: left as it was
    out = confirm(s, art, [lr, other], Version("current", s.store.path("artifact.py")), 1, 60.0)
    assert out[1] == other
    assert not out[0].confirmed and out[0].evidence["intervention"]["moved"] is False
    assert "did not move" in out[0].explanation
    assert art.calls == [("current", 0), ("current", 1), ("current+lr_scale", 0),
                         ("current+lr_scale", 1)]
    good = syn.CannedArtifact({"current": nan, "current+lr_scale": syn.make_run(
        syn.healthy_steps(20))})
    moved = confirm(s, good, [lr], Version("current", s.store.path("artifact.py")), 2, 60.0)[0]
    assert moved.confirmed and moved.evidence["intervention"]["symptom_gone"]
    spent = confirm(s, good, [lr], Version("current", s.store.path("artifact.py")), 3, 0.0)[0]
    assert spent == lr  # no budget: untested, as the probe judged it


def test_an_intervention_that_breaks_the_program_is_untested_not_a_cure(tmp_path):
    """A re-run that fails before its first step (the change broke the program) shows no
    symptom, and read as one that 'removed' it; it is untested, saying why."""
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    broken = syn.make_run(syn.error("exception", "ValueError", "a KerasTensor cannot be used"))
    art = syn.CannedArtifact({"current": nan, "current+default_init": broken})
    guess = Finding("initialization", "architecture", False, "weights 100x the default", None,
                    {"category": "gradient_instability"})
    got = confirm(s, art, [guess], Version("current", s.store.path("artifact.py")), 1, 60.0)[0]
    assert not got.confirmed
    assert "the re-run with the change failed" in got.evidence["intervention"]["untested"]
    assert "KerasTensor" in got.evidence["intervention"]["untested"]


def test_after_an_intervention_that_cures_the_symptom_the_rest_are_not_re_run(tmp_path):
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    art = syn.CannedArtifact({"current": nan, "current+default_init": syn.make_run(
        syn.healthy_steps(20))})
    init = Finding("initialization", "architecture", False, "weights 100x the default", None,
                   {"category": "gradient_instability"})
    drop = Finding("dropout_rate", "architecture", True, "dropout 0.9", None,
                   {"category": "gradient_instability"})
    cured, left = confirm(s, art, [init, drop], Version("current", s.store.path("artifact.py")),
                          1, 60.0)
    assert cured.confirmed and cured.evidence["undone"] and cured.evidence["strength"] == 1.0
    assert left.confirmed and "already removed gradient_instability" in \
        left.evidence["intervention"]["untested"]
    assert [c for c in art.calls if "dropout" in c[0]] == []
    other = Finding("dropout_rate", "architecture", True, "dropout 0.9", None,
                    {"category": "loss_not_decreasing"})  # another category: still re-run
    _, tested = confirm(s, art, [init, other], Version("current", s.store.path("artifact.py")),
                        2, 60.0)
    assert "already removed" not in tested.evidence["intervention"].get("untested", "")


def test_a_specific_cause_is_re_run_before_a_lever_whose_cure_cannot_beat_it(tmp_path):
    """Another learning rate "cures" most faults: the specific hypothesis is re-run first, even
    when the lever is ranked (and confirmed by its sweep) before it; once it cured the run, the
    lever is not re-run (a lever settled by its own experiment still is)."""
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    healthy = syn.make_run(syn.healthy_steps(20))
    art = syn.CannedArtifact({"current": nan, "current+lr_scale": healthy,
                              "current+dropout_off": healthy})
    lr = Finding("lr_range", "hyperparameter", True, "lr 10 diverges", None,
                 {"category": "gradient_instability", "lr": 10.0, "safe_lr": 0.01})
    drop = Finding("dropout_rate", "architecture", False, "dropout 0.9", None,
                   {"category": "gradient_instability", "rate": 0.9})
    out = confirm(s, art, [lr, drop], Version("current", s.store.path("artifact.py")), 1, 60.0)
    assert [f.check for f in out] == ["lr_range", "dropout_rate"]  # the order given
    assert [c[0] for c in art.calls if "+" in c[0]] == ["current+dropout_off"] * 2, art.calls
    assert out[1].confirmed and out[1].evidence["intervention"]["symptom_gone"]
    assert "already removed" in out[0].evidence["intervention"]["untested"]
    art.calls.clear()
    swept = Finding("lr_range", "hyperparameter", True, "lr 10 diverges", None,
                    {"category": "gradient_instability", "lr": 10.0, "safe_lr": 0.01,
                     "undone": True})
    confirm(s, art, [swept, drop], Version("current", s.store.path("artifact.py")), 2, 60.0)
    assert [c[0] for c in art.calls if "+" in c[0]] == \
        ["current+dropout_off"] * 2 + ["current+lr_scale"] * 2, art.calls


def test_a_cause_its_probe_undid_is_weakened_not_refuted_by_a_re_run_that_did_not_move(
        tmp_path):
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))
    art = syn.CannedArtifact({"current": nan})
    undone = Finding("dropout_rate", "architecture", True, "dropout 0.9", None,
                     {"category": "gradient_instability", "undone": True, "strength": 0.8})
    [kept] = confirm(s, art, [undone], Version("current", s.store.path("artifact.py")), 1, 60.0)
    assert kept.confirmed and kept.evidence["undone"] is True
    assert kept.evidence["intervention"]["moved"] is False and kept.evidence["strength"] == 0.4


SCALED = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(256, 4) * torch.tensor([1.0, 10.0, 1000.0, 0.01]) + 500.0
    y = X[:, :1] * 0.001
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    seen = []
    model[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    loss_fn = nn.MSELoss()
    targets = []
    loss_fn.register_forward_pre_hook(lambda m, a: targets.append(a[1].detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(0, 256, 32):
        opt.zero_grad()
        loss = loss_fn(model(X[i:i + 32]), y[i:i + 32])
        loss.backward()
        opt.step()
""")


def test_standardized_inputs_reach_the_model_and_nothing_else(tmp_path):
    ns: dict = {}
    art = CellArtifact(ns, SCALED)
    v = Version("reproduced", str(tmp_path / "copy.py"))
    plain = art.run(v, 0, str(tmp_path / "a.jsonl"))
    assert plain.error is None and float(ns["seen"][0].std(0).max()) > 100
    fixed = art.run(v, 0, str(tmp_path / "b.jsonl"),
                     intervention=Intervention("standardize_inputs"))
    assert fixed.error is None
    first = ns["seen"][0]
    assert first.mean(0).abs().max() < 1e-3 and (first.std(0) - 1).abs().max() < 1e-3
    import torch

    assert torch.equal(ns["targets"][0], ns["y"][:32])  # the loss got the raw target
    later = ns["seen"][1]  # the same transform (first-batch stats), not re-standardised
    assert later.mean(0).abs().max() > 1e-3
    art.run(v, 0, str(tmp_path / "c.jsonl"))  # removed after the run
    assert float(ns["seen"][0].std(0).max()) > 100


PLATEAU = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(2048, 8)
    clean = (X[:, 0] + X[:, 1] > 0).long()
    flip = torch.rand(2048) < NOISE
    y = torch.where(flip, 1 - clean, clean)
    net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    FREEZE
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for epoch in range(3):
        for i in range(0, 2048, 64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(X[i:i + 64]), y[i:i + 64])
            loss.backward()
            opt.step()
""")


def test_a_plateau_no_experiment_explains_is_the_tasks_floor(tmp_path):
    """30% of the labels flipped: the loss settles near the prior's, and rightly so. The
    tentative plateau is tested by the probes; none finds a cause, so the run is healthy."""
    script = tmp_path / "noisy.py"
    script.write_text(PLATEAU.replace("NOISE", "0.3").replace("FREEZE", "pass"))
    s = DebugSession.create(str(tmp_path / "root"))
    reproduce(s, ScriptArtifact(str(script)), runs=1, seed=0, probe_budget=30.0)
    cls = s.state.classification
    assert cls.primary == "healthy", (cls, s.state.findings)
    floor = next(e for e in cls.evidence if e.signal == "loss_floor_share")
    assert floor.value >= 0.4 and "floor" in floor.detail
    assert not [f for f in s.state.findings if f.confirmed]
    kinds = [e["kind"] for e in s._data["events"]]
    assert kinds.count("classify") == 2  # the tentative verdict, then the settled one


def test_a_plateau_held_up_by_frozen_layers_stands(tmp_path):
    script = tmp_path / "frozen.py"
    script.write_text(PLATEAU.replace("NOISE", "0.0").replace(
        "FREEZE", "for p in net[:4].parameters(): p.requires_grad_(False)"))
    s = DebugSession.create(str(tmp_path / "root"))
    reproduce(s, ScriptArtifact(str(script)), runs=1, seed=0, probe_budget=30.0)
    assert s.state.classification.primary == "loss_not_decreasing"
    f = next(f for f in s.state.findings if f.confirmed)
    assert (f.check, f.root_cause) == ("frozen_parameters", "architecture"), s.state.findings
    assert "requires_grad_(False)" in script.read_text().splitlines()[f.location["line"] - 1]


LEAK = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    X = torch.randn(600, 6)
    y = (X[:, 0] + X[:, 1] * X[:, 2] > 0).long()
    X[:, 5] = y.float()  # the label left in the features
    Xtr, ytr, Xva, yva = X[:480], y[:480], X[480:], y[480:]
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(8):
        for i in range(0, 480, 32):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(Xtr[i:i + 32]), ytr[i:i + 32])
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(Xva).argmax(1) == yva).float().mean().item()
        print(f"epoch {epoch} val_acc={acc:.4f}")
""")


@pytest.mark.slow
@pytest.mark.parametrize("leak", [True, False])
def test_a_healthy_looking_run_with_the_label_in_its_inputs_is_overfitting(tmp_path, leak):
    """Perfect validation accuracy, every signal healthy: the probe written for healthy runs
    finds the label copied into a feature and Isolate re-classifies the run; without the copy
    the run stays healthy with no finding."""
    script = tmp_path / "leak.py"
    script.write_text(LEAK if leak else LEAK.replace("X[:, 5] = y.float()", "pass"))
    s = DebugSession.create(str(tmp_path / "root"))
    reproduce(s, ScriptArtifact(str(script)), runs=1, seed=0, probe_budget=30.0)
    cls = s.state.classification
    if not leak:
        assert cls.primary == "healthy" and not s.state.findings, (cls, s.state.findings)
        return
    assert cls.primary == "overfitting", (cls, s.state.findings)
    assert cls.evidence[0].signal == "target_copy_confirmed"
    f = next(f for f in s.state.findings if f.confirmed)
    assert (f.check, f.root_cause, f.category) == ("target_copy", "data", "overfitting")
    assert "X[:, 5] = y.float()" in script.read_text().splitlines()[f.location["line"] - 1]
    assert s.state.fix_allowed


KERAS_TAPE = textwrap.dedent("""\
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np
    import tensorflow as tf
    import keras
    keras.utils.set_random_seed(0)
    X = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    y = (X[:, 0] > 0).astype("float32")[:, None]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam(0.01)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for i in range(0, 256, 32):
        train_step(X[i:i + 32], y[i:i + 32])
    print(f"final_lr={float(optimizer.learning_rate.numpy()):.6g}")
""")


def test_lr_scale_reaches_a_keras_custom_loop_once(tmp_path):
    pytest.importorskip("tensorflow")
    script = tmp_path / "tape.py"
    script.write_text(KERAS_TAPE)
    art = ScriptArtifact(str(script))
    v = Version("reproduced", str(script))
    scaled = art.run(v, 0, str(tmp_path / "a.jsonl"),
                     intervention=Intervention("lr_scale", {"factor": 0.1}))
    plain = art.run(v, 0, str(tmp_path / "b.jsonl"))
    lr = {name: run.run.metrics()["final_lr"][-1][2] for name, run in
          (("scaled", scaled), ("plain", plain))}
    assert lr["plain"] == pytest.approx(0.01) and lr["scaled"] == pytest.approx(0.001), lr
    assert len(scaled.run.steps) == len(plain.run.steps) == 8


@pytest.mark.parametrize("built", ["before_the_first_step", "with_a_warmup"])
def test_lr_scale_survives_a_learning_rate_schedule(built):
    """A scheduler recomputes the rate from base_lrs each step: they are scaled too."""
    import torch

    from model_debugger.interventions import installed

    with installed(Intervention("lr_scale", {"factor": 0.1})):
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        if built == "with_a_warmup":
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
        else:
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100)
        rates = []
        for _ in range(6):
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            rates.append(opt.param_groups[0]["lr"])
    want = [0.1 * min(1.0, (s + 1) / 4) for s in range(1, 7)] if built == "with_a_warmup" \
        else [0.1] * 6
    assert rates == pytest.approx(want)
    assert torch.optim.lr_scheduler.LRScheduler.__init__.__module__ == "torch.optim.lr_scheduler"


def test_re_runs_that_cannot_fit_the_budget_are_not_started(tmp_path):
    """The confirmation budget is a hard limit: once a re-run has shown how long it takes, an
    intervention whose re-runs would not finish in what is left stays untested, saying why,
    instead of running past the budget (a GRU's re-runs took 200 s of a 60 s budget)."""
    import time as _time

    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    nan = syn.make_run(syn.steps_events([1.0, 2.0, 5.0, float("nan")] * 5))

    def slow(seed):
        _time.sleep(0.6)
        return nan

    art = syn.CannedArtifact({"current": slow, "current+default_init": slow})
    guess = Finding("initialization", "architecture", False, "weights 100x the default", None,
                    {"category": "gradient_instability"})
    t0 = _time.monotonic()
    got = confirm(s, art, [guess], Version("current", s.store.path("artifact.py")), 1, 1.5)[0]
    assert _time.monotonic() - t0 < 2.5
    assert not got.confirmed
    assert "untested" in got.evidence["intervention"]
    assert ("current+default_init", 0) not in art.calls  # the pair could not fit: not started


def test_a_cure_paid_for_in_validation_loss_does_not_confirm(tmp_path):
    """A flat training loss; re-run at a higher rate the training loss falls (the signal the
    category is judged on) while validation ends worse: the change fits the training rows
    harder, it is no cure. The same fall with validation improving confirms."""
    from model_debugger.phases.confirm import confirm

    s = _at_fix(tmp_path, [])
    flat = syn.make_run(syn.steps_events([0.69] * 40), syn.metric("val_loss", [0.70] * 4))

    def falling(val):
        return syn.make_run(syn.steps_events([0.69 - 0.0125 * i for i in range(40)]),
                            syn.metric("val_loss", [0.70, 0.72, 0.75, val]))

    lever = Finding("lr_range", "hyperparameter", False, "the rate is 100x too low", None,
                    {"category": "loss_not_decreasing", "lr": 1e-4, "safe_lr": 1e-2})
    worse = syn.CannedArtifact({"current": flat, "current+lr_scale": falling(0.80)})
    got = confirm(s, worse, [lever], Version("current", s.store.path("artifact.py")), 1, 60.0)[0]
    assert not got.confirmed
    assert got.evidence["intervention"]["validation_worse"] == {"before": 0.7, "after": 0.8}
    assert "validation loss ended worse" in got.explanation
    better = syn.CannedArtifact({"current": flat, "current+lr_scale": falling(0.40)})
    got = confirm(s, better, [lever], Version("current", s.store.path("artifact.py")), 2, 60.0)[0]
    assert got.confirmed and "validation_worse" not in got.evidence["intervention"]


@pytest.mark.parametrize("onset", [None, 600])
def test_a_symptom_that_builds_late_is_re_run_as_long_as_the_reproduction(tmp_path, onset):
    """The reproduction blew up after 600 of its 1000 steps; 200-step re-runs show nothing.
    Rather than give up ("did not show"), the baseline is re-run once as long as the
    reproduction (it fits the budget), the symptom shows, and the intervention is judged there;
    a budget too small for the longer re-runs leaves the finding untested, saying so. When the
    signals say where it blew up (``loss_blowup_step``), the re-runs go that far and a quarter
    more from the start: no short baseline is paid for first."""
    from model_debugger.phases.confirm import MAX_STEPS, confirm

    s = _at_fix(tmp_path, [])
    s.record_reproduce({"status": "reproduced", "problem": "gradient_instability", "steps": 1000,
                        "seconds": 0.2, "runs": {"total": 1, "reproduced": 1,
                                                 "categories": ["gradient_instability"]}})
    if onset is not None:
        s.record_classification(Classification("gradient_instability", (), (
            Evidence("loss_final", 9.0, ""),)), {"loss_blowup_step": onset})
    healthy = syn.make_run(syn.healthy_steps(40))
    late = syn.make_run(syn.steps_events([1.0 - 0.01 * i for i in range(30)] +
                                         [0.7 * 1.5 ** i for i in range(10)]))

    class Horizon(syn.CannedArtifact):
        def run(self, version, seed, record, *, max_steps=None, intervention=None, **kw):
            self.steps.append(max_steps)
            if intervention is None and (max_steps or 1000) > 600:  # blows up past step 600
                self.runs["current"] = late
            else:
                self.runs["current"] = healthy
            return super().run(version, seed, record, intervention=intervention, **kw)

    art = Horizon({"current": healthy})
    art.steps = []
    guess = Finding("initialization", "architecture", False, "weights 100x the default", None,
                    {"category": "gradient_instability"})
    got = confirm(s, art, [guess], Version("current", s.store.path("artifact.py")), 1, 60.0)[0]
    if onset is not None:
        assert art.steps == [760] * 4, art.steps
        assert got.confirmed and got.evidence["intervention"]["max_steps"] == 760
        return
    assert art.steps == [MAX_STEPS, MAX_STEPS, 1000, 1000, 1000, 1000], art.steps
    assert got.confirmed and got.evidence["intervention"]["max_steps"] == 1000
    art.steps.clear()
    s.record_reproduce({"status": "reproduced", "problem": "gradient_instability", "steps": 1000,
                        "seconds": 30.0, "runs": {"total": 1, "reproduced": 1,
                                                   "categories": ["gradient_instability"]}})
    got = confirm(s, art, [guess], Version("current", s.store.path("artifact.py")), 2, 60.0)[0]
    assert art.steps == [MAX_STEPS, MAX_STEPS]  # 4 full-length re-runs cannot fit: not widened
    assert "did not show in 2 re-runs of 200 steps" in got.evidence["intervention"]["untested"]
