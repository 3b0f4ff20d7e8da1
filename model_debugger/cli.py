"""Command line: ``model-debugger diagnose|verify|report``.

``diagnose SCRIPT [--json] [--runs N] [--seed S] [-- ARGS]`` reproduces, classifies and isolates;
``verify SESSION_DIR --fixed FIXED [--yes] [--json]`` plans, approves and verifies one fix;
``isolate SESSION_DIR`` probes the current code again (after a partial fix);
``export SESSION_DIR [-o NOTEBOOK]`` writes the record notebook and ``repro.py``.
Everything after ``--`` is passed to the training script.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from ._validate import (
    arg,
    check_budget,
    check_count,
    check_path,
    check_script,
    check_seconds,
    check_seed,
)
from .phases.confirm import DEFAULT_SECONDS as INTERVENE_SECONDS
from .session import SessionError
from .store import ROOT


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (and exits 2, as argparse does)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="model-debugger",
        description="Evidence-first diagnosis of ML training problems.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser(
        "diagnose", help="reproduce a training script (or read a log) and classify the problem",
        description="Run SCRIPT under instrumentation and classify what went wrong. SCRIPT may "
                    "also be a loss/metrics log (.csv, .jsonl, .json, TensorBoard events) when "
                    "nothing can be run.")
    d.add_argument("script", help="training script, or a log file for a minimal reproducer")
    d.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    d.add_argument("--runs", type=arg(check_count, "--runs"), default=1,
                   help="run the artifact N times, 1..100 (default 1)")
    d.add_argument("--seed", type=arg(check_seed, "--seed"),
                   help="seed Python/NumPy/torch/Keras, 0 <= SEED < 2**32; run i uses "
                   "SEED+i (default 0: the same draw on every diagnosis; a script's own seeds "
                   "still win)")
    d.add_argument("--max-seconds", type=arg(check_seconds, "--max-seconds"),
                   help="stop each run after T seconds of the script (T > 0)")
    d.add_argument("--error", help="error text that came with a log (minimal reproducer)")
    d.add_argument("--probe-seconds", type=arg(check_budget, "--probe-seconds"), default=30.0,
                   help="time budget for Isolate probes (default 30; 0 skips Isolate)")
    d.add_argument("--intervene-seconds", type=arg(check_budget, "--intervene-seconds"),
                   default=None, help="time budget for confirming findings by "
                   "intervention: re-runs with the suspected cause undone (default "
                   f"{INTERVENE_SECONDS:g}, off for a multi-rank job; 0: off)")
    d.add_argument("--root", default=ROOT, type=arg(check_path, "--root"),
                   help="where sessions are saved")
    m = d.add_argument_group(
        "multi-process jobs", "Processes the script starts itself (torch.multiprocessing.spawn, "
        "multiprocessing.Process) are captured rank by rank without these. With "
        "--nproc-per-node the script runs through torch.distributed.run.")
    m.add_argument("--nproc-per-node", type=arg(lambda v, w: check_count(v, w, 1, 1024),
                                                "--nproc-per-node"),
                   help="launch N ranks per node through torch.distributed.run")
    m.add_argument("--nnodes", type=arg(lambda v, w: check_count(v, w, 1, 1024), "--nnodes"),
                   help="nodes of the job (default 1); every node writes under a shared --root")
    m.add_argument("--node-rank", type=arg(lambda v, w: check_count(v, w, 0, 1023),
                                           "--node-rank"), help="this node's rank (default 0)")
    m.add_argument("--master-addr", help="address of the node with rank 0 (several nodes)")
    m.add_argument("--master-port", type=arg(lambda v, w: check_count(v, w, 1, 65535),
                                             "--master-port"), help="its port (default 29500)")
    m.add_argument("--collective-timeout", type=arg(check_seconds, "--collective-timeout"),
                   help="end a collective that waits longer than T seconds (a rank that never "
                        "joins: a hang), in every process group the job makes")
    v = sub.add_parser(
        "verify", help="plan one fix for a session's confirmed finding, approve it, and verify it",
        description="Show the fix (FIXED against the reproduced script), ask for approval, then "
                    "rerun both across seeds from the same initial state and compare the signal "
                    "that defined the category.")
    v.add_argument("session", help="session folder (printed by diagnose)")
    v.add_argument("--fixed", required=True, help="the training script with one change")
    v.add_argument("--yes", action="store_true", help="approve the plan without asking")
    v.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    v.add_argument("--seeds", type=arg(check_count, "--seeds"), default=3,
                   help="seeds to compare over, 1..100 (default 3)")
    v.add_argument("--max-seconds", type=arg(check_seconds, "--max-seconds"),
                   help="stop each run after T seconds of the script (T > 0)")
    v.add_argument("--allow-architecture", action="store_true",
                   help="allow an architecture change for a hyperparameter/data cause (recorded)")
    v.add_argument("--data-consent", action="store_true",
                   help="consent to a change of data preprocessing (recorded)")
    i = sub.add_parser(
        "isolate", help="run Isolate again on a session's current code (after a partial fix)",
        description="Run the session's current artifact (the reproduced script, or the last "
                    "kept fix) once under capture and probe it; the findings replace the old.")
    i.add_argument("session", help="session folder")
    i.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    i.add_argument("--probe-seconds", type=arg(check_budget, "--probe-seconds"), default=30.0,
                   help="time budget for the probes (default 30)")
    i.add_argument("--intervene-seconds", type=arg(check_budget, "--intervene-seconds"),
                   default=None, help="time budget for confirming findings by "
                   f"intervention (default {INTERVENE_SECONDS:g}, off for a multi-rank job; "
                   "0: off)")
    e = sub.add_parser("export", help="write the session as a record notebook plus repro.py",
                       description="Write an nbformat v4 notebook recording every phase and a "
                                   "standalone repro.py (secrets redacted).")
    e.add_argument("session", help="session folder")
    e.add_argument("-o", "--output", help="notebook path (default: inside the session folder)")
    e.add_argument("--json", action="store_true", help="print the written paths as JSON")
    s = sub.add_parser("report", help="print the report of a saved session")
    s.add_argument("session", help="session folder")
    s.add_argument("--json", action="store_true")
    return parser


def _print_human(report: dict, out, isolated: bool | None = None) -> None:
    """The report as the CLI prints it, then the exact command of the next phase.

    The report is :func:`model_debugger.views.report` as text; the command is
    :func:`next_command`.
    """
    from . import views

    out.write(views.text(views.report(report, isolated)) + "\n")
    command = next_command(report)
    if command:
        out.write(f"Next: {command}\n")


def next_command(report: dict) -> str | None:
    """The command line that runs the session's next phase (None when there is none to type).

    Fix names the finding to fix and the flag its kind of change needs; Verify after an
    interrupted approval names the approved file; ``done`` exports the record.
    """
    folder = shlex.quote(str(report.get("session_dir") or "SESSION_DIR"))
    phase = report.get("phase")
    if phase == "fix":
        queue = report.get("queue") or []
        top = next((f for f in report.get("findings") or [] if f.get("check") in queue[:1]), {})
        flag = " --data-consent" if top.get("root_cause") == "data" else ""
        return (f"fix {top.get('check', 'the first finding')} in a copy of the script, then "
                f"model-debugger verify {folder} --fixed FIXED.py{flag}")
    if phase == "verify":
        fixed = (report.get("fix") or {}).get("fixed") or "FIXED.py"
        return f"model-debugger verify {folder} --fixed {shlex.quote(str(fixed))}"
    if phase == "isolate":
        return f"model-debugger isolate {folder}"
    if phase == "done":
        return f"model-debugger export {folder}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``model-debugger`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:  # everything after "--" belongs to the training script
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    ns = _parser().parse_args(argv)
    from .diagnose import diagnose_log, diagnose_script
    from .logs import is_log_file
    from .session import DebugSession

    try:
        if ns.command == "report":
            session = DebugSession.load(ns.session)
        elif ns.command == "isolate":
            from .diagnose import isolate_session

            session = isolate_session(DebugSession.load(ns.session), ns.probe_seconds,
                                      intervene_seconds=ns.intervene_seconds)
        elif ns.command == "export":
            from .export import export_files

            paths = export_files(DebugSession.load(ns.session), ns.output, overwrite=True)
            print(json.dumps(paths) if ns.json else
                  f"Notebook: {paths['notebook']}\nRepro script: {paths['repro']}"
                  + "".join(f"\nReplaced: {p}" for p in paths["replaced"]))
            return 0
        elif ns.command == "verify":
            session = _verify(ns)
            if session is None:
                return 3
        else:
            if ns.runs < 1:
                raise ValueError("--runs must be at least 1")
            if not os.path.exists(ns.script):
                raise ValueError(f"no such file: {ns.script}")
            if os.path.isdir(ns.script) and not is_log_file(ns.script):
                raise ValueError(f"{ns.script} is a folder, not a script or a log")
            args = script_args
            if is_log_file(ns.script):
                session = diagnose_log(ns.script, ns.error, root=ns.root)
            else:
                session = diagnose_script(ns.script, args, runs=ns.runs, seed=ns.seed,
                                          max_seconds=ns.max_seconds, root=ns.root,
                                          probe_seconds=ns.probe_seconds,
                                          intervene_seconds=ns.intervene_seconds,
                                          launch=_launch(ns))
    except (ValueError, SessionError, OSError) as exc:
        print(f"model-debugger: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: the child was stopped; one line, no traceback
        where = getattr(getattr(exc, "session", None), "directory", None)
        print("model-debugger: interrupted" + (
            f"; the partial session is saved: {where} (model-debugger report {where})"
            if where else ""), file=sys.stderr)
        return 130
    report = session.report()
    if ns.json:
        sys.stdout.write(json.dumps(report, default=str) + "\n")
    else:
        _print_human(report, sys.stdout, session.state.isolations > 0)
    return 0


def _launch(ns) -> dict | None:
    """The multi-process options of ``diagnose`` (None: none given)."""
    launch = {k: getattr(ns, k) for k in ("nproc_per_node", "nnodes", "node_rank",
                                          "master_addr", "master_port", "collective_timeout")
              if getattr(ns, k) is not None}
    nodes = {"nnodes", "node_rank", "master_addr", "master_port"} & set(launch)
    if nodes and "nproc_per_node" not in launch:
        raise ValueError(f"--{sorted(nodes)[0].replace('_', '-')} needs --nproc-per-node "
                         "(the job runs through torch.distributed.run)")
    if (launch.get("nnodes") or 1) > 1 and not launch.get("master_addr"):
        raise ValueError("--nnodes above 1 needs --master-addr (where the nodes meet)")
    return launch or None


def _verify(ns):
    """Plan, approve and verify: the session, or None when the plan is refused or not approved.

    Nothing is saved when it is None.
    """
    from .session import DebugSession

    if ns.seeds < 1:
        raise ValueError("--seeds must be at least 1")
    session = DebugSession.load(ns.session)
    with session.lock("verify"):  # a second verify is refused; state reloaded once held
        return _verify_locked(ns, session)


def _verify_locked(ns, session):
    from .artifacts import artifact_for
    from .phases import FixRefused, plan_fix, verify
    from .phases.verify import seeds_for
    from .session import GateError

    fixed = check_script(ns.fixed)  # missing, binary, not UTF-8, empty or a syntax error
    talk = sys.stderr if ns.json else sys.stdout
    info = session.state.artifact
    if info is None or info.type != "script":
        raise ValueError("this session was reproduced from a log: there is no script to rerun "
                         "(diagnose the training script to verify a fix)")
    pending = session.state.pending
    if pending is not None:  # an earlier verify was interrupted: finish it
        kept = session.store.read(pending.copy) if pending.copy else None
        if kept is None or kept.decode("utf-8", "surrogateescape") != fixed:
            raise ValueError("an approved fix is awaiting Verify and FIXED differs from it; "
                             f"rerun with --fixed {pending.fixed}")
        print(f"Resuming the verification of the approved fix for {pending.finding} ...",
              file=talk, flush=True)
        verify(session, artifact_for(session), seeds_for(session, ns.seeds),
               max_seconds=ns.max_seconds, stdout=sys.stderr)
        return session
    try:
        plan = plan_fix(session, fixed, fixed_path=os.path.abspath(ns.fixed),
                        allow_architecture=ns.allow_architecture, data_consent=ns.data_consent)
    except FixRefused as exc:
        print(f"model-debugger: {exc}", file=sys.stderr)
        if ns.json:
            sys.stdout.write(json.dumps({**session.report(), "refused": exc.reasons,
                                         "hunks": [h.to_json() for h in exc.hunks]}) + "\n")
        return None
    except GateError as exc:
        print(f"model-debugger: {exc}", file=sys.stderr)
        if ns.json:
            sys.stdout.write(json.dumps({**session.report(), "refused": [str(exc)]}) + "\n")
        return None
    _print_plan(plan, talk)
    approved = ns.yes or (sys.stdin.isatty() and
                          input("Approve this fix? [y/N] ").strip().lower() in ("y", "yes"))
    if not approved:
        print("model-debugger: fix not approved; nothing was recorded (use --yes to approve)",
              file=sys.stderr)
        if ns.json:
            sys.stdout.write(json.dumps({**session.report(), "refused": ["not approved"]}) + "\n")
        return None
    session.record_fix(plan, approved=True)
    seeds = seeds_for(session, ns.seeds)
    print(f"Verifying over seeds {seeds} ...", file=talk, flush=True)
    verify(session, artifact_for(session), seeds, max_seconds=ns.max_seconds, stdout=sys.stderr)
    return session


def _print_plan(plan, out) -> None:
    from . import views

    out.write(views.text(views.plan(plan)) + "\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
