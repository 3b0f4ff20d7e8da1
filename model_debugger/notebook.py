"""The kernel's debugging session: one DebugSession, the code it runs in-process, and the widgets.

:class:`NotebookSession` is what the magics talk to. It owns a
:class:`~model_debugger.session.DebugSession` (saved under ``.model_debugger/`` in the kernel's
working directory), a :class:`~model_debugger.inprocess.KernelArtifact` that runs cells in the
user's namespace, and the widgets. Every action that changes the session ends in
:meth:`NotebookSession.changed`, which calls the observers (the phase tracker's ``refresh``), so
views follow the session and are never toggled by hand.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable

from .session import DebugSession, GateError

ROOT = ".model_debugger"
DEFAULT_BUDGET = 30.0
EVIDENCE_TEXT_LIMIT = 20_000

_CURRENT: NotebookSession | None = None


class NotebookSession:
    """One investigation in a kernel.

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
        self._session: DebugSession | None = None
        self._artifact = None
        self.plan: dict | None = None
        self.last_verdict: dict | None = None
        self._observers: list[Callable[[], None]] = []
        self._widgets: dict[str, object] = {}

    # -- state -----------------------------------------------------------------------------
    @property
    def has_session(self) -> bool:
        """True once a DebugSession exists (asking creates none)."""
        return self._session is not None

    @property
    def session(self) -> DebugSession:
        """The DebugSession (created on first use)."""
        if self._session is None:
            self._session = DebugSession.create(self.root, title="notebook")
        return self._session

    @property
    def artifact(self):
        """The :class:`~model_debugger.inprocess.KernelArtifact` of the session."""
        if self._artifact is None or self._artifact.session is not self.session:
            from .inprocess import KernelArtifact

            self._artifact = KernelArtifact(self.session, self.namespace)
        return self._artifact

    def report(self) -> dict:
        """The session report (the CLI's schema)."""
        return self.session.report()

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every change of the session."""
        self._observers.append(callback)

    def changed(self) -> None:
        """Tell the observers the session changed (every action ends here)."""
        for callback in list(self._observers):
            callback()

    # -- widgets ---------------------------------------------------------------------------
    def _widget(self, name: str, factory: Callable[[], object]):
        if name not in self._widgets:
            self._widgets[name] = factory()
        return self._widgets[name]

    @property
    def tracker(self):
        """The phase tracker (its ``fix_button`` approves the plan shown by ``%%fix``)."""
        from .widgets import PhaseTracker

        def make():
            tracker = PhaseTracker(self)
            self.on_change(tracker.refresh)
            return tracker

        return self._widget("tracker", make)

    @property
    def curves(self):
        """The loss-curve panel of the last reproduction."""
        from .widgets import LossCurves

        return self._widget("curves", LossCurves)

    @property
    def gradients(self):
        """The gradient panel of the last reproduction."""
        from .widgets import GradientPanel

        return self._widget("gradients", GradientPanel)

    @property
    def findings_table(self):
        """The findings table (file:line of each finding)."""
        from .widgets import FindingsTable

        def make():
            table = FindingsTable()
            refresh = lambda: table.update(self.report()["findings"],  # noqa: E731
                                           self.session.directory)
            refresh()
            self.on_change(refresh)
            return table

        return self._widget("findings", make)

    # -- actions ---------------------------------------------------------------------------
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

        if self._session is not None and self._session.reproduce is not None:
            self._session = None
            self.plan = None
        pre = prelude(history or [], code)
        directory = self.session.directory

        def current() -> str | None:
            found = None
            for i in range(max(1, runs)):
                path = os.path.join(directory, "runs", str(i), "record.jsonl")
                if os.path.exists(path):
                    found = path
            return found

        follow = self.curves.follow(current) if live else contextlib.nullcontext()
        try:
            with follow:
                verdict, error = self.artifact.reproduce(code, runs=runs, seed=seed, prelude=pre)
        finally:
            self.changed()
        self.last_verdict = verdict
        run = self.artifact.last_run
        if run is not None:
            self.curves.update(run)
            self.gradients.update(run)
        return verdict, error

    def isolate(self, ids: list[str] | None = None, budget: float = DEFAULT_BUDGET,
                progress=None) -> list[dict]:
        """Run probes on the live objects of the reproduction; record and return the findings."""
        try:
            if progress is not None:
                with progress.track(lambda t: (t / budget, f"probes: {t:.0f} s of at most "
                                                           f"{budget:.0f} s")):
                    self.artifact.isolate(ids, budget)
            else:
                self.artifact.isolate(ids, budget)
        finally:
            self.changed()
        return self.report()["findings"]

    def current_hypothesis(self) -> str | None:
        """The finding evidence is attached to: the current confirmed one, else the first one."""
        queue = self.session.queue
        if queue:
            return queue[0].check
        found = self.session.findings
        return found[0].check if found else None

    def evidence(self, code: str, outputs: str, numbers: dict[str, float]) -> dict:
        """Attach a cell's outputs and numbers to the current hypothesis (confirms nothing)."""
        try:
            return self.session._append(
                "evidence", hypothesis=self.current_hypothesis(), phase=self.session.phase,
                code=code, outputs=outputs[-EVIDENCE_TEXT_LIMIT:], numbers=numbers,
                confirms=False)
        finally:
            self.changed()

    def plan_fix(self, source: str, allow_architecture: bool = False,
                 data_consent: bool = False) -> dict:
        """Plan the change in ``source`` for the current finding; kept for :meth:`approve`.

        Raises
        ------
        GateError, FixRefused
            Nothing is recorded and the previous plan is dropped.
        """
        from .fix import plan_fix

        self.plan = None
        self.plan = plan_fix(self.session, source, allow_architecture=allow_architecture,
                             data_consent=data_consent)
        self.changed()
        return self.plan

    def approve(self, plan: dict | None = None) -> dict:
        """Record the plan (default: the last one :meth:`plan_fix` made) as approved."""
        plan = plan or self.plan
        if plan is None:
            raise GateError("fix refused: no plan to approve; put the changed code in a %%fix "
                            "cell first")
        try:
            self.session.record_fix(plan, approved=True)
        finally:
            self.changed()
        self.plan = None
        return plan

    def verify(self, seeds: int = 3, progress=None, quiet: bool = True) -> dict:
        """Rerun the reproduced code and the approved fix over ``seeds`` seeds; record the verdict."""
        from .verify import seeds_for

        chosen = seeds_for(self.session, seeds)
        n = sum(1 for e in self.session.events if e["kind"] == "verify") + 1
        folder = os.path.join(self.session.directory, "verify", str(n))
        total = 2 * len(chosen)

        def done(_t: float) -> tuple[float, str]:
            runs = sum(f.endswith(".jsonl") for f in os.listdir(folder)) \
                if os.path.isdir(folder) else 0
            return runs / total, f"verify: run {runs} of {total}"

        out = io.StringIO()
        try:
            with contextlib.ExitStack() as stack:
                if progress is not None:
                    stack.enter_context(progress.track(done))
                if quiet:
                    stack.enter_context(contextlib.redirect_stdout(out))
                return self.artifact.verify(chosen)
        finally:
            self.changed()

    def export(self, path: str) -> str:
        """Write the record notebook of this session to ``path``."""
        try:
            from .export import export_notebook
        except ImportError as exc:
            raise RuntimeError("exporting needs model_debugger.export (not available in this "
                               f"installation: {exc})") from None
        result = export_notebook(self.session, path)
        return result if isinstance(result, str) else path

    def close(self) -> None:
        """Close the widgets and drop the observers (the saved session stays on disk)."""
        self._observers.clear()
        for widget in self._widgets.values():
            _close(widget)
        self._widgets.clear()


def _close(widget) -> None:
    for child in getattr(widget, "children", ()):
        _close(child)
    close = getattr(widget, "close", None)
    if close:
        close()


def current_session() -> NotebookSession:
    """The kernel's notebook session (created on first use)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = NotebookSession()
    return _CURRENT


def reset_session() -> None:
    """Forget the kernel's session (``%unload_ext``); its files stay on disk."""
    global _CURRENT
    if _CURRENT is not None:
        _CURRENT.close()
    _CURRENT = None
