"""The fault matrix runner: diagnose (base x operator) mutants and the healthy bases, score them.

Run from the repository root::

    python benchmarks/fault_matrix/run.py [--sample N] [--seed S] [--bases a,b]
        [--operators x,y] [--healthy-seeds 0,1,2] [--jobs 1] [--out results.jsonl]
    python benchmarks/fault_matrix/run.py --report --out results.jsonl   # tables only
    python benchmarks/fault_matrix/run.py --list                          # the pairs

For each (base, operator) pair where the operator applies, and for each healthy base under each
of ``--healthy-seeds`` (false-alarm checks), the program is written to a temporary folder, run
bare (``python prog.py``, timed) and diagnosed (``model_debugger.diagnose.diagnose_script(...,
seed=S, probe_seconds=30, intervene_seconds=60)``, the product's defaults, in a child process,
timed). A row is appended to ``--out`` per job
(JSON lines; a rerun skips the jobs already there, so the runner resumes). Scores:

- category hit: ``classification.primary`` equals the operator's expected category;
- root cause hit: the first *confirmed* finding's ``root_cause`` equals the expected kind (no
  confirmed finding is a miss, whatever the first unconfirmed one says);
- location hit: some confirmed finding is located in the mutant file within one line of the
  expected line (the line that makes the faulty object);
- false alarm: a healthy base not classified ``healthy``.

Each row also keeps the last two lines the bare run printed (``bare_tail``: the base's own
validation metric), so a reader can tell a missed fault from a fault that did little harm.

The tables (per operator, per base, per expected category with the confusion of categories,
totals, and diagnosis time against the bare run) are printed at the end. Nothing here tunes the
product: the matrix measures it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BASES = HERE / "bases"
sys.path.insert(0, str(ROOT))

from benchmarks.fault_matrix.operators import OPERATORS  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")

DIAGNOSE = """
import json, sys
from model_debugger.diagnose import diagnose_script
script, seed, root, out, probe, intervene = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
    sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
with open(out + ".stdout", "w") as sink:
    session = diagnose_script(script, seed=seed, root=root, stdout=sink, probe_seconds=probe,
                              intervene_seconds=intervene)
with open(out, "w") as fh:
    json.dump(session.report(), fh, default=str)
"""


# -- the matrix --------------------------------------------------------------------------------
def bases(names: list[str] | None = None) -> dict[str, Path]:
    """Base programs by name (``bases/<name>.py``)."""
    found = {p.stem: p for p in sorted(BASES.glob("*.py"))}
    if names:
        missing = set(names) - set(found)
        if missing:
            raise SystemExit(f"unknown bases: {sorted(missing)}")
        found = {n: found[n] for n in names}
    return found


def pairs(base_paths: dict[str, Path], operators: list[str] | None = None) -> list[tuple[str, str]]:
    """Every (base, operator) pair where the operator applies."""
    ops = operators or list(OPERATORS)
    unknown = set(ops) - set(OPERATORS)
    if unknown:
        raise SystemExit(f"unknown operators: {sorted(unknown)}")
    out = []
    for name, path in base_paths.items():
        source = path.read_text()
        out.extend((name, op) for op in ops if OPERATORS[op].applies(source))
    return out


def stratified(all_pairs: list[tuple[str, str]], n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` pairs: every operator once (when ``n`` allows), then round robin over operators,
    each time on the base that has been drawn least so far (ties broken at random)."""
    rng = random.Random(seed)
    by_op: dict[str, list[str]] = defaultdict(list)
    for base, op in all_pairs:
        by_op[op].append(base)
    for op_bases in by_op.values():
        rng.shuffle(op_bases)
    ops = list(by_op)
    rng.shuffle(ops)
    base_count: Counter = Counter()
    chosen: list[tuple[str, str]] = []
    while len(chosen) < min(n, len(all_pairs)):
        progressed = False
        for op in ops:
            if len(chosen) >= n or not by_op[op]:
                continue
            base = min(by_op[op], key=lambda b: base_count[b])
            by_op[op].remove(base)
            base_count[base] += 1
            chosen.append((base, op))
            progressed = True
        if not progressed:
            break
    return chosen


