"""The suggested fix of any finding: the probe that made it words it, or its lint rule does."""

from __future__ import annotations

from ..records import Finding
from .base import GENERIC_SUGGESTION, PROBES


def suggestion_for(finding: Finding) -> str:
    """The suggested fix for a finding, from the probe that made it or its lint rule.

    A finding's ``check`` is a registered probe id (the probe words it,
    :meth:`~model_debugger.probes.Probe.suggestion`) or the id of a rule the lint probe reports
    (the rule entry carries its text); anything else gets :data:`GENERIC_SUGGESTION`.
    """
    cls = PROBES.get(finding.check)
    if cls is not None:
        return cls().suggestion(finding)
    from .lint import RULES  # at call time: the package registers its probes in name order

    rule = RULES.get(finding.check)
    return rule.suggestion if rule is not None else GENERIC_SUGGESTION


def intervention_for(finding: Finding):
    """The intervention that would undo a finding's cause in a re-run, or None.

    See :meth:`~model_debugger.probes.Probe.intervention`.
    """
    cls = PROBES.get(finding.check)
    return cls().intervention(finding) if cls is not None else None
