"""Suggested fixes per finding: a lookup through the probe registry.

Suggestions are text shown with the plan; nothing here changes code. Each probe owns its text
(:meth:`model_debugger.probes.Probe.suggestion`), each lint rule its entry. The defining signal
of a category and the target a fix should reach live in :mod:`model_debugger.defining`
(re-exported here).
"""

from __future__ import annotations

from .defining import DEFINING, defining_signal, expected_effect
from .records import Finding

__all__ = ["DEFINING", "defining_signal", "expected_effect", "suggest"]


def suggest(finding: Finding, session=None) -> str:
    """The suggested fix for a finding (shown with the plan, never applied without approval).

    The probe that made the finding words it (:meth:`model_debugger.probes.Probe.suggestion`),
    or the lint rule it names; ``session`` is accepted and ignored.
    """
    del session
    from .probes import suggestion_for

    return suggestion_for(finding)
