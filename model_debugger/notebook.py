"""The kernel's investigation: one DebugSession, the artifact it runs in this kernel, the views.

A :class:`NotebookSession` belongs to the :class:`~model_debugger.magics.DebuggerMagics`
instance that ``%load_ext model_debugger`` registers on the shell (``%unload_ext`` drops it);
:func:`current_session` finds it there. It holds no state of the investigation: the phase, the
gates, the findings, the fix plan awaiting approval and the verdicts are all events of the
:class:`~model_debugger.session.DebugSession` (saved under ``.model_debugger/`` in the kernel's
working directory, so a plan survives a kernel restart). What it does hold is what cannot be
saved: the artifact whose live objects Isolate probes, and the widgets. Every view subscribes to
the session itself (:meth:`~model_debugger.session.DebugSession.on_change`) and renders the
state each event produces, so a change made through any DebugSession object of the process
refreshes them all.
"""

from __future__ import annotations

import os

from .session import DebugSession
from .store import ROOT, Store

EVIDENCE_TEXT_LIMIT = 20_000
MAGICS = "DebuggerMagics"  # the name the magics are registered under on the shell


class NotebookSession:
    """One kernel's investigation: the current DebugSession, its artifact and its views.

    Parameters
    ----------
    namespace : dict, optional
        Where cells run (the kernel's ``user_ns``); default: the running IPython's.
    root : str, optional
        Where sessions are saved (default ``.model_debugger`` in the current directory).
    """

    def __init__(self, namespace: dict | None = None, root: str | None = None) -> None:
        if namespace is None:
            from IPython import get_ipython

            shell = get_ipython()
            namespace = shell.user_ns if shell is not None else {"__name__": "__main__"}
        self.namespace = namespace
        self.root = root or os.path.join(os.getcwd(), ROOT)
        self.sidebar = None  # the comm end of the JupyterLab sidebar (model_debugger.comm)
        self._session: DebugSession | None = None
        self._artifact = None
        self._unfollow = None
        self._widgets: dict[str, object] = {}  # the panels of the current session
        self._earlier: list = []  # panels of earlier sessions (still shown; closed on close())
        self._trackers: list = []  # every tracker shown; the last one is live
        self.running: dict | None = None  # the phase running now, for the sidebar

    # -- the session -----------------------------------------------------------------------
    @property
    def has_session(self) -> bool:
        """True once a DebugSession exists (asking creates none)."""
        return self._session is not None

    @property
    def session(self) -> DebugSession:
        """The DebugSession (created on first use)."""
        if self._session is None:
            self.use(DebugSession.create(self.root, title="notebook"))
        return self._session

    def use(self, session: DebugSession) -> DebugSession:
        """Make ``session`` the kernel's (a new investigation, or a saved one loaded again).

        The views of the previous session stay where they were shown, following it; new views
        follow ``session``, and so does the sidebar.
        """
        if session is self._session:
            return session
        if self._unfollow is not None:
            self._unfollow()
        self._session, self._artifact = session, None
        self._unfollow = session.on_change(self._sync)  # first: the views read a fresh session
        for tracker in self._trackers:
            tracker.retire()
        self._earlier.extend(self._widgets.values())
        self._widgets.clear()
        if self.sidebar is not None:
            self.sidebar.follow(session)
        return session

    def new_session(self) -> DebugSession:
        """A new investigation (the next ``%%reproduce``), unless the session is still empty."""
        if self._session is not None and not self._session.events:
            return self._session
        return self.use(DebugSession.create(self.root, title="notebook"))

    def _sync(self, state) -> None:
        """Another DebugSession object of this process appended: read the events again."""
        if self._session is not None and state.events != self._session.state.events:
            self._session.reload()

    @property
    def state(self):
        """The session's replayed :class:`~model_debugger.session.State`."""
        return self.session.state

    def report(self) -> dict:
        """The session report (the CLI's schema)."""
        return self.session.report()

    @property
    def artifact(self):
        """What the phases run for the session (:func:`model_debugger.artifacts.artifact_for`).

        The :class:`~model_debugger.artifacts.CellArtifact` this kernel reproduced (its
        namespace, snapshot and live objects), or one whose runs refuse with the reason (a
        session loaded from disk, whose starting state lived in another kernel).
        """
        from .artifacts import artifact_for

        return artifact_for(self.session, self._artifact)

    def keep(self, artifact):
        """Keep ``artifact`` (a cell about to be reproduced in this kernel) for the session."""
        self._artifact = artifact
        return artifact

    def show_run(self) -> None:
        """Draw the curves and gradient panels from Reproduce's first recorded run."""
        from .records import Run

        path = self.session.store.path(Store.run_rel(0))
        if os.path.exists(path):
            run = Run.load(path)
            self.curves.update(run)
            self.gradients.update(run)

    # -- what runs now ----------------------------------------------------------------------
    def progress(self, phase: str, description: str):
        """A progress bar for ``phase`` whose every move the sidebar shows too (:attr:`running`).

        Use it as a context manager around the phase: the sidebar's "running" line is cleared
        when the block ends, however it ends.
        """
        from .widgets import Progress

        return Progress(description, on_move=lambda f, label: self.tell(phase, f, label),
                        on_close=self.idle)

    def tell(self, phase: str, fraction: float | None, label: str) -> None:
        """Say what runs now (the sidebar's "running" line): ``fraction`` done, or None."""
        self.running = {"phase": phase, "label": str(label),
                        "fraction": None if fraction is None else
                        min(max(float(fraction), 0.0), 1.0)}
        if self.sidebar is not None:
            self.sidebar.push()

    def idle(self) -> None:
        """Nothing runs any more."""
        self.running = None
        if self.sidebar is not None:
            self.sidebar.push()

    # -- views -----------------------------------------------------------------------------
    def _widget(self, name: str, factory):
        if name not in self._widgets:
            self._widgets[name] = factory()
        return self._widgets[name]

    @property
    def tracker(self):
        """The live phase tracker (the newest one shown; one is made when none is)."""
        live = [t for t in self._trackers if t.live and t.session is self.session]
        return live[-1] if live else self.new_tracker()

    def new_tracker(self):
        """A new live tracker of the session; every earlier one becomes read-only."""
        from .widgets import PhaseTracker

        for tracker in self._trackers:
            tracker.retire()
        tracker = PhaseTracker(self.session)
        self._trackers.append(tracker)
        return tracker

    @property
    def curves(self):
        """The loss-curve panel of the session's reproduction."""
        from .widgets import LossCurves

        return self._widget("curves", LossCurves)

    @property
    def gradients(self):
        """The gradient panel of the session's reproduction."""
        from .widgets import GradientPanel

        return self._widget("gradients", GradientPanel)

    @property
    def findings_table(self):
        """The findings table of the session (file:line of each finding)."""
        from .widgets import FindingsTable

        return self._widget("findings", lambda: FindingsTable(self.session))

    def verify_overlay(self):
        """An interactive chart of the last Verify's runs, or None.

        Each seed's loss before (dashed) and after the fix (solid); None when nothing was
        verified, no run can be read, or plotly is missing.
        """
        from .export import verify_runs
        from .widgets import charts

        events = [e for e in self.session.events if e["kind"] == "verify"]
        if not events or not charts.available():
            return None
        before, after = verify_runs(self.session, len(events), events[-1]["verification"])
        if not (before or after):
            return None
        return charts.widget(charts.overlay_chart(before, after))

    def run_records(self, runs: int):
        """``path_of()`` for the live curves: the newest record of Reproduce's ``runs`` runs."""
        store = self.session.store

        def current() -> str | None:
            found = None
            for i in range(max(1, runs)):
                path = store.path(Store.run_rel(i))
                if os.path.exists(path):
                    found = path
            return found

        return current

    def close(self) -> None:
        """Close the widgets and stop following the session (the saved session stays)."""
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None
        for widget in [*self._trackers, *self._earlier, *self._widgets.values()]:
            _close(widget)
        self._trackers.clear()
        self._earlier.clear()
        self._widgets.clear()
        if self.sidebar is not None:
            self.sidebar.close()
            self.sidebar = None


def _close(widget) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    close = getattr(widget, "close", None)
    if close:
        close()


def current_session(shell=None) -> NotebookSession:
    """The kernel's notebook session.

    The one the model_debugger magics on ``shell`` (default: the running IPython) own.

    Raises
    ------
    RuntimeError
        When ``%load_ext model_debugger`` has not run in this kernel.
    """
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    magics = None
    if shell is not None:
        magics = getattr(getattr(shell, "magics_manager", None), "registry", {}).get(MAGICS)
    if magics is None or getattr(magics, "kernel", None) is None:
        raise RuntimeError("model_debugger is not loaded in this kernel: run "
                           "%load_ext model_debugger first")
    return magics.kernel


__all__ = ["NotebookSession", "current_session"]
