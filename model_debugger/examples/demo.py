"""``make demo``: the whole method on the bundled broken script, end to end, through the CLI.

Reproduce (3 seeded runs) -> Classify -> Isolate -> Fix (the bundled ``fixed_training.py``,
approved) -> Verify -> export, printing each phase's one-line result and the record's path.
The training scripts' own output goes to stderr. Exit status 0 only when Verify says
``resolved`` and the record was written.

Run it as ``python -m model_debugger.examples.demo [--root DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BROKEN, FIXED = HERE / "broken_training.py", HERE / "fixed_training.py"


def _cli(*argv: str) -> dict:
    """Run ``model-debugger ARGV --json``; its JSON answer (SystemExit on a failed phase)."""
    from .. import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main([*argv, "--json"])
    if code != 0:
        raise SystemExit(f"demo: `model-debugger {' '.join(argv)}` exited {code}")
    return json.loads(out.getvalue().strip().splitlines()[-1])


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Walk the five phases and export; 0 when Verify resolved the problem."""
    from .. import views
    from ..store import ROOT

    parser = argparse.ArgumentParser(prog="python -m model_debugger.examples.demo",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=ROOT, help=f"where the session is saved ({ROOT})")
    ns = parser.parse_args(argv)
    _say(f"Diagnosing {BROKEN.name} (3 runs, seeds 0-2) ...")
    report = _cli("diagnose", str(BROKEN), "--runs", "3", "--seed", "0", "--root", ns.root)
    folder = report["session_dir"]
    for doc in views.report(report, isolated=True)[:3]:
        _say(doc.title)
    queue = report.get("queue") or []
    top = next((f for f in report["findings"] if queue and f["check"] == queue[0]), None)
    if top is None:
        _say(f"No confirmed finding to fix; the session is {folder}")
        return 1
    where = top.get("location") or {}
    _say(f"  to fix first: {top['check']} ({top['root_cause']}) at "
         f"{Path(str(where.get('file'))).name}:{where.get('line')}")
    _say(f"Fixing it with {FIXED.name} (inputs standardised; approved with --yes, "
         "--data-consent) and verifying over 3 seeds ...")
    report = _cli("verify", folder, "--fixed", str(FIXED), "--yes", "--data-consent")
    for doc in views.report(report, isolated=True)[3:5]:
        _say(doc.title)
    verdict = (report.get("verification") or {}).get("verdict")
    paths = _cli("export", folder)
    _say(f"Record: {paths['notebook']}")
    _say(f"Session: {folder}")
    return 0 if verdict == "resolved" else 1


if __name__ == "__main__":
    sys.exit(main())