def jobs_for(args) -> list[dict]:
    """The jobs to run: the healthy checks, then the fault pairs.

    With ``args.rows`` (an earlier results file), exactly that file's jobs, in its order:
    a before/after comparison on the same rows, whatever operators were added since.
    """
    if getattr(args, "rows", None) is not None:
        if not args.rows.exists():
            raise SystemExit(f"--rows {args.rows}: no such file")
        keys = ("kind", "base", "operator", "seed")
        rows = [r for r in read_rows(args.rows) if all(k in r for k in keys) and
                (r["operator"] is None or r["operator"] in OPERATORS)]
        return [{k: r[k] for k in keys} for r in rows]
    base_paths = bases(args.bases)
    ops = args.operators
    all_pairs = pairs(base_paths, ops)
    chosen = stratified(all_pairs, args.sample, args.seed) if args.sample else all_pairs
    jobs = [{"kind": "healthy", "base": name, "operator": None, "seed": s}
            for name in base_paths for s in args.healthy_seeds]
    return jobs + [{"kind": "fault", "base": b, "operator": op, "seed": args.seed}
                   for b, op in chosen]


def job_key(row: dict) -> tuple:
    return row["kind"], row["base"], row["operator"], row["seed"]


# -- one job -----------------------------------------------------------------------------------
def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_job(job: dict, probe_seconds: float, bare_timeout: float, diagnose_timeout: float,
            intervene_seconds: float = 0.0) -> dict:
    """Write the program, run it bare, diagnose it; return the scored row."""
    source = (BASES / f"{job['base']}.py").read_text()
    row = dict(job)
    if job["kind"] == "fault":
        mutant = OPERATORS[job["operator"]].apply(source)
        source = mutant.source
        row["expected"] = {"category": mutant.category, "root_cause": mutant.root_cause,
                           "line": mutant.expected_line, "last_line": mutant.expected_last or
                           mutant.expected_line, "changed_line": mutant.changed_line,
                           "family": mutant.family}
    else:
        row["expected"] = {"category": "healthy", "root_cause": None, "line": None,
                           "changed_line": None, "family": None}
    with tempfile.TemporaryDirectory(prefix="fault_matrix_") as tmp:
        name = f"{job['base']}__{job['operator'] or 'healthy'}.py"
        script = Path(tmp) / name
        script.write_text(source)
        t0 = time.perf_counter()
        try:
            bare = subprocess.run([sys.executable, str(script)], cwd=tmp, env=ENV,
                                  capture_output=True, text=True, timeout=bare_timeout)
            row["bare_rc"] = bare.returncode
            row["bare_tail"] = bare.stdout.strip().splitlines()[-2:]
            row["bare_error"] = (bare.stderr.strip().splitlines() or [""])[-1][-300:] \
                if bare.returncode else None
        except subprocess.TimeoutExpired:
            row["bare_rc"], row["bare_error"] = None, f"timeout after {bare_timeout:.0f}s"
            row["bare_tail"] = []
        row["bare_seconds"] = round(time.perf_counter() - t0, 2)
        report_path = Path(tmp) / "report.json"
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-c", DIAGNOSE, str(script), str(job["seed"]),
                 str(Path(tmp) / "sessions"), str(report_path), str(probe_seconds),
                 str(intervene_seconds)],
                cwd=tmp, env=ENV, capture_output=True, text=True, timeout=diagnose_timeout)
            row["diagnose_rc"] = proc.returncode
            row["diagnose_error"] = (proc.stderr.strip().splitlines() or [""])[-1][-300:] \
                if proc.returncode else None
        except subprocess.TimeoutExpired:
            row["diagnose_rc"] = None
            row["diagnose_error"] = f"timeout after {diagnose_timeout:.0f}s"
        row["diagnose_seconds"] = round(time.perf_counter() - t0, 2)
        report = json.loads(report_path.read_text()) if report_path.exists() else None
        row.update(score(report, row["expected"], str(script)))
    row["intervene_seconds"] = intervene_seconds
    row["commit"] = _git_commit()
    row["time"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return row


def _same_file(a: str | None, b: str) -> bool:
    if not a:
        return False
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def score(report: dict | None, expected: dict, script: str) -> dict:
    """The hits of one report against what the operator expects."""
    if report is None:
        return {"got": None, "category_hit": False, "root_cause_hit": False,
                "location_hit": False, "false_alarm": expected["category"] == "healthy"}
    cls = report.get("classification") or {}
    primary = cls.get("primary")
    findings = report.get("findings") or []
    confirmed = [f for f in findings if f.get("confirmed")]
    first = confirmed[0] if confirmed else None

    def brief(f: dict) -> dict:
        loc = f.get("location") or {}
        return {"check": f.get("check"), "root_cause": f.get("root_cause"),
                "confirmed": bool(f.get("confirmed")),
                "file": os.path.basename(loc.get("file") or ""), "line": loc.get("line")}

    got = {"primary": primary, "secondary": cls.get("secondary") or [],
           "first_confirmed": brief(first) if first else None,
           "findings": [brief(f) for f in findings[:6]],
           "reproduce": (report.get("reproduce") or {}).get("status")}
    if expected["category"] == "healthy":
        return {"got": got, "category_hit": primary == "healthy", "root_cause_hit": None,
                "location_hit": None, "false_alarm": primary != "healthy"}
    line, last = expected["line"], expected.get("last_line") or expected["line"]
    located = any(_same_file((f.get("location") or {}).get("file"), script)
                  and isinstance((f.get("location") or {}).get("line"), int)
                  and line - 1 <= f["location"]["line"] <= last + 1 for f in confirmed)
    return {"got": got, "category_hit": primary == expected["category"],
            "root_cause_hit": bool(first and first.get("root_cause") == expected["root_cause"]),
            "location_hit": located, "false_alarm": None}


# -- did the fault do anything? ----------------------------------------------------------------
# Each base's own quality metric, as its last lines print it, and which way is better.
METRICS = {
    "config_regression": ("val_rmse", "lower"), "dataset_transform": ("val accuracy", "higher"),
    "digits_cnn": ("test acc", "higher"), "hf_trainer": ("eval_loss", "lower"),
    "keras_fit": ("final val_accuracy", "higher"), "keras_tape": ("val_acc", "higher"),
    "keras_subclass_step": ("val_mse", "lower"),
    "lightning_module": ("val_acc", "higher"), "lstm_sequence": ("test_loss", "lower"),
    "torch_loop": ("val_acc", "higher"), "transformer_warmup": ("val_acc", "higher"),
    "torch_packed_text": ("val_acc", "higher"), "keras_text": ("val_accuracy", "higher"),
    "torch_text_transformer": ("val_acc", "higher"),
}
SCORE_TOLERANCE = 0.02  # a score (accuracy) this much below the worst healthy run: harm
LOSS_TOLERANCE = 1.25   # a loss this many times the worst healthy run's: harm
ALWAYS = ("memory_issue", "performance_issue")  # their cost is time or memory, by construction
SCORE_LIES = ("target_leak_feature",)  # the fault inflates the very metric: harm by design


def bare_metric(row: dict) -> float | None:
    """The base's metric from the last lines the bare run printed (None when absent)."""
    import re

    name, _ = METRICS.get(row["base"], (None, None))
    if name is None:
        return None
    number = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[-+]?\d+)?|nan|inf"
    pattern = re.compile(re.escape(name) + r"['\"]?\s*[:=]?\s*(" + number + ")", re.IGNORECASE)
    for line in reversed(row.get("bare_tail") or []):
        m = pattern.search(line)
        if m:
            try:
                return float(m.group(1))
            except ValueError:
                continue
    return None


