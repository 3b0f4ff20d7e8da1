"""Probe cost on the scenario scripts: seconds per probe, and diagnose time vs the bare script.

Run: ``python benchmarks/probe_cost.py [SCENARIO ...]`` (default: every tests/scenarios/*.py).
For each script it times ``python SCRIPT`` (bare) and ``model-debugger diagnose SCRIPT --json``,
then prints the Isolate probe timings the session recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT)
    return time.perf_counter() - t0, proc.stdout


def main(paths: list[str]) -> None:
    scripts = [Path(p) for p in paths] or sorted((ROOT / "tests" / "scenarios").glob("*.py"))
    totals: dict[str, list[float]] = {}
    print(f"{'scenario':32} {'bare s':>7} {'diagnose s':>10} {'extra s':>8}  slowest probes")
    with tempfile.TemporaryDirectory() as root:
        for script in scripts:
            bare, _ = timed([sys.executable, str(script)])
            took, out = timed([sys.executable, "-m", "model_debugger.cli", "diagnose",
                               str(script), "--json", "--root", root])
            report = json.loads(out)
            with open(os.path.join(report["session_dir"], "session.json")) as fh:
                events = json.load(fh)["events"]
            iso = next((e for e in events if e["kind"] == "isolate"), {})
            probes = iso.get("probe_seconds", {})
            for pid, sec in probes.items():
                totals.setdefault(pid, []).append(sec)
            slow = ", ".join(f"{p} {s:.1f}" for p, s in
                             sorted(probes.items(), key=lambda kv: -kv[1])[:3])
            print(f"{script.stem:32} {bare:7.1f} {took:10.1f} {took - bare:8.1f}  {slow}")
    print("\nper probe: runs, mean s, max s")
    for pid, secs in sorted(totals.items(), key=lambda kv: -max(kv[1])):
        print(f"  {pid:24} {len(secs):3d} {sum(secs) / len(secs):7.2f} {max(secs):7.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
