"""Fixed twins: broken scenarios diagnosed, then verified through the CLI with their twins.

``tests/scenarios/fixed/<scenario>__<verdict>.py`` is the scenario with one change; its name says
the verdict Verify must reach: ``resolved`` for the right fix, ``not_resolved`` for a wrong one,
``partially_resolved`` for a right fix of a scenario with a second problem (the softmax removed,
the learning rate still far too low). Wrong fixes are tried first (they must leave the session in
Fix), then the right one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from scenario_suite import SCENARIOS, diagnose

HAVE_TF = importlib.util.find_spec("tensorflow") is not None
TWINS = sorted(t for t in (SCENARIOS / "fixed").glob("*__*.py")
               if HAVE_TF or not t.name.startswith("keras_"))
ORIGINALS = sorted({t.name.split("__")[0] for t in TWINS})
ORDER = {"not_resolved": 0, "partially_resolved": 1, "resolved": 2}


def verify(session_dir: str, fixed: Path, *extra: str) -> tuple[int, dict, str]:
    """``model-debugger verify SESSION --fixed FIXED --yes --json`` -> (exit code, JSON, stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "model_debugger.cli", "verify", session_dir, "--fixed",
         str(fixed), "--json", "--seeds", "2", *extra],
        capture_output=True, text=True, timeout=600, env=env, stdin=subprocess.DEVNULL)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, (proc.stdout, proc.stderr[-2000:])
    return proc.returncode, json.loads(lines[0]), proc.stderr


def _walk(name: str, root: Path) -> list[tuple[Path, int, dict, str]]:
    report, _ = diagnose(SCENARIOS / f"{name}.py", root / name, "--runs", "2", "--seed", "0")
    assert report["phase"] == "fix", report["findings"]
    twins = sorted((t for t in TWINS if t.name.split("__")[0] == name),
                   key=lambda t: ORDER[t.stem.split("__")[1]])
    steps = []
    # without --yes and without a terminal, nothing is approved and nothing recorded
    code, rep, err = verify(report["session_dir"], twins[-1])
    steps.append((twins[-1], code, rep, err))
    for twin in twins:
        steps.append((twin, *verify(report["session_dir"], twin, "--yes")))
    return steps


@pytest.fixture(scope="module")
def walks(tmp_path_factory, request):
    """Walk the selected scenarios (two at a time)."""
    names = sorted({item.callspec.params["name"] for item in request.session.items
                    if getattr(item, "originalname", "") == "test_twin_verdicts"})
    root = tmp_path_factory.mktemp("twins")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(names, pool.map(lambda n: _walk(n, root), names)))


def test_there_are_twins_for_several_categories():
    assert len(ORIGINALS) >= 4 + HAVE_TF
    assert sum(t.stem.endswith("__not_resolved") for t in TWINS) >= 2


@pytest.mark.parametrize("name", ORIGINALS)
def test_twin_verdicts(name, walks):
    steps = walks[name]
    twin, code, rep, err = steps[0]
    assert code == 3 and rep["refused"] == ["not approved"] and rep["fix"] is None, err[-1500:]
    for twin, code, rep, err in steps[1:]:
        want = twin.stem.split("__")[1]
        assert code == 0, err[-3000:]
        ver = rep["verification"]
        assert ver["verdict"] == want, (ver, err[-1500:])
        assert ver["seeds"] == [0, 1] and ver["metric"] and rep["fix"]["approved"] is True
        assert ver["before"]["present"] == "2/2"
        assert rep["fix"]["diff"].count("\n@@") + rep["fix"]["diff"].startswith("@@") >= 1
        if want == "not_resolved":
            assert rep["phase"] == "fix" and rep["fix_allowed"]
            assert ver["improvement"] is None or ver["improvement"] <= ver["noise_band"]
        elif want == "partially_resolved":
            assert ver["improvement"] > ver["noise_band"] and ver["remaining_symptom"]
            assert rep["phase"] == "isolate" and not rep["fix_allowed"]
        else:
            assert ver["after"]["present"] == "0/2" and ver["remaining_symptom"] is None
            assert rep["phase"] in ("done", "fix", "isolate")
