"""Multi-rank fault matrix: real torch.distributed programs (gloo, 2 ranks), diagnosed by the CLI.

``programs/`` holds training programs written by another hand, each in its own style (a
Trainer class, a config dict, DistributedSampler, ``no_sync`` accumulation, gradients averaged
by hand, rank-0-only evaluation behind a barrier, checkpoints on rank 0...). Healthy ones must
stay healthy; each faulty one carries one multi-rank fault and marks the faulty line with
``# <--`` (a marked ``if``: its block too). Each program runs once through ``model-debugger diagnose`` (``torchrun`` in its name:
through ``--nproc-per-node 2``; else the program starts its ranks itself) with
``--collective-timeout 10``. Printed per program: the category, whether the expected finding
was found confirmed, whether it names the expected rank, and whether its location is within
one line of a ``# <--`` line; then the totals.

    python benchmarks/rank_matrix/run.py              # every program (~4 min on 2 cores)
    python benchmarks/rank_matrix/run.py f4 h1        # programs whose names start so
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
REPO = os.path.dirname(os.path.dirname(HERE))

# program prefix -> (category, finding check or None, rank the finding names or None)
EXPECT = {
    "f1": ("performance_issue", "rank_straggler", 1),
    "f2": ("convergence_to_wrong_solution", "rank_desync", 1),
    "f3": ("convergence_to_wrong_solution", "rank_desync", 1),
    "f4_": ("performance_issue", "rank_hang", 1),
    "f4b": ("performance_issue", "rank_hang", 1),
    "f5": ("performance_issue", "rank_hang", 1),
    "f6": ("gradient_instability", "nonfinite_inputs", 1),
    "f7": ("gradient_instability", None, None),
    "f8": ("performance_issue", "rank_straggler", 1),
    "f9": ("convergence_to_wrong_solution", "rank_desync", 1),
    "h1": ("healthy", None, None),
    "h2": ("healthy", None, None),
    "h3": ("healthy", None, None),
    "h4": ("healthy", None, None),
    "h5": ("healthy", None, None),
    "h6": ("healthy", None, None),
    "x1": ("healthy", None, None),  # SUM not divided: the same doubled step on every rank
}


def expected(name: str) -> tuple:
    """The expectation of a program, by the longest prefix of :data:`EXPECT` it starts with."""
    key = max((k for k in EXPECT if name.startswith(k)), key=len)
    return EXPECT[key]


def marked_lines(path: str) -> list[int]:
    """The lines a program marks as faulty (``# <--``), with the block a marked ``if`` opens."""
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    out = []
    for i, line in enumerate(lines, 1):
        if "# <--" not in line:
            continue
        out.append(i)
        code = line.split("#")[0].rstrip()
        if code.endswith(":"):  # the statements under it are the fault too
            indent = len(line) - len(line.lstrip())
            for j in range(i, len(lines)):
                below = lines[j]
                if below.strip() and len(below) - len(below.lstrip()) <= indent:
                    break
                out.append(j + 1)
    return out


def diagnose(path: str, root: str, env: dict) -> tuple[dict | None, float, str]:
    """One CLI diagnosis: the report (None if it failed), seconds, the stderr tail."""
    cmd = [sys.executable, "-m", "model_debugger.cli", "diagnose", path, "--json", "--root",
           root, "--probe-seconds", "10", "--max-seconds", "90", "--collective-timeout", "10"]
    if "torchrun" in os.path.basename(path):
        cmd += ["--nproc-per-node", "2"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    seconds = time.perf_counter() - t0
    try:
        return json.loads(proc.stdout), seconds, proc.stderr[-400:]
    except json.JSONDecodeError:
        return None, seconds, proc.stderr[-400:]


def judge(name: str, path: str, report: dict | None) -> dict:
    """The row of one program: what was expected, what came out, and the hits."""
    category, check, rank = expected(name)
    row = {"program": name, "expected": category, "check": check, "rank": rank}
    if report is None:
        return {**row, "got": "error", "category_hit": False, "finding_hit": False,
                "rank_hit": False, "location_hit": False}
    got = (report.get("classification") or {}).get("primary") or \
        report["reproduce"].get("status")
    found = next((f for f in report.get("findings", []) if f["check"] == check and
                  f["confirmed"]), None) if check else None
    lines = marked_lines(path)
    loc = (found or {}).get("location") or {}
    near = bool(lines) and isinstance(loc.get("line"), int) and \
        any(abs(loc["line"] - m) <= 1 for m in lines)
    return {**row, "got": got, "category_hit": got == category,
            "finding_hit": check is None or found is not None,
            "rank_hit": rank is None or (found or {}).get("evidence", {}).get("rank") == rank,
            "location_hit": check is None or not lines or near,
            "found_line": loc.get("line"), "marked": lines,
            "findings": [f"{f['check']}({'c' if f['confirmed'] else 'h'})"
                         for f in report.get("findings", [])]}


def main(argv: list[str] | None = None) -> int:
    """Run the programs (all, or those named by prefix) and print the table and totals."""
    wanted = (argv if argv is not None else sys.argv[1:])
    names = sorted(n for n in os.listdir(PROGRAMS) if n.endswith(".py") and
                   (not wanted or n.startswith(tuple(wanted))))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            path = os.path.join(PROGRAMS, name)
            report, seconds, err = diagnose(path, root, env)
            row = judge(name, path, report)
            row["seconds"] = round(seconds, 1)
            rows.append(row)
            ok = all(row[k] for k in ("category_hit", "finding_hit", "rank_hit", "location_hit"))
            print(f"{'ok  ' if ok else 'MISS'} {name:<46} expected {row['expected']:<30} got "
                  f"{row['got']:<30} finding {row['finding_hit']!s:<5} rank {row['rank_hit']!s:<5}"
                  f" line {row['location_hit']!s:<5} {row['seconds']:5.1f}s "
                  f"{' '.join(row.get('findings', []))}", flush=True)
            if report is None:
                print("     " + err.replace("\n", "\n     "))
    total = len(rows)
    for key in ("category_hit", "finding_hit", "rank_hit", "location_hit"):
        print(f"{key}: {sum(r[key] for r in rows)}/{total}")
    healthy = [r for r in rows if r["expected"] == "healthy"]
    print(f"false alarms: {sum(not r['category_hit'] for r in healthy)}/{len(healthy)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
