"""``make demo``: the five phases end to end on the bundled scripts, ending ``resolved``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_the_demo_walks_every_phase_to_resolved_and_a_record(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "model_debugger.examples.demo", "--root",
                           str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    starts = ("Reproduce: reproduced 3/3", "Classification: gradient_instability",
              "Isolate: ", "  to fix first: feature_scaling (data) at broken_training.py:21",
              "Fix: feature_scaling (data) - approved", "Verify: resolved", "Record: ")
    for start in starts:
        assert any(line.startswith(start) for line in lines), (start, proc.stdout)
    record = next(line for line in lines if line.startswith("Record: "))[len("Record: "):]
    assert os.path.isfile(record) and record.startswith(str(tmp_path))
    assert "RuntimeWarning" not in proc.stderr  # the probes' arithmetic on a diverged model
