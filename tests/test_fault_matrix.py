"""The fault matrix (benchmarks/fault_matrix): bases, operators, and the runner.

The fast tests never diagnose: every operator applies to at least two bases and yields a
compiling mutant whose recorded line holds the change; the bases compile and import only what
is installed. One slow smoke test runs the runner on three pairs and one healthy base; it checks
the rows, never the accuracy (that is the benchmark's job).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fault_matrix.mutation import CATEGORIES, ROOT_CAUSES, Edit, apply_edits  # noqa: E402
from benchmarks.fault_matrix.operators import OPERATORS, NotApplicable  # noqa: E402

BASES = sorted((ROOT / "benchmarks" / "fault_matrix" / "bases").glob("*.py"))
SOURCES = {p.stem: p.read_text() for p in BASES}
FAMILIES = {"model", "training", "data", "loop", "resources"}


def changed_lines(old: str, new: str) -> set[int]:
    """1-based lines of ``new`` that differ from ``old``; for a pure deletion, the line before it."""
    out: set[int] = set()
    matcher = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            out.update(range(j1 + 1, j2 + 1))
        elif tag == "delete":
            out.add(j1)  # the line just above the removed ones
    return out


def test_at_least_eight_bases_in_different_styles():
    assert len(BASES) >= 8
    # the trainers people drive their loops with are among them
    assert any("pytorch_lightning" in s for s in SOURCES.values())
    assert any("from transformers import" in s and "Trainer(" in s for s in SOURCES.values())
    frameworks = {"keras" if "keras" in s and "torch" not in s else "torch"
                  for s in SOURCES.values()}
    assert frameworks == {"torch", "keras"}
    assert len(set(SOURCES.values())) == len(SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_base_compiles_and_imports_only_installed_modules(name):
    tree = ast.parse(SOURCES[name])
    compile(tree, name, "exec")
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a base is stand-alone"
            modules.add(node.module.split(".")[0])
    assert "model_debugger" not in modules, "bases are plain training programs"
    for mod in modules:
        assert importlib.util.find_spec(mod) is not None, f"{name} imports {mod}"


def test_bases_hold_no_anchor_comments():
    for name, source in SOURCES.items():
        comments = [ln for ln in source.splitlines() if ln.lstrip().startswith("#")]
        assert not comments, f"{name}: {comments}"


def test_at_least_forty_operators_with_the_vocabulary():
    assert len(OPERATORS) >= 40
    for op in OPERATORS.values():
        assert op.category in CATEGORIES, op.id
        assert op.root_cause in ROOT_CAUSES, op.id
        assert op.family in FAMILIES, op.id
    assert {op.family for op in OPERATORS.values()} == FAMILIES


@pytest.mark.parametrize("op_id", sorted(OPERATORS))
def test_operator_mutants_compile_and_record_the_changed_line(op_id):
    op = OPERATORS[op_id]
    applied = []
    for name, source in SOURCES.items():
        if not op.applies(source):
            with pytest.raises(NotApplicable):
                op.apply(source)
            continue
        applied.append(name)
        mutant = op.apply(source)
        assert mutant.source != source
        compile(mutant.source, f"{name}__{op_id}", "exec")
        lines = mutant.source.splitlines()
        assert 1 <= mutant.changed_line <= len(lines)
        assert 1 <= mutant.expected_line <= len(lines)
        changed = changed_lines(source, mutant.source)
        assert mutant.changed_line in changed, (name, mutant.changed_line, sorted(changed))
        assert mutant.operator == op_id and mutant.category == op.category
    assert len(applied) >= 2, f"{op_id} applies only to {applied}"


def test_operators_apply_across_frameworks():
    keras = [s for s in SOURCES.values() if "torch" not in s]
    assert sum(any(op.applies(s) for s in keras) for op in OPERATORS.values()) >= 20


def test_apply_edits_lines_follow_earlier_insertions():
    source = "a = 1\nb = 2\nc = 3\n"
    edits = [Edit(0, 0, "import x\n", aux=True), Edit(6, 11, "b = 20", change=True),
             Edit(12, 12, "z = 0\n", location=True)]
    mutated, changed, expected, last = apply_edits(source, edits)
    assert mutated == "import x\na = 1\nb = 20\nz = 0\nc = 3\n"
    assert (changed, expected, last) == (3, 4, 4)
    block = apply_edits(source, [Edit(6, 6, "for i in x:\n    f(i)\n")])
    assert block[1:] == (2, 2, 3)  # an inserted block: every line of it is the change
    assert apply_edits(source, [Edit(0, 0, "y = 0\n", aux=True), Edit(6, 11, "b = 3")])[1] == 3


@pytest.mark.slow
def test_runner_smoke_writes_one_row_per_job(tmp_path):
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "fault_matrix" / "run.py"),
           "--bases", "torch_loop", "--operators", "lr_too_high,missing_zero_grad,labels_shuffled",
           "--healthy-seeds", "0", "--seed", "0", "--jobs", "1", "--probe-seconds", "10",
           "--intervene-seconds", "0",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(rows) == 4
    assert sorted(r["kind"] for r in rows) == ["fault", "fault", "fault", "healthy"]
    for r in rows:
        for key in ("base", "operator", "seed", "expected", "got", "category_hit",
                    "root_cause_hit", "location_hit", "false_alarm", "bare_seconds",
                    "diagnose_seconds", "commit"):
            assert key in r, key
        assert r["got"] is not None, r.get("diagnose_error")
    assert "Per operator" in proc.stdout and "Totals" in proc.stdout
    # resumable: a second run finds every job done
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 to run" in again.stderr
    assert len(out.read_text().splitlines()) == 4


def test_a_fault_counts_as_harmful_only_when_its_bare_run_shows_it():
    from benchmarks.fault_matrix.run import METRICS, bare_metric, effects, job_key

    assert set(METRICS) == set(SOURCES)  # every base names the metric it prints

    def row(kind, op, tail, category="loss_not_decreasing", rc=0):
        return {"kind": kind, "base": "torch_loop", "operator": op, "seed": 0, "bare_rc": rc,
                "bare_tail": [tail], "expected": {"category": category}}

    healthy = [row("healthy", None, f"epoch 8  loss 0.03  val_loss 0.04  val_acc {v}")
               for v in (0.983, 0.987)]
    assert bare_metric(healthy[0]) == 0.983
    faults = {"same": row("fault", "clip_tiny", "epoch 8  loss 0.1  val_acc 0.975"),
              "worse": row("fault", "lr_too_low", "epoch 8  loss 0.6  val_acc 0.71"),
              "nan": row("fault", "lr_too_high", "epoch 8  loss nan  val_acc nan"),
              "crash": row("fault", "oom_batch", "", rc=1),
              "slow": row("fault", "per_step_stall", "val_acc 0.985", "performance_issue"),
              "unread": row("fault", "clip_tiny", "no metric here")}
    for i, r in enumerate(faults.values()):
        r["seed"] = i  # distinct keys
    got = effects(healthy + list(faults.values()))
    verdict = {name: got[job_key(r)] for name, r in faults.items()}
    assert verdict == {"same": False, "worse": True, "nan": True, "crash": True, "slow": True,
                       "unread": None}


def test_the_symptom_aware_category_accepts_only_a_printed_non_finite_value():
    from benchmarks.fault_matrix.run import symptom_hit

    def row(primary, tail, hit=False, error=None):
        return {"category_hit": hit, "got": {"primary": primary}, "bare_tail": [tail],
                "bare_error": error}

    assert symptom_hit(row("gradient_instability", "epoch 3 loss nan val_acc 0.1"))
    assert symptom_hit(row("gradient_instability", "", error="ValueError: loss is inf"))
    assert not symptom_hit(row("gradient_instability", "epoch 3 loss 0.4 (financial)"))
    assert not symptom_hit(row("loss_not_decreasing", "epoch 3 loss nan"))  # another category
    assert symptom_hit(row("overfitting", "epoch 3 loss 0.4", hit=True))  # strict hit stays


def test_rows_lists_exactly_the_jobs_of_an_earlier_results_file(tmp_path):
    earlier = tmp_path / "earlier.jsonl"
    jobs = [{"kind": "healthy", "base": "keras_fit", "operator": None, "seed": 1},
            {"kind": "fault", "base": "torch_loop", "operator": "lr_too_high", "seed": 0}]
    earlier.write_text("".join(json.dumps({**j, "got": None}) + "\n" for j in jobs))
    cmd = [sys.executable, str(ROOT / "benchmarks" / "fault_matrix" / "run.py"),
           "--rows", str(earlier), "--sample", "84", "--list"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["healthy keras_fit - 1", "fault torch_loop lr_too_high 0",
                                        "2 jobs"]


def test_the_symptom_aware_category_accepts_only_what_the_operator_documents():
    """``few_samples`` lists ``loss_not_decreasing`` (a fixed number of epochs over 24 rows is
    a handful of steps); other categories, and other operators, are not accepted."""
    from benchmarks.fault_matrix.run import symptom_hit

    def row(op, primary):
        return {"category_hit": False, "operator": op, "got": {"primary": primary},
                "bare_tail": ["epoch 3 loss 0.6"], "bare_error": None}

    assert symptom_hit(row("few_samples", "loss_not_decreasing"))
    assert not symptom_hit(row("few_samples", "healthy"))
    assert not symptom_hit(row("lr_too_low", "overfitting"))
    assert all(set(op.also) <= set(CATEGORIES) for op in OPERATORS.values())
