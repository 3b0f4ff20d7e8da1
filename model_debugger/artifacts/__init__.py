"""Artifacts: what the phases run (see :mod:`model_debugger.artifacts.base`)."""

from __future__ import annotations

from .base import (
    Artifact,
    Captured,
    Intervention,
    LogArtifact,
    ProbeRequest,
    Unrunnable,
    Version,
)
from .cell import CellArtifact, Snapshot
from .script import ScriptArtifact

__all__ = ["Artifact", "Captured", "CellArtifact", "Intervention", "LogArtifact",
           "ProbeRequest", "ScriptArtifact", "Snapshot", "Unrunnable", "Version", "artifact_for"]


def artifact_for(session, live=None):
    """The artifact of a saved session.

    Parameters
    ----------
    session : DebugSession
    live : CellArtifact, optional
        A cell session's artifact as the kernel that reproduced it holds it (its namespace and
        snapshot); without it a cell session cannot be rerun.

    Returns
    -------
    Artifact
        A :class:`ScriptArtifact`, the given cell artifact, or an :class:`Unrunnable` whose
        runs raise GateError with the reason (a log; a cell outside its kernel).
    """
    info = session.state.artifact
    if info is None:
        return Unrunnable("none", "the session has no artifact: reproduce first")
    if info.type == "script":
        return ScriptArtifact.from_info(info)
    if info.type == "cell":
        if live is not None:
            return live
        return Unrunnable("cell", "the session was reproduced in a notebook kernel: rerun it "
                                  "there (the cell's starting state lives in that kernel)")
    return Unrunnable("log", "the session was reproduced from a log; there is no script to "
                             "rerun")
