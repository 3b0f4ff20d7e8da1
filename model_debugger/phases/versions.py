"""The versions of a session's code that the phases run."""

from __future__ import annotations

from ..artifacts.base import Version
from ..session import DebugSession


def current_version(session: DebugSession) -> Version:
    """The session's current code: the reproduced code, or the last kept fix."""
    state = session.state
    return Version("current", session.store.path(state.current), state.current_source)


def fixed_version(session: DebugSession) -> Version:
    """The approved fix awaiting Verify (the session must have one)."""
    fix = session.state.pending
    return Version("fixed", session.store.path(fix.copy), fix.fixed)
