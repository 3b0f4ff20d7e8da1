"""The findings table (check, root cause, confirmed or hypothesis, file:line, explanation)."""

from __future__ import annotations

import ipywidgets as W

from . import views


class FindingsTable(W.HTML):
    """Isolate's findings as an HTML table that follows its session.

    Parameters
    ----------
    session : DebugSession, optional
        The table subscribes to it (:meth:`~model_debugger.session.DebugSession.on_change`)
        and renders ``state.findings`` after every event; without one, :meth:`update` fills it.
    """

    def __init__(self, session=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.session = session
        self._unsubscribe = None
        if session is not None:
            self._unsubscribe = session.on_change(self.refresh)
            self.refresh()

    def refresh(self, state=None) -> None:
        """Render the findings of ``state`` (default: the session's)."""
        state = state if state is not None else self.session.state
        self.update(state.findings, self.session.directory)

    def update(self, findings, root: str | None = None) -> None:
        """Render ``findings`` (typed or the report's JSON), locations relative to ``root``."""
        self.value = views.findings(findings, root).html

    def close(self) -> None:
        """Stop following the session and close the widget."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        super().close()
