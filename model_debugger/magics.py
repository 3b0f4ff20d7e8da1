"""IPython magics: parse arguments, call the kernel's session, display. Nothing else.

``%load_ext model_debugger`` registers one :class:`DebuggerMagics` instance on the shell; it owns
the kernel's :class:`~model_debugger.notebook.NotebookSession` (the session, its artifact and its
widgets). ``%unload_ext model_debugger`` removes every magic and drops it.

- ``%%reproduce [--runs N] [--seed S]``: run the cell under capture (live loss curves), record
  Reproduce and Classify; earlier cells it depends on are kept with it in ``artifact.py``.
- ``%classify``: the classification Reproduce recorded, with its numbers.
- ``%isolate [--probe ID ...] [--budget SECONDS]``: probes on the live objects; the findings.
- ``%%evidence``: run a cell and attach its outputs and ``name=value`` numbers to the current
  hypothesis (evidence never confirms a finding; only Isolate's measurements do).
- ``%%fix [--yes] [--allow-architecture] [--data-consent]``: the cell holds the changed code; the
  plan is shown with an Approve button (``--yes`` approves).
- ``%verify [--seeds K]``, ``%md_status``, ``%md_export PATH``.
- ``%md_open SESSION``: a saved session (a terminal's diagnosis, another notebook's) shown
  and continued in this kernel.
"""

from __future__ import annotations

import contextlib
import io

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ._deps import earlier_cells
from ._validate import arg, check_budget, check_count, check_probe_ids, check_seed
from .notebook import EVIDENCE_TEXT_LIMIT
from .session import GateError


def _views():
    from .widgets import views

    return views


def _numbers(text: str) -> dict[str, float]:
    from .capture.metrics import parse_metric_line

    found: dict[str, float] = {}
    for line in text.splitlines():
        found.update(parse_metric_line(line)[1])
    return found


