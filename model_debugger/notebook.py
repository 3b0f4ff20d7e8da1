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

import contextlib
import io
import os

from .session import DebugSession, GateError
from .store import ROOT, Store

DEFAULT_BUDGET = 30.0
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
            self._session._reload()

    @property
    def state(self):
        """The session's replayed :class:`~model_debugger.session.State`."""
        return self.session.state

    def report(self) -> dict:
        """The session report (the CLI's schema)."""
        return self.session.report()

    @property
    def artifact(self):
        """The :class:`~model_debugger.inprocess.KernelArtifact` of the session."""
        if self._artifact is None:
            from .inprocess import KernelArtifact

            self._artifact = KernelArtifact(self.session, self.namespace)
        return self._artifact

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

    # -- actions (the magics' calls) -------------------------------------------------------
    def reproduce(self, code: str, runs: int = 1, seed: int | None = None,
                  history: list[str] | None = None, live: bool = True):
        """Run a cell under capture ``runs`` times; record Reproduce and Classify.

        A second reproduction starts a new session folder (a new investigation). The run's
        exception (error, OOM, interrupt) is returned, not raised: the record is kept and the
        kernel goes on.

        Returns
        -------
        tuple
            ``(verdict, error)``.
        """
        from ._deps import prelude

        self.new_session()
        pre = prelude(history or [], code)
        follow = self.curves.follow(self.run_records(runs)) if live else \
            contextlib.nullcontext()
        with follow:
            verdict, error = self.artifact.reproduce(code, runs=runs, seed=seed, prelude=pre)
        run = self.artifact.last_run
        if run is not None:
            self.curves.update(run)
            self.gradients.update(run)
        return verdict, error

    def isolate(self, ids: list[str] | None = None, budget: float = DEFAULT_BUDGET,
                progress=None) -> list[dict]:
        """Run probes on the live objects of the reproduction; record and return the findings."""
        if progress is not None:
            with progress.track(lambda t: (t / budget, f"probes: {t:.0f} s of at most "
                                                       f"{budget:.0f} s")):
                self.artifact.isolate(ids, budget)
        else:
            self.artifact.isolate(ids, budget)
        return [f.to_json() for f in self.session.state.findings]

    def verify(self, seeds: int = 3, progress=None, quiet: bool = True) -> dict:
        """Rerun the reproduced code and the approved fix over ``seeds`` seeds; record the verdict."""
        from .verify import seeds_for

        chosen = seeds_for(self.session, seeds)
        n = self.session.state.verifications + 1
        total = 2 * len(chosen)

        def done(_t: float) -> tuple[float, str]:
            store = self.session.store
            runs = sum(os.path.exists(store.path(Store.verify_rel(n, which, seed)))
                       for which in ("before", "after") for seed in chosen)
            return runs / total, f"verify: run {runs} of {total}"

        out = io.StringIO()
        with contextlib.ExitStack() as stack:
            if progress is not None:
                stack.enter_context(progress.track(done))
            if quiet:
                stack.enter_context(contextlib.redirect_stdout(out))
            return self.artifact.verify(chosen)

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
    """The kernel's notebook session: the one the model_debugger magics on ``shell`` (default:
    the running IPython) own.

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


__all__ = ["GateError", "NotebookSession", "current_session"]