def effects(rows: list[dict]) -> dict[tuple, bool | None]:
    """Per fault row: whether the fault measurably harmed its bare run (None: cannot tell).

    A mutant that changes nothing a user could see (a clip that Adam's scale invariance undoes,
    a sum reduction under Adam) has no symptom to diagnose, so "healthy" is the right answer
    for it; the tables report the faults with an effect beside all of them. Harm: the bare run
    failed or printed a non-finite metric; its metric is worse than the worst healthy run of
    the base by :data:`SCORE_TOLERANCE` (scores) or :data:`LOSS_TOLERANCE` (losses), or better
    than the best by as much (labels made trivial in both splits); memory and performance faults
    (a bare run's time on a shared machine is too noisy to judge) and faults that inflate the
    metric count always.
    """
    healthy: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "healthy" and r.get("bare_rc") == 0:
            healthy[r["base"]].append(r)
    out: dict[tuple, bool | None] = {}
    for r in rows:
        if r["kind"] != "fault":
            continue
        key, cat = job_key(r), r["expected"]["category"]
        if "bare_rc" not in r or r["bare_rc"] is None:  # not run, or timed out: cannot tell
            out[key] = None
            continue
        if r["bare_rc"] != 0 or cat in ALWAYS or r["operator"] in SCORE_LIES:
            out[key] = True
            continue
        base = healthy.get(r["base"]) or []
        value = bare_metric(r)
        ref = [v for v in (bare_metric(h) for h in base) if v is not None]
        if value is None or not ref:
            out[key] = None
        elif value != value or abs(value) == float("inf"):
            out[key] = True
        elif METRICS[r["base"]][1] == "higher":
            out[key] = not min(ref) - SCORE_TOLERANCE <= value <= max(ref) + SCORE_TOLERANCE
        else:
            out[key] = not min(ref) / LOSS_TOLERANCE <= value <= LOSS_TOLERANCE * max(ref)
    return out