@magics_class
class DebuggerMagics(Magics):
    """The model_debugger magics (one instance per shell).

    Parameters
    ----------
    shell : InteractiveShell
        Where the magics run; its ``user_ns`` is where cells are reproduced.
    root : str, optional
        Where sessions are saved (default ``.model_debugger`` in the current directory).

    Attributes
    ----------
    kernel : NotebookSession
        The kernel's investigation (None once unloaded).
    """

    def __init__(self, shell=None, root: str | None = None, **kwargs) -> None:
        from .notebook import NotebookSession

        super().__init__(shell, **kwargs)
        self.kernel = NotebookSession(shell.user_ns if shell is not None else None, root)

    @magic_arguments()
    @argument("--runs", type=arg(check_count, "--runs"), default=1,
              help="how many times to run the cell (1..100)")
    @argument("--seed", type=arg(check_seed, "--seed"), default=None,
              help="seed of run i is SEED + i (0 <= SEED < 2**32)")
    @line_cell_magic
    def reproduce(self, line: str, cell: str | None = None) -> None:
        """Run the cell under capture; record Reproduce and Classify."""
        from . import phases
        from ._deps import prelude
        from .artifacts import CellArtifact

        args = _parse(self.reproduce, line, cell)
        if args is None:
            return
        _usage(check_seed, args.seed, "--seed", args.runs)
        _usage(_compiles, cell)
        ns, views = self.kernel, _views()
        history = earlier_cells(self.shell.user_ns.get("In", []), cell)
        session = ns.new_session()  # a second reproduction is a new investigation
        artifact = ns.keep(CellArtifact(self.shell.user_ns, cell, prelude(history, cell)))
        display(ns.curves)
        runs = f"{args.runs} runs" if args.runs > 1 else "1 run"
        ns.tell("reproduce", None, f"training the cell under capture ({runs})")
        try:
            with ns.curves.follow(ns.run_records(args.runs), on_update=lambda run: ns.tell(
                    "reproduce", None, f"training: {len(run.steps)} steps ({runs})")):
                verdict = phases.reproduce(session, artifact, runs=args.runs, seed=args.seed)
        finally:
            ns.idle()
        ns.show_run()
        display(views.reproduce(verdict, root=session.directory))
        if verdict.status == "interrupted":
            display(views.message("interrupted: the partial record was kept", "warning"))
        display(views.classification(session.report()))
        display(ns.gradients)
        display(ns.new_tracker())

    @magic_arguments()
    @line_magic
    def classify(self, line: str = "") -> None:
        """Show the classification Reproduce recorded (nothing is re-classified)."""
        if _parse(self.classify, line) is None:
            return
        display(_views().classification(self.kernel.report()))

    @magic_arguments()
    @argument("--probe", nargs="+", action="extend", default=None, metavar="ID",
              help="probe ids to run (default: those for the categories)")
    @argument("--budget", type=arg(check_budget, "--budget"), default=30.0,
              help="seconds for all probes (finite, >= 0)")
    @line_magic
    def isolate(self, line: str = "") -> None:
        """Run probes on the live objects of the reproduction; show the findings.

        With ``--probe``, the probes' findings join the current ones (a confirmed finding
        stays in the queue); without, a new round of the categories' probes.
        """
        from . import phases

        args = _parse(self.isolate, line)
        if args is None:
            return
        args.probe = _usage(check_probe_ids, args.probe)
        ns, views = self.kernel, _views()
        progress = ns.progress("isolate", "Isolate")
        display(progress)
        try:
            with progress, progress.track(lambda t: _probe_clock(t, args.budget)):
                found = phases.isolate(ns.session, ns.artifact, ids=args.probe,
                                       budget=args.budget)
        except (GateError, ValueError, KeyError) as exc:
            display(views.message(str(exc).strip("'\""), "error"))
            return
        display(views.findings(found, ns.session.directory))

    @magic_arguments()
    @line_cell_magic
    def evidence(self, line: str, cell: str | None = None) -> None:
        """Run the cell; attach its outputs and numbers to the current hypothesis."""
        from IPython.utils.capture import capture_output

        if _parse(self.evidence, line, cell) is None:
            return
        ns, views = self.kernel, _views()
        with capture_output() as captured:
            result = self.shell.run_cell(cell, store_history=False)
        captured.show()
        text = captured.stdout + "".join(
            "\n" + o.data.get("text/plain", "") for o in captured.outputs)
        if not result.success:
            text += f"\n(the cell raised {type(result.error_in_exec).__name__})"
        numbers = _numbers(text)
        event = ns.session.record_evidence(cell, text[-EVIDENCE_TEXT_LIMIT:], numbers)
        target = event["hypothesis"] or "the classification (no finding yet)"
        listed = ", ".join(f"{k}={v:g}" for k, v in numbers.items()) or "no numbers"
        display(views.message(f"evidence attached to {target}: {listed} "
                              "(evidence informs; only Isolate's measurements confirm)"))

    @magic_arguments()
    @argument("--yes", action="store_true", help="approve the plan now")
    @argument("--allow-architecture", action="store_true",
              help="allow an architecture change for a hyperparameter or data cause")
    @argument("--data-consent", action="store_true", help="consent to change preprocessing")
    @line_cell_magic
    def fix(self, line: str, cell: str | None = None) -> None:
        """Plan the change the cell holds; approve with --yes or the Approve button."""
        from .phases import FixRefused, plan_fix

        args = _parse(self.fix, line, cell)
        if args is None:
            return
        ns, views = self.kernel, _views()
        try:
            plan = plan_fix(ns.session, cell, allow_architecture=args.allow_architecture,
                            data_consent=args.data_consent)
            if args.yes:
                ns.session.record_fix(plan, approved=True)
            else:
                ns.session.record_plan(plan)  # awaiting approval; survives a kernel restart
        except FixRefused as exc:
            display(views.refused(exc.reasons))
            return
        except GateError as exc:
            display(views.message(str(exc), "error"))
            return
        display(views.plan(plan, ns.session.directory))
        if args.yes:
            display(views.message(f"approved: the fix for {plan['finding']} is recorded; "
                                  "run %verify"))
        else:
            display(ns.new_tracker())

    @magic_arguments()
    @argument("--seeds", type=arg(check_count, "--seeds"), default=3,
              help="how many seeds to compare over (1..100)")
    @line_magic
    def verify(self, line: str = "") -> None:
        """Rerun before and after the approved fix across seeds; show the verdict."""
        from . import phases

        args = _parse(self.verify, line)
        if args is None:
            return
        ns, views = self.kernel, _views()
        progress = ns.progress("verify", "Verify")
        display(progress)
        try:
            with progress, contextlib.redirect_stdout(io.StringIO()):  # the runs' own prints
                verification = phases.verify(ns.session, ns.artifact, seeds=args.seeds,
                                             progress=progress.step)
        except GateError as exc:
            display(views.message(str(exc), "error"))
            return
        display(views.verification(verification))
        overlay = ns.verify_overlay()
        if overlay is not None:
            display(overlay)
        display(ns.new_tracker())

    @magic_arguments()
    @line_magic
    def md_status(self, line: str = "") -> None:
        """The session at a glance, with the phase tracker and the findings table."""
        if _parse(self.md_status, line) is None:
            return
        ns, views = self.kernel, _views()
        display(views.status(ns.report()))
        display(ns.new_tracker())
        display(ns.findings_table)

    @magic_arguments()
    @argument("path", nargs="?", default=None,
              help="where to write the record notebook (.ipynb); default: the session's folder")
    @line_magic
    def md_export(self, line: str) -> None:
        """Export the session as a record notebook (and ``repro.py`` beside it).

        Without a path both go into the session's own folder (``.model_debugger/<id>/``), which
        git and linters ignore.
        """
        args = _parse(self.md_export, line)
        if args is None:
            return
        ns, views = self.kernel, _views()
        if not ns.has_session:
            display(views.message("export failed: no session to export yet: run a %%reproduce "
                                  "cell first", "error"))
            return
        try:
            from .export import export_files

            out = export_files(ns.session, args.path, overwrite=True)
        except (RuntimeError, ValueError, OSError, GateError) as exc:
            display(views.message(f"export failed: {exc}", "error"))
            return
        replaced = "".join(f"; replaced {p}" for p in out["replaced"])
        display(views.message(f"exported the session record to {out['notebook']} "
                              f"(repro script {out['repro']}{replaced})"))


    @magic_arguments()
    @argument("session", help="the session's folder (or its session.json), e.g. one the CLI "
                              "wrote under .model_debugger/")
    @line_magic
    def md_open(self, line: str) -> None:
        """Open a saved session in this kernel: its runs, classification, findings and tracker.

        A diagnosis made in a terminal (``model-debugger diagnose``, a multi-rank job
        included) or in another notebook; the sidebar follows it. A script's session goes on
        here (``%isolate``, ``%%fix``, ``%verify`` re-run the script); a notebook cell's reruns
        only in the kernel that reproduced it.
        """
        from .session import DebugSession, SessionError

        args = _parse(self.md_open, line)
        if args is None:
            return
        ns, views = self.kernel, _views()
        try:
            session = DebugSession.load(args.session)
        except SessionError as exc:
            display(views.message(f"open failed: {exc}", "error"))
            return
        ns.use(session)
        ns.show_run()
        display(ns.curves)
        display(views.status(ns.report()))
        display(ns.gradients)
        display(ns.new_tracker())
        display(ns.findings_table)


