"""The probe layout: probes import no classification code, each owns its suggestion, adding one
is one new file, run_probes returns a ProbeReport, build_context follows a recorded
classification, and signal names are declared once (signals.SIGNALS, defining.py)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import _synthetic as syn
import numpy as np
import pytest

import model_debugger
from model_debugger import defining, probing, signals
from model_debugger.pitfalls import keras_lint, torch_lint
from model_debugger.probes import (
    GENERIC_SUGGESTION,
    PROBES,
    Probe,
    ProbeContext,
    ProbeReport,
    ProbeResult,
    probes_for,
    register,
    run_probes,
)
from model_debugger.probes.lint import RULES as LINT_RULES
from model_debugger.probes.suggestions import suggestion_for as suggest
from model_debugger.probing import build_context
from model_debugger.records import ROOT_CAUSES, Classification, Finding, Run

PACKAGE = Path(model_debugger.__file__).parent


def _imports(path: Path) -> set[str]:
    """Absolute names of the model_debugger modules a file imports (relative ones resolved)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


# -- imports ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((PACKAGE / "probes").glob("*.py")) +
                         sorted((PACKAGE / "trainers").glob("*.py")), ids=lambda p: p.name)
def test_probes_and_trainers_import_no_classification_code(path):
    bad = {m for m in _imports(path) if m == "model_debugger.classify"
           or m.startswith("model_debugger.classify.")}
    assert not bad, f"{path.name} imports {bad}"


def test_the_keras_keeper_imports_neither_probes_nor_trainers():
    got = _imports(PACKAGE / "capture" / "keras_keeper.py")
    assert not {m for m in got if m.startswith(("model_debugger.probes",
                                                "model_debugger.trainers"))}


def test_thresholds_is_a_leaf_shared_by_classify_and_the_probes():
    from model_debugger import classify, thresholds

    assert not {m for m in _imports(PACKAGE / "thresholds.py") if m.startswith("model_debugger")}
    assert classify.VAL_RISE is thresholds.VAL_RISE and classify.GRAD_GROWTH == 1e3
    assert "model_debugger.thresholds.VAL_RISE" in _imports(PACKAGE / "probes" /
                                                            "data_volume.py")


# -- suggestions ----------------------------------------------------------------------------------
def _finding(check, root_cause="data", **evidence) -> Finding:
    return Finding(check, root_cause, True, f"{check} explanation", None, evidence)


@pytest.mark.parametrize("pid", sorted(PROBES))
def test_every_probe_owns_a_non_empty_suggestion(pid):
    f = _finding(pid)
    own = PROBES[pid]().suggestion(f)
    assert isinstance(own, str) and own.strip()
    assert suggest(f) == own  # suggest() is a lookup through the registry


