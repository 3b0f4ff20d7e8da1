"""The scenario suite: broken (and healthy) training scripts with their expected diagnosis.

Each script under ``tests/scenarios/`` states what it shows in its docstring:
``expect-category: <category or healthy>``. Add a script whenever a new failure mode turns up.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SCENARIOS = Path(__file__).parent / "scenarios"


def expectations(path: Path) -> dict[str, str]:
    """The ``expect-*:`` lines of a scenario's docstring."""
    text = path.read_text()
    return dict(re.findall(r"^expect-([\w-]+):\s*(.+?)\s*$", text, flags=re.MULTILINE))


def _has_tensorflow() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorflow") is not None


def scenario_paths(prefix: str = "") -> list[Path]:
    """Scenario scripts with expectations; Keras ones (``keras_*``) only where TensorFlow is."""
    keras = _has_tensorflow()
    return sorted(p for p in SCENARIOS.glob(f"{prefix}*.py") if expectations(p)
                  and (keras or not p.name.startswith("keras_")))


def diagnose(script: Path, root: Path, *extra: str, timeout: float = 300) -> tuple[dict, str]:
    """Run ``model-debugger diagnose SCRIPT --json`` and return (report, stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "model_debugger.cli", "diagnose", str(script), "--json",
         "--root", str(root), *extra],
        capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected exactly one JSON line on stdout, got {proc.stdout!r}"
    return json.loads(lines[0]), proc.stderr


def diagnose_all(paths: list[Path], root: Path, workers: int = 2) -> dict[str, tuple[dict, str]]:
    with ThreadPoolExecutor(workers) as pool:
        results = pool.map(lambda p: diagnose(p, root / p.stem), paths)
        return {p.name: r for p, r in zip(paths, results)}