def symptom_hit(row: dict) -> bool:
    """The category hit, also counting the symptom the bare run itself printed.

    An operator's category is the taxonomy's usual reading of the fault; on a given program the
    same fault may show another symptom. Only the unambiguous one is accepted here: a bare run
    that printed a non-finite number (or failed on one) shows ``gradient_instability``,
    whatever the operator expected; so does a category the operator lists in ``also`` with
    its reason (too little data trained for a fixed number of epochs: a handful of steps, a
    loss that hardly falls). The strict hit is always reported beside this one.
    """
    import re

    if row["category_hit"]:
        return True
    primary = (row.get("got") or {}).get("primary")
    op = OPERATORS.get(row.get("operator") or "")
    if op is not None and primary in op.also:  # a symptom the operator documents
        return True
    if primary != "gradient_instability":
        return False
    printed = " ".join([*(row.get("bare_tail") or []), row.get("bare_error") or ""])
    return re.search(r"(?<![a-z])(nan|inf|infinity)(?![a-z])", printed, re.IGNORECASE) is not None


# -- tables ------------------------------------------------------------------------------------
def _pct(hits: int, n: int) -> str:
    return f"{hits}/{n} ({100 * hits / n:.0f}%)" if n else "-"


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = "| " + " | ".join(f"{{:{w}}}" for w in widths) + " |"
    lines = [f"### {title}", "", fmt.format(*header),
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [fmt.format(*map(str, r)) for r in rows]
    return "\n".join(lines) + "\n"


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _score_rows(rows: list[dict], key) -> list[list[str]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    out = []
    for name in sorted(groups):
        g = groups[name]
        faults = [r for r in g if r["kind"] == "fault"]
        healthy = [r for r in g if r["kind"] == "healthy"]
        out.append([name, len(faults),
                    _pct(sum(r["category_hit"] for r in faults), len(faults)),
                    _pct(sum(r["root_cause_hit"] for r in faults), len(faults)),
                    _pct(sum(r["location_hit"] for r in faults), len(faults)),
                    _pct(sum(r["false_alarm"] for r in healthy), len(healthy))
                    if healthy else "-"])
    return out


def tables(rows: list[dict]) -> str:
    """Every table, as Markdown."""
    header = ["", "faults", "category", "root cause", "location", "false alarms"]
    faults = [r for r in rows if r["kind"] == "fault"]
    healthy = [r for r in rows if r["kind"] == "healthy"]
    parts = [_table("Per operator", ["operator"] + header[1:],
                    _score_rows(faults, lambda r: r["operator"])),
             _table("Per base", ["base"] + header[1:], _score_rows(rows, lambda r: r["base"])),
             _table("Per expected category", ["expected category"] + header[1:5],
                    [r[:5] for r in _score_rows(faults, lambda r: r["expected"]["category"])]),
             _table("Per expected root cause", ["expected root cause"] + header[1:5],
                    [r[:5] for r in _score_rows(faults,
                                                lambda r: r["expected"]["root_cause"])])]
    cats = sorted({r["expected"]["category"] for r in rows}
                  | {(r["got"] or {}).get("primary") or "(no report)" for r in rows})
    confusion = Counter((r["expected"]["category"], (r["got"] or {}).get("primary")
                         or "(no report)") for r in rows)
    expected_cats = sorted({r["expected"]["category"] for r in rows})
    short = {c: c.replace("convergence_to_wrong_solution", "wrong_solution")
             .replace("loss_not_decreasing", "lnd").replace("gradient_instability", "grad_inst")
             .replace("performance_issue", "perf").replace("memory_issue", "memory") for c in cats}
    parts.append(_table("Confusion of categories (rows: expected, columns: diagnosed)",
                        ["expected \\ diagnosed"] + [short[c] for c in cats],
                        [[short[e]] + [confusion[(e, c)] or "." for c in cats]
                         for e in expected_cats]))
    roots = Counter(((r["got"] or {}).get("first_confirmed") or {}).get("root_cause")
                    or "(none confirmed)" for r in faults)
    parts.append(_table("First confirmed root cause (faults)", ["root cause", "count"],
                        [[k, v] for k, v in roots.most_common()]))
    total = [["all", len(faults),
              _pct(sum(r["category_hit"] for r in faults), len(faults)),
              _pct(sum(r["root_cause_hit"] for r in faults), len(faults)),
              _pct(sum(r["location_hit"] for r in faults), len(faults)),
              _pct(sum(r["false_alarm"] for r in healthy), len(healthy))]]
    effect = effects(rows)
    harmed = [r for r in faults if effect.get(job_key(r))]
    unknown = sum(1 for r in faults if effect.get(job_key(r)) is None)
    total.append(["with an effect", len(harmed),
                  _pct(sum(r["category_hit"] for r in harmed), len(harmed)),
                  _pct(sum(r["root_cause_hit"] for r in harmed), len(harmed)),
                  _pct(sum(r["location_hit"] for r in harmed), len(harmed)), "-"])
    total.append(["with an effect, category as the bare run showed it", len(harmed),
                  _pct(sum(symptom_hit(r) for r in harmed), len(harmed)), "-", "-", "-"])
    parts.append(_table("Totals", [""] + header[1:], total))
    latent = [r for r in faults if effect.get(job_key(r)) is False]
    names = ", ".join(sorted(f"{r['operator']}/{r['base']}" for r in latent)) or "none"
    parts.append(
        f"Faults with an effect: the bare run failed, printed a non-finite metric, or a metric "
        f"outside the base's healthy runs (by {SCORE_TOLERANCE} for a score, "
        f"{LOSS_TOLERANCE}x for a loss); memory and performance faults and a leak always. Without a measured effect: {len(latent)} "
        f"({names}); "
        f"unknown: {unknown}. \"Category as the bare run showed it\" also counts "
        f"gradient_instability for a fault whose bare run printed a non-finite number.\n")
    timed = [r for r in rows if r.get("diagnose_seconds") is not None]
    diag = [r["diagnose_seconds"] for r in timed]
    bare = [r["bare_seconds"] for r in timed]
    extra = [r["diagnose_seconds"] - r["bare_seconds"] for r in timed]
    ratio = [r["diagnose_seconds"] / r["bare_seconds"] for r in timed if r["bare_seconds"] > 0]
    parts.append(_table("Time per diagnosis vs the bare run (seconds)",
                        ["", "median", "p90", "max"],
                        [[name, f"{_quantile(v, .5):.1f}", f"{_quantile(v, .9):.1f}",
                          f"{max(v):.1f}" if v else "-"]
                         for name, v in (("bare run", bare), ("diagnose", diag),
                                         ("diagnose - bare", extra),
                                         ("diagnose / bare", ratio))]))
    broken = Counter("bare run failed" if r.get("bare_rc") not in (0, None) else
                     "bare run timed out" if r.get("bare_rc") is None else "bare ok"
                     for r in faults)
    failed = sum(1 for r in rows if r.get("got") is None)
    parts.append(f"Fault programs: {dict(broken)}; diagnoses without a report: {failed}.\n")
    parts.append(_missed_table(rows))
    return "\n".join(parts)


def _last_line(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("bare_rc") not in (0,):
        return f"(exit {row.get('bare_rc')}) {row.get('bare_error') or ''}"[:90]
    tail = row.get("bare_tail") or []
    return (tail[-1] if tail else "").replace("|", "/")[:90]


def _missed_table(rows: list[dict]) -> str:
    """Faults diagnosed ``healthy``: the mutant's last printed line against the base's own."""
    healthy = {}
    for r in rows:
        if r["kind"] == "healthy" and r.get("bare_tail"):
            healthy.setdefault(r["base"], r)
    missed = [r for r in rows if r["kind"] == "fault" and "bare_tail" in r
              and (r.get("got") or {}).get("primary") == "healthy"]
    if not missed:
        return ""
    body = [[r["operator"], r["base"], r["expected"]["category"], _last_line(r),
             _last_line(healthy.get(r["base"]))] for r in sorted(
                 missed, key=lambda r: (r["expected"]["category"], r["operator"], r["base"]))]
    return _table("Faults diagnosed healthy: the mutant's last printed line vs the healthy base's",
                  ["operator", "base", "expected", "mutant (bare run)", "healthy base"], body)


# -- main --------------------------------------------------------------------------------------
def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _csv(text: str | None) -> list[str] | None:
    return [x for x in text.split(",") if x] if text else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=0, help="a stratified sample of N pairs")
    ap.add_argument("--seed", type=int, default=0, help="diagnosis seed (and sampling seed)")
    ap.add_argument("--bases", type=_csv, default=None)
    ap.add_argument("--operators", type=_csv, default=None)
    ap.add_argument("--healthy-seeds", type=lambda s: [int(x) for x in s.split(",") if x],
                    default=[0, 1, 2], help="seeds of the healthy false-alarm runs ('' for none)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("fault_matrix_results.jsonl"))
    ap.add_argument("--probe-seconds", type=float, default=30.0)
    ap.add_argument("--intervene-seconds", type=float, default=60.0,
                    help="confirmation by intervention: seconds of re-runs per diagnosis "
                    "(default 60, the product's; 0: off)")
    ap.add_argument("--bare-timeout", type=float, default=300.0)
    ap.add_argument("--diagnose-timeout", type=float, default=900.0)
    ap.add_argument("--rows", type=Path, default=None,
                    help="run exactly the jobs of an earlier results file (before/after)")
    ap.add_argument("--report", action="store_true", help="only print the tables of --out")
    ap.add_argument("--list", action="store_true", help="only list the jobs")
    args = ap.parse_args(argv)

    if args.rows is not None and args.rows.resolve() == args.out.resolve():
        raise SystemExit("--out must be a new file, not --rows (it would resume every job)")
    if args.report:
        print(tables(read_rows(args.out)))
        return 0
    jobs = jobs_for(args)
    if args.list:
        for j in jobs:
            print(j["kind"], j["base"], j["operator"] or "-", j["seed"])
        print(f"{len(jobs)} jobs")
        return 0
    done = {job_key(r) for r in read_rows(args.out)}
    todo = [j for j in jobs if job_key(j) not in done]
    print(f"{len(jobs)} jobs, {len(jobs) - len(todo)} already in {args.out}, {len(todo)} to run",
          file=sys.stderr)

    lock = threading.Lock()

    def one(job: dict) -> dict:
        row = run_job(job, args.probe_seconds, args.bare_timeout, args.diagnose_timeout,
                      args.intervene_seconds)
        with lock, open(args.out, "a") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
        got = (row.get("got") or {}).get("primary")
        print(f"{job['kind']:7s} {job['base']:20s} {job['operator'] or '-':26s} seed {job['seed']}"
              f" -> {got} (cat {row['category_hit']}, root {row['root_cause_hit']}, "
              f"loc {row['location_hit']}) {row['diagnose_seconds']:.0f}s/"
              f"{row['bare_seconds']:.0f}s", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(one, todo))
    wanted = {job_key(j) for j in jobs}
    print(tables([r for r in read_rows(args.out) if job_key(r) in wanted]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