def _emitted_rules(path: Path) -> set[str]:
    """Rule ids a lint module emits: ``("rule", "root cause", ...)`` tuples, ``hit("rule", ...)``."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple) and len(node.elts) >= 3 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts[:2]) \
                and node.elts[1].value in ROOT_CAUSES:
            out.add(node.elts[0].value)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "hit" and \
                node.args and isinstance(node.args[0], ast.Constant):
            out.add(node.args[0].value)
    return out


def test_every_rule_the_lint_packs_emit_is_declared():
    torch_emitted = set().union(*(_emitted_rules(p) for p in (PACKAGE / "pitfalls").glob(
        "_torch_*.py")), _emitted_rules(PACKAGE / "pitfalls" / "torch_lint.py"))
    assert torch_emitted == set(torch_lint.RULES)
    assert _emitted_rules(PACKAGE / "pitfalls" / "keras_lint.py") == set(keras_lint.RULES)


@pytest.mark.parametrize("rule", sorted(set(torch_lint.RULES) | set(keras_lint.RULES)))
def test_every_lint_rule_has_its_own_suggestion(rule):
    # a finding whose check is the rule id: its probe words it, or the lint rule entry does
    by_id = suggest(_finding(rule))
    assert by_id.strip() and by_id != GENERIC_SUGGESTION
    assert rule in PROBES or rule in LINT_RULES
    if rule in LINT_RULES:  # reported by the lint probe, which cites the rule in its evidence
        assert suggest(_finding("lint", rule=rule)) == LINT_RULES[rule].suggestion


def test_a_lint_finding_of_an_unknown_rule_gets_the_generic_suggestion():
    assert suggest(_finding("lint", rule="no_such_rule")) == GENERIC_SUGGESTION
    assert suggest(_finding("no_such_check")) == GENERIC_SUGGESTION


@pytest.mark.parametrize("finding, text", [
    (_finding("lr_range", "hyperparameter", safe_lr=0.0123, lr=1.0),
     "Set the learning rate to about 0.0123 (now 1.0), the rate the sweep from the initial "
     "weights found safe."),
    (_finding("lr_range", "hyperparameter"), GENERIC_SUGGESTION),
    (_finding("batch_memory", "hyperparameter", largest_batch_that_fits=17),
     "Lower the batch size to at most 17 (or use gradient accumulation to keep the effective "
     "batch)."),
    (_finding("gradient_flow", "architecture", vanishing_layers=["0", "1", "2", "3"]),
     "Use an activation and initialisation that keep gradients alive in 0, 1, 2 (ReLU/GELU with "
     "He init, residual connections or normalisation layers)."),
    (_finding("gradient_flow", "hyperparameter"),
     "Lower the learning rate (see lr_range's safe rate) so the values that overflow stop "
     "growing; keep the model as it is."),
    (_finding("gradient_flow", "architecture"),
     "Guard the operation that produces the first non-finite value (e.g. clamp before log, add "
     "an epsilon), or lower the learning rate if the values grow first."),
    (_finding("dataloader_throughput", num_workers=0),
     "Load batches in parallel: DataLoader(num_workers=N) with N up to the CPU count, or "
     "vectorise the per-sample work."),
    (_finding("dataloader_throughput", num_workers=4),
     "Move the expensive work out of the per-sample path (vectorised collate, precomputed "
     "tensors) or load in parallel with DataLoader(num_workers=N, persistent_workers=True)."),
    (_finding("overfit_small_batch", "architecture"), GENERIC_SUGGESTION),
])
def test_suggestions_worded_from_the_evidence_keep_their_text(finding, text):
    assert suggest(finding) == text


# -- adding a probe is one new file ------------------------------------------------------------
class _Planted(Probe):
    """A probe as a new module would define it: id, categories, fix, run."""

    id = "zz_planted"
    categories = ("loss_not_decreasing",)
    fix = "Plant a fix where the planted probe measured."

    def run(self, ctx: ProbeContext):
        return ProbeResult(findings=(self.finding("data", True, "planted cause", None,
                                                  strength=0.9),),
                           seed_noise={"cv": 0.01})


@pytest.fixture
def planted():
    register(_Planted)
    try:
        yield _Planted.id
    finally:
        PROBES.pop(_Planted.id, None)


def _plateau() -> Run:
    return syn.make_run(syn.steps_events(np.full(40, 0.7), gn=np.ones(40)))


def test_a_registered_probe_runs_reports_and_suggests_with_no_other_edit(planted, tmp_path):
    ctx = build_context(_plateau(), sources={})
    assert ctx.classification.primary == "loss_not_decreasing"
    assert planted in probes_for("loss_not_decreasing")
    report = run_probes(ctx)  # the default selection follows the category
    [f] = [f for f in report.findings if f.check == planted]
    assert f.confirmed and f.category == "loss_not_decreasing"
    assert planted in report.probe_seconds
    assert report.seed_noise == {"cv": 0.01}  # a shared quantity, through its declared field
    assert suggest(f) == _Planted.fix
    # the findings file keeps it (no whitelist of probe ids or keys)
    path = str(tmp_path / "findings.json")
    probing.write_findings(path, report)
    back = probing.read_report(path)
    assert back == report and planted in back.probe_seconds and back.seed_noise == {"cv": 0.01}


def test_every_probe_module_is_discovered_and_registers_its_probe():
    import model_debugger.probes as pkg

    modules = {p.stem for p in (PACKAGE / "probes").glob("*.py")
               if not p.stem.startswith("_") and p.stem not in pkg.FRAMEWORK_MODULES}
    owners = {cls.__module__.rsplit(".", 1)[-1] for cls in PROBES.values()
              if cls.__module__.startswith("model_debugger.probes.")}
    assert owners == modules  # no list of probe modules to edit: each file registers itself
    order = [cls.__module__ for cls in PROBES.values()
             if cls.__module__.startswith("model_debugger.probes.")]
    assert order == sorted(order)  # registered (and so run) in module name order


def test_the_cheaper_probes_run_first_within_the_suggested_and_the_rest(planted):
    """One probe that trains many copies of a slow model must not spend the budget before the
    quick ones look: the default order is (suggested first, then cheaper first), stable."""
    ctx = build_context(_plateau(), sources={})
    seen: list[str] = []
    run_probes(ctx, progress=lambda pid, n, total: seen.append(pid))
    default = [p for cat in (ctx.classification.primary, *ctx.classification.secondary)
               for p in probes_for(cat)]
    default = list(dict.fromkeys(default))
    assert set(seen) <= set(default) and planted in seen
    costs = [PROBES[p].cost for p in seen]
    assert costs == sorted(costs), list(zip(seen, costs))  # nothing suggested on this run
    assert {PROBES[p].cost for p in default} != {0}  # the ordering had something to order
    _Planted.cost = 99
    try:
        seen.clear()
        run_probes(ctx, progress=lambda pid, n, total: seen.append(pid))
        assert seen[-1] == planted  # the costliest last, although registered among the rest
        _Planted.suggested_by = ("loss_relative_drop",)  # cited by this plateau
        seen.clear()
        run_probes(ctx, progress=lambda pid, n, total: seen.append(pid))
        assert seen[0] == planted  # suggested by the evidence: first, whatever its cost
    finally:
        _Planted.cost, _Planted.suggested_by = 0, ()


def test_unregistered_afterwards():
    assert _Planted.id not in PROBES


# -- ProbeReport --------------------------------------------------------------------------------
def _report() -> ProbeReport:
    return ProbeReport(
        findings=(Finding("lr_range", "hyperparameter", True, "too high", {"file": "t.py",
                                                                          "line": 3},
                          {"lr": 3.0, "safe_lr": 0.01, "category": "gradient_instability"}),
                  Finding("lint", "training_loop", False, "hint", None,
                          {"rule": "eval_without_no_grad", "strength": 0.3})),
        probe_seconds={"lr_range": 1.25, "lint": 0.01},
        seed_noise={"mean": 0.5, "std": 0.01, "cv": 0.02, "finals": [0.49, 0.5, 0.51]},
        lr_range={"best_lr": 0.1, "diverge_lr": None, "safe_lr": 0.033})


def test_probe_report_json_round_trip():
    report = _report()
    data = json.loads(json.dumps(report.to_json()))
    assert set(data) == {"findings", "probe_seconds", "seed_noise", "lr_range",
                         "learnable"}
    assert ProbeReport.from_json(data) == report
    assert ProbeReport.from_json(ProbeReport().to_json()) == ProbeReport()
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.seed_noise = None


def test_findings_file_round_trip(tmp_path):
    report, path = _report(), str(tmp_path / "findings.json")
    probing.write_findings(path, report)
    assert probing.read_report(path) == report
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == json.loads(json.dumps(report.to_json()))  # every field, as is
    # missing or broken: None, never an exception
    assert probing.read_report(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_text('{"findings": [{"check": ""}]}', encoding="utf-8")
    assert probing.read_report(str(tmp_path / "bad.json")) is None


# -- build_context follows the recorded classification ------------------------------------------
def test_build_context_uses_the_recorded_classification():
    healthy = syn.make_run(syn.healthy_steps(100))
    ctx = build_context(healthy, sources={})
    assert ctx.classification.primary == "healthy"
    alone = probing.probe(ctx)  # nothing to isolate in this run on its own: only the probes
    assert alone.findings == ()  # for healthy runs look (lint: no code, no pitfall)
    assert set(alone.probe_seconds) == {"lint"}
    recorded = Classification("loss_not_decreasing")
    ctx = build_context(healthy, sources={}, classification=recorded)
    assert ctx.classification is recorded
    report = probing.probe(ctx)
    ran = set(report.probe_seconds)
    expected = {p for p in probes_for("loss_not_decreasing") if PROBES[p]().applies(ctx)}
    assert ran == expected and {"gradient_flow", "detached_output"} <= ran
    assert all(f.category == "loss_not_decreasing" for f in report.findings)
    # the session's JSON form too
    ctx = build_context(healthy, sources={}, classification=recorded.to_json())
    assert ctx.classification == recorded


# -- signal names declared once -----------------------------------------------------------------
def _runs() -> list[Run]:
    n = 120
    mgn = [{"0": 1e-5, "1": 0.1, "2": 1.0}] * n
    val = syn.metric("val_loss", [1.0, 0.6, 0.7, 0.8, 0.9])
    accs = syn.metric("val_acc", [50, 60, 70, 72, 75]) + syn.metric("train_acc", [0.5, 0.9]) + \
        syn.metric("val_f1", [0.1, 0.2, 0.3]) + syn.metric("train_f1", [0.2, 0.4])
    ep = np.repeat(np.arange(5), n // 5)
    rss = np.linspace(100, 400, n) * syn.MB
    return [
        syn.make_run(syn.healthy_steps(n)),
        syn.make_run(syn.steps_events(syn.decay(n), ep=ep, gn=np.geomspace(1, 1e4, n), mgn=mgn,
                                      dt=np.full(n, 0.05), dw=np.full(n, 0.04), rss=rss,
                                      cuda=np.linspace(1, 300, n) * syn.MB,
                                      gpu_util=np.full(n, 20.0), ur=np.full(n, 1e-3)),
                     val, accs, syn.targets_counts([90, 10])),
        syn.make_run(syn.healthy_steps(n), {**syn.nonfinite(60, "loss"), "in_weights": True},
                     syn.error(step=80), syn.targets_moments(0.5, 0.1)),
        syn.make_run(),
    ]


def _captured(tmp_path) -> Run:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 2, (64,))
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    path = str(tmp_path / "record.jsonl")
    with model_debugger.capture(path):
        for _ in range(3):
            for i in range(0, 64, 16):
                opt.zero_grad()
                F.cross_entropy(net(x[i:i + 16]), y[i:i + 16]).backward()
                opt.step()
    return Run.load(path)


def test_compute_produces_only_declared_signals(tmp_path):
    produced = set()
    for run in [*_runs(), _captured(tmp_path)]:
        sig = signals.compute(run)
        undeclared = set(sig) - set(signals.SIGNALS)
        assert not undeclared, undeclared
        produced |= set(sig)
        assert set(signals.outcome_signals(sig)) == set(signals.OUTCOME_SIGNALS)
    # the synthetic runs reach most branches of compute()
    assert {"first_to_last_grad_ratio", "rss_last_epoch_mb_per_step", "cuda_growth_mb",
            "gpu_util_median", "data_wait_fraction", "val_loss_rise", "gap_final",
            "val_acc_final", "train_f1_final", "last_finite_grad_step", "error",
            "update_ratio_median"} <= produced
    assert all(isinstance(m, str) and m for m in signals.SIGNALS.values())


def test_every_defining_signal_is_declared():
    declared = set(signals.SIGNALS) | set(signals.OUTCOME_SIGNALS)
    names = set(defining.SIGNALS) | {s.name for t in defining.CATEGORIES.values()
                                     for s in t.signals}
    assert names <= declared, names - declared
    # every cited-as name is a signal too: classifications cite signals
    cited = {c for s in defining.SIGNALS.values() for c in s.cited_as}
    assert cited <= declared, cited - declared
    from model_debugger.records import CATEGORIES

    assert set(defining.CATEGORIES) == set(CATEGORIES)


def test_the_defining_declaration_keeps_what_verify_used():
    """The numbers Verify judged by before they were declared in defining.py."""
    assert defining.MIN_EFFECT == {
        "loss_relative_drop": 0.02, "val_loss_rise": 0.02, "gap_final": 0.02,
        "finite_fraction": 0.25, "completed": 0.5, "data_wait_fraction": 0.05,
        "rss_growth_mb": 20.0, "cuda_growth_mb": 20.0, "gpu_util_median": 10.0,
        "val_f1_final": 0.02, "train_f1_final": 0.02, "val_acc_final": 0.01,
        "train_acc_final": 0.01, "grad_norm_growth": 0.5, "first_to_last_grad_ratio": 0.5,
        # declared since: the loop's own share of a step, past steps' graphs kept alive
        "step_overhead_share": 0.05, "graphs_kept_share": 0.2, "loss_peak_ratio": 0.3,
        "loss_broadcast_factor": 0.5, "output_range_unreachable": 0.05,  # ... and the loss's
        # broadcast pairing, and the targets a bounded output cannot reach; across ranks: a
        # hang, a straggler's share of each step, the spread of the replicas' checksums
        "rank_hang": 0.5, "rank_straggler_share": 0.1, "rank_desync": 1e-5,
        "rank_updates_apart": 0.05,  # ... and a rank that steps less often than another
        "grad_not_reset_share": 0.2,  # ... and gradients never reset between steps
        "error_share": 0.05,  # ... and a regression error against a constant prediction's
        "step_traced_share": 0.2,  # ... and a compiled step traced again
        "loss_unpaired": 0.5,  # ... and a hand-written loss that pairs no row
        "loss_start_excess": 0.3}  # ... and an untrained model far worse than knowing nothing
    assert defining.LOG_SIGNALS == ("loss_peak_ratio", "loss_start_excess", "grad_norm_growth",
                                    "first_to_last_grad_ratio", "loss_broadcast_factor")
    assert defining.DEFINING["gradient_instability"] == (
        ("finite_fraction", 1), ("loss_peak_ratio", -1), ("loss_start_excess", -1),
        ("grad_not_reset_share", -1),
        ("grad_norm_growth", -1), ("first_to_last_grad_ratio", 1), ("loss_relative_drop", 1))
    assert defining.defining_signal("gradient_instability",
                                    {"finite_fraction": 1.0, "grad_norm_growth": 5.0}) == (
        "grad_norm_growth", -1)
    assert defining.defining_signal("memory_issue", {"completed": 1.0, "rss_growth_mb": 3},
                                    ["error"]) == ("completed", 1)
    assert defining.expected_effect({"primary": "overfitting", "evidence": [
        {"signal": "val_loss_rise", "value": 0.3}]}) == (
        "the validation loss should stop rising: val_loss_rise below 0.10 (now val_loss_rise=0.3)")
    assert defining.expected_effect(None) == \
        "the defining signal should move out of the problem range"


def test_trainers_follow_one_protocol():
    from model_debugger.trainers import Trainer, trainer_for
    from model_debugger.trainers.torch import TorchTrainer

    assert trainer_for(None) is None
    import torch

    net = torch.nn.Linear(3, 2)
    tr = TorchTrainer(net, {k: v.clone() for k, v in net.state_dict().items()},
                      {"cls": torch.optim.SGD, "hyper": {"lr": 0.1}}, {"name": "cross_entropy"},
                      [((torch.randn(80, 3),), torch.randint(0, 2, (80,)))])
    assert isinstance(tr, Trainer) and tr.framework == "torch"
    lrs, losses = tr.sweep(1e-5, 10.0, 60)
    assert len(lrs) == len(losses) >= 10
    assert tr.param_bytes() == 4 * 8 and tr.per_sample_bytes((torch.randn(4, 3),)) > 0
    assert sorted(tr.randperm(5, 1).tolist()) == list(range(5))


def test_an_early_blow_up_is_judged_by_how_far_the_loss_rose():
    """Cited as loss_first / loss_initial / loss_max: the peak ratio, not the relative drop
    (a loss that blew up and came down part way 'drops' a lot)."""
    sig = {"loss_peak_ratio": 19.5, "loss_relative_drop": 0.85, "grad_norm_growth": 3.0}
    got = defining.defining_signal("gradient_instability", sig,
                                   ["loss_first", "loss_initial", "loss_max"])
    assert got == ("loss_peak_ratio", -1)
    # not chosen for a run that never rose far above its start
    assert defining.defining_signal("gradient_instability", {"loss_peak_ratio": 1.1,
                                                            "loss_relative_drop": 0.2}) == \
        ("loss_relative_drop", 1)


def test_an_untrained_model_far_worse_than_knowing_nothing_is_judged_by_that_excess():
    """Cited as loss_first / loss_uninformed (inputs on a huge scale: the first loss 150x that
    of uniform scores): the excess of the first loss, not the gradient norm's growth, which a
    blow-up at the very start does not show (standardised inputs removed the symptom from both
    re-runs of a Keras model, and grad_norm_growth "did not move")."""
    sig = {"loss_start_excess": 150.0, "loss_peak_ratio": 1.0, "grad_norm_growth": 0.2,
           "loss_relative_drop": 0.99}
    got = defining.defining_signal("gradient_instability", sig,
                                   ["loss_first", "loss_uninformed", "grad_norm_initial"])
    assert got == ("loss_start_excess", -1)
    assert defining.defining_signal("gradient_instability", {"loss_start_excess": 1.2,
                                                            "grad_norm_growth": 2.0}) == \
        ("grad_norm_growth", -1)