def _probe_clock(elapsed: float, budget: float) -> tuple[float, str]:
    """Isolate's bar: the share of the budget spent, and words that stay true past it.

    No probe starts once the budget is spent, but the one that runs then finishes (and the
    findings are saved): the label says so instead of a time "of at most" a smaller budget.
    """
    if budget and elapsed <= budget:
        return elapsed / budget, f"probes: {elapsed:.0f} s of at most {budget:.0f} s"
    return 1.0, (f"probes: {elapsed:.0f} s; the {budget:.0f} s budget is spent, the probe "
                 "running now finishes, no other starts")


def _parse(magic, line: str, cell: str | None = "") -> object | None:
    """The magic's arguments; None when the user asked for help, which is shown instead.

    ``%name --help`` (or ``-h``) prints the magic's documentation and usage rather than
    IPython's UsageError; a cell magic used as a line magic (``%reproduce``, no cell) says how
    to use it.
    """
    from IPython.utils.process import arg_split

    name = magic.__name__
    if cell is None and not {"-h", "--help"} & set(arg_split(line)):
        print(f"%%{name} is a cell magic: put it on the first line of the cell it runs, with "
              f"its code below. %{name}? or %%{name} --help shows how.")
        return None
    if {"-h", "--help"} & set(arg_split(line)):
        print(magic.__doc__ or "")
        return None
    return parse_argstring(magic, line)


def _usage(check, *args):
    """Run a ``_validate`` check; its ValueError becomes the magic's one-line UsageError."""
    try:
        return check(*args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _compiles(cell: str) -> None:
    from ._validate import syntax_error

    problem = syntax_error(cell, "the cell")
    if problem:
        raise ValueError(problem)
    if not cell.strip():
        raise ValueError("the cell is empty: put the training code under %%reproduce")


def load(shell) -> DebuggerMagics:
    """Register the magics on ``shell``, and the sidebar's comm target when in a kernel.

    One instance of the magics owns the kernel's session.
    """
    from . import comm

    magics = shell.magics_manager.registry.get(DebuggerMagics.__name__)
    if not isinstance(magics, DebuggerMagics) or magics.kernel is None:
        magics = DebuggerMagics(shell)
        shell.register_magics(magics)
    comm.register(shell, magics.kernel)
    return magics


def unload(shell) -> None:
    """Remove every magic this module registered, and drop the kernel's session.

    The session's files stay on disk.
    """
    from . import comm

    manager = shell.magics_manager
    magics = manager.registry.pop(DebuggerMagics.__name__, None)
    for table in manager.magics.values():
        for name in [n for n, fn in table.items()
                     if isinstance(getattr(fn, "__self__", None), DebuggerMagics)]:
            del table[name]
    if isinstance(magics, DebuggerMagics) and magics.kernel is not None:
        comm.unregister(shell, magics.kernel)
        magics.kernel.close()
        magics.kernel = None
    configurables = getattr(shell, "configurables", None)
    if configurables is not None and magics in configurables:
        configurables.remove(magics)
