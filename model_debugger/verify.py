"""Verify: see :mod:`model_debugger.phases.verify` (this name is kept for imports)."""

from .diagnose import verify_script
from .phases.verify import DEFAULT_SEEDS, judge, known_runs, measure, seeds_for, verify

__all__ = ["DEFAULT_SEEDS", "judge", "known_runs", "measure", "seeds_for", "verify",
           "verify_script"]
