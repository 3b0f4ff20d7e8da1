"""Fix: a plan for one change, checked against the method's boundaries before anyone approves it.

A plan names the confirmed finding it addresses, shows the change as a unified diff, and says
what should happen to the signal that defined the category. :func:`plan_fix` refuses (raises
:class:`FixRefused`, nothing recorded) a change that touches several unrelated places, an
architecture change when the cause is a hyperparameter or data, a change to data preprocessing
without consent, a framework switch, and any fix for a hardware cause. Recording the approved plan
is the session's job (:meth:`DebugSession.record_fix`), so every front end obeys the same gate.
"""

from __future__ import annotations

import difflib

from .._change import Hunk, framework_of, hunks_of, touches, unrelated_groups
from .._validate import syntax_error
from ..defining import expected_effect
from ..probes.suggestions import suggestion_for
from ..redact import redact_code
from ..session import DebugSession, GateError

__all__ = ["FixRefused", "Hunk", "plan_fix"]


class FixRefused(GateError):
    """A fix plan the boundaries refuse; ``reasons`` lists why, ``hunks`` what was changed."""

    def __init__(self, reasons: list[str], hunks: list[Hunk] = ()) -> None:
        self.reasons = list(reasons)
        self.hunks = list(hunks)
        listing = "".join(f"\n  hunk {i + 1}: {h.header} {h.summary}"
                          for i, h in enumerate(self.hunks)) if len(self.hunks) > 1 else ""
        super().__init__("fix refused: " + "; ".join(self.reasons) + listing)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def plan_fix(session: DebugSession, fixed_source: str, *, original: str | None = None,
             fixed_path: str | None = None, allow_architecture: bool = False,
             data_consent: bool = False) -> dict:
    """Plan one change for the current confirmed finding.

    Parameters
    ----------
    session : DebugSession
        A session whose Fix gate is open (a confirmed, unresolved finding).
    fixed_source : str
        The changed training code (a whole script, or a notebook cell's code).
    original : str, optional
        The code it replaces (default: the session's current artifact).
    fixed_path : str, optional
        Where the fixed code lives (Verify reruns it).
    allow_architecture : bool
        Override the boundary that keeps architecture changes away from hyperparameter and data
        causes (recorded in the plan).
    data_consent : bool
        Explicit consent to change data preprocessing (recorded in the plan).

    Returns
    -------
    dict
        ``{"finding", "root_cause", "location", "diff", "hunks", "touches", "suggestion",
        "expected", "overrides", "fixed"}``; pass it to ``session.record_fix(plan, approved)``.

    Raises
    ------
    GateError
        When the Fix gate is closed.
    FixRefused
        When the change breaks a boundary or is not a single change, or the fixed code is
        empty or does not compile (``"the fixed code: syntax error at line N: ..."``).
    """
    gate = session.gates()["fix"]
    if gate:
        raise GateError(f"fix refused: {gate} (current phase: {session.phase})")
    if not isinstance(fixed_source, str) or not fixed_source.strip():
        raise FixRefused(["the fixed code is empty"])
    problem = syntax_error(fixed_source, "the fixed code")
    if problem:  # what a change touches is only read from code that compiles
        raise FixRefused([problem])
    finding = session.queue[0]
    if original is None:
        original = _read(_artifact_copy(session))
    # the session keeps its code redacted: compare like with like, or a secret reads as a change
    original, fixed_source = redact_code(original), redact_code(fixed_source)
    diff = "".join(difflib.unified_diff(original.splitlines(True), fixed_source.splitlines(True),
                                        "reproduced", "fixed"))
    hunks = hunks_of(original, fixed_source)
    places = hunks_of(original, fixed_source, merge=False)
    reasons: list[str] = []
    if not hunks:
        reasons.append("the fixed code is identical to the reproduced code")
    groups = unrelated_groups(hunks, original, fixed_source)
    if len(groups) > 1:
        reasons.append(f"the change touches {len(groups)} unrelated places; split it and fix one "
                       "thing at a time")
    before_fw, after_fw = framework_of(original), framework_of(fixed_source)
    if before_fw and after_fw and before_fw != after_fw:
        reasons.append(f"switching framework ({before_fw} -> {after_fw}) is not a fix")
    kinds = touches(original, fixed_source, places)
    overrides = []
    if "architecture" in kinds and finding.root_cause in ("hyperparameter", "data"):
        if allow_architecture:
            overrides.append("architecture change allowed for a "
                             f"{finding.root_cause} cause (explicit override)")
        else:
            reasons.append(f"the change touches the architecture but the root cause is "
                           f"{finding.root_cause}; change the {finding.root_cause} instead "
                           "(or override explicitly with --allow-architecture)")
    if "data_preprocessing" in kinds:
        if data_consent:
            overrides.append("data preprocessing changed with explicit consent")
        else:
            reasons.append("the change touches data preprocessing, which needs explicit "
                           "consent (--data-consent)")
    if reasons:
        raise FixRefused(reasons, hunks)
    cls = session.classification
    return {
        "finding": finding.check,
        "category": (finding.evidence or {}).get("category"),
        "root_cause": finding.root_cause,
        "location": finding.location,
        "diff": diff,
        "hunks": [h.to_json() for h in hunks],
        "touches": sorted(kinds),
        "suggestion": suggestion_for(finding),
        "expected": expected_effect(cls.to_json() if cls else None),
        "overrides": overrides,
        "fixed": fixed_path,
        "source": fixed_source,
    }


def _artifact_copy(session: DebugSession) -> str:
    """The code Fix diffs against: the session's copy of the current artifact."""
    return session.artifact_copy
