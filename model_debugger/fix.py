"""Fix: see :mod:`model_debugger.phases.fix` (this name is kept for imports)."""

from .phases.fix import FixRefused, Hunk, plan_fix, suggest

__all__ = ["FixRefused", "Hunk", "plan_fix", "suggest"]
