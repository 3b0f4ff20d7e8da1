"""Child process entry: run a script as ``__main__`` under capture, streaming its record.

``python -m model_debugger._child --record PATH [--seed S] [--max-seconds T] [--isolate B
[--probes REQUEST.json]] [--intervention JSON] [--max-steps N] [--launch JSON] -- SCRIPT
[ARGS...]``

Processes the script starts (``torch.multiprocessing.spawn``, a ``Process`` per rank) write
their own records into the ranks folder beside the record (:data:`RANKS_ENV`). With
``--launch`` the script runs through ``torch.distributed.run`` (the real launcher), each of its
ranks in a ``_child --rank-of FOLDER`` of its own; the probes run here, once every rank ended.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys

from ._validate import arg, check_budget, check_seconds, check_seed
from .artifacts.base import TimeLimit


def _check_steps(value, name: str) -> int:
    steps = int(value)
    if steps < 1:
        raise ValueError(f"{name} must be an optimizer step count >= 1, not {value!r}")
    return steps


def _interrupt(signum, frame):
    raise TimeLimit(f"stopped by signal {signum} (time limit)")


def main(argv: list[str] | None = None) -> int:
    """Run the script under capture (and the probes after it); the exit code of the script."""
    parser = argparse.ArgumentParser(prog="model_debugger._child")
    parser.add_argument("--record", help="the record (required unless --rank-of)")
    parser.add_argument("--seed", type=arg(check_seed, "--seed"))
    parser.add_argument("--max-seconds", type=arg(check_seconds, "--max-seconds"))
    parser.add_argument("--isolate", type=arg(check_budget, "--isolate"), default=0.0,
                        help="after the script, run Isolate probes for up to this many seconds")
    parser.add_argument("--probes", help="the probe request (JSON file): ids, classification")
    parser.add_argument("--intervention", help="one intervention to install (JSON)")
    parser.add_argument("--max-steps", type=arg(_check_steps, "--max-steps"),
                        help="stop after this many optimizer steps")
    parser.add_argument("--syspath", help="import path of the script (default: its folder)")
    parser.add_argument("--launch", help="run through torch.distributed.run (JSON: its options)")
    parser.add_argument("--rank-of", help="a rank of a launched job: the job's ranks folder")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if not ns.record and not ns.rank_of:
        parser.error("--record is required (or --rank-of, for a rank of a launched job)")
    signal.signal(signal.SIGTERM, _interrupt)
    script = os.path.abspath(ns.script)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    sys.argv = [script, *args]
    sys.path.insert(0, ns.syspath or os.path.dirname(script))
    if ns.seed is not None:
        from .artifacts.seeding import seed_everything

        seed_everything(ns.seed, lazily=True)
    intervention = None
    if ns.intervention:
        from .artifacts.base import Intervention

        intervention = Intervention.from_json(ns.intervention)

    from . import capture
    from .capture.recorder import RANKS_ENV, process_record
    from .interventions import installed

    launch = _launch_options(ns.launch)
    if launch.get("collective_timeout"):
        from .capture.torch_dist import TIMEOUT_ENV

        os.environ[TIMEOUT_ENV] = str(float(launch["collective_timeout"]))
    if ns.seed is not None or ns.intervention or ns.max_steps is not None or \
            (ns.isolate > 0 and not ns.rank_of):
        import time
        from functools import partial

        from ._rank_probes import probe_process
        from .capture.recorder import set_rank_context
        from .interventions import process_context

        # what the processes the script starts run in, and (the rank the job's records name)
        # the probes after it, before this run's time limit ends (inside the script's time)
        deadline = time.time() + ns.max_seconds if ns.max_seconds else None
        after = partial(probe_process, ns.isolate, ns.probes, os.path.abspath(ns.script),
                        deadline) if ns.isolate > 0 and not ns.rank_of else None
        set_rank_context(partial(process_context, ns.seed, ns.intervention, ns.max_steps),
                         after)
    if ns.rank_of:  # one rank of a launched job: its record among the job's; the named rank
        ns.record = process_record(ns.rank_of)  # probes its live objects (the parent merges)
    else:
        os.environ[RANKS_ENV] = _ranks_folder(ns.record)
    code = 0
    from ._rank_probes import RANK_WAIT  # a launched rank may wait for rank 0's decision

    rec = capture(ns.record)
    if ns.max_seconds:
        signal.signal(signal.SIGALRM, _interrupt)
    try:
        with rec, installed(intervention, ns.max_steps):
            try:
                if ns.max_seconds:  # the limit counts the script, not our set-up (launched:
                    # each rank's own, from its script's start; this is the backstop)
                    signal.setitimer(signal.ITIMER_REAL, ns.max_seconds + (
                        LAUNCH_SETUP + 3 * RANK_WAIT + ns.isolate
                        if launch.get("nproc_per_node") else 0.0))
                if launch.get("nproc_per_node"):
                    _launch(launch, ns, script, args)
                else:
                    runpy.run_path(script, run_name="__main__")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt as exc:
        from .artifacts.base import PlannedStop

        code = 130
        if not isinstance(exc, PlannedStop):  # Ctrl-C: the user stopped it, no probes after
            ns.isolate = 0
    except BaseException as exc:  # noqa: BLE001 - the record holds the error; report it, fail
        import traceback

        traceback.print_exc()
        code = 1
        if isinstance(exc, SyntaxError) and rec.error is not None and exc.filename:
            rec.error["location"] = {"file": exc.filename, "line": exc.lineno}
            rec.emit("error_location", **rec.error["location"])
    if ns.isolate > 0:
        _probe(rec, ns, script)
    return code


def _ranks_folder(record: str, create: bool = False) -> str:
    """The folder where the job's processes write their records (private, made when needed)."""
    from .store import Store

    folder = Store.ranks_beside(os.path.abspath(record))
    if create:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


LAUNCH_OPTIONS = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port")
STOP_SECONDS = 35.0  # after a stop, how long the launcher may take to stop its ranks (it
# gives them 30 s after its SIGTERM before it kills them)
LAUNCH_SETUP = 60.0  # the launcher's and its ranks' start-up, not counted in --max-seconds


def launcher_command(launch: dict, ranks: str, script: str, args: list[str],
                     passed: list[str]) -> list[str]:
    """The ``torch.distributed.run`` command line that runs each rank in a ``_child``.

    One node without a master address is ``--standalone`` (a free port of its own); several
    nodes meet at ``master_addr:master_port`` (static rendezvous, ``node_rank`` each).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    nnodes = int(launch.get("nnodes") or 1)
    cmd += [f"--nproc-per-node={int(launch['nproc_per_node'])}", f"--nnodes={nnodes}"]
    if nnodes == 1 and not launch.get("master_addr"):
        cmd.append("--standalone")
    else:
        cmd += [f"--node-rank={int(launch.get('node_rank') or 0)}",
                f"--master-addr={launch.get('master_addr') or '127.0.0.1'}",
                f"--master-port={int(launch.get('master_port') or 29500)}"]
    return [*cmd, "-m", "model_debugger._child", "--rank-of", ranks, *passed, script, *args]


def _launch_options(text: str | None) -> dict:
    """``--launch``: the launcher's options (:data:`LAUNCH_OPTIONS`, ``collective_timeout``)."""
    if not text:
        return {}
    import json

    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"--launch must be a JSON object, not {text[:80]!r}")
    return data


def _launch(launch: dict, ns, script: str, args: list[str]) -> None:
    """Run the script through the launcher; its exit code ends this process the same way."""
    import subprocess

    passed = []
    for flag, value in (("--seed", ns.seed), ("--intervention", ns.intervention),
                        ("--max-steps", ns.max_steps), ("--syspath", ns.syspath),
                        ("--max-seconds", ns.max_seconds), ("--probes", ns.probes),
                        ("--isolate", ns.isolate or None)):
        if value is not None:
            passed += [flag, str(value)]
    cmd = launcher_command(launch, _ranks_folder(ns.record, create=True), script, args, passed)
    proc = subprocess.Popen(cmd)
    try:
        code = proc.wait()
    except BaseException:  # a time limit or Ctrl-C: the launcher stops its ranks (SIGTERM)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_SECONDS)
        except BaseException:  # noqa: BLE001 - it did not stop in time
            proc.kill()
            proc.wait()
        raise
    if code:
        raise SystemExit(code)


def _probe(rec, ns, script: str) -> None:
    """Run the requested probes on the live objects the capture kept.

    The findings go next to the record (``findings.json``).
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if ns.rank_of:
        _probe_rank(rec, ns, script)
        return
    try:
        import json

        from .artifacts.base import ProbeRequest
        from .phases.isolate import probe_run
        from .probing import user_sources, write_findings
        from .ranks import load_job, nodes_wait
        from .store import Store

        request = ProbeRequest(ns.isolate)
        if ns.probes:
            with open(ns.probes, encoding="utf-8") as fh:
                request = ProbeRequest.from_json({**json.load(fh), "budget": ns.isolate})
        run = load_job(ns.record, wait=nodes_wait(_launch_options(ns.launch)))  # every step,
        # and the ranks' records (a job on several nodes: theirs too, once they end)
        report = probe_run(run, rec.keeper, user_sources(run, [script]), request)
        if run.ranks:  # the named rank's probes on its live objects, merged
            report = _with_rank(report, run, Store.ranks_beside(ns.record))
        write_findings(Store.findings_beside(ns.record), report)
    except Exception:  # noqa: BLE001 - Isolate failing must not hide the reproduction
        import traceback

        print("model_debugger: Isolate failed in the child:", file=sys.stderr)
        traceback.print_exc()


def _probe_rank(rec, ns, script: str) -> None:
    """One rank of a launched job: its probes, when the job's records name it (else none)."""
    try:
        from ._rank_probes import probes_here, run_probes

        info = next((e for e in reversed(rec.events) if e.get("t") == "rank"), None)
        if info is not None and probes_here(ns.record, info):
            run_probes(ns.record, rec.keeper, info["rank"], ns.isolate, ns.probes, script)
    except Exception:  # noqa: BLE001 - the rank's training is done; say so, do not fail it
        import traceback

        print("model_debugger: a rank's probes failed:", file=sys.stderr)
        traceback.print_exc()


def _with_rank(report, run, folder: str):
    """The job's report with one rank's findings (probes on its live objects) merged in.

    The rank rank 0 named (its decision in the ranks ``folder``, else the one the job's records
    name: :func:`~model_debugger.ranks.probed`) left its report there; when it left none,
    rank 0's is read. That rank probed under its own record's classification: only its findings for a
    category the job was classified with are kept, each with its ``rank``. A check both ran
    keeps the rank's finding: it measured on live objects where the job had only the records
    (the checks that compare ranks run on the job alone).
    """
    from dataclasses import replace

    from ._rank_probes import DECISION, read_decision
    from .classify import classify
    from .probes import SHARED, rank
    from .probing import read_report
    from .ranks import probed
    from .records import Finding
    from .signals import compute
    from .store import Store

    which = read_decision(os.path.join(folder, DECISION))  # rank 0's decision
    if which is None:
        which = probed(run.ranks)
    zero = read_report(Store.rank_findings(folder, which))
    if zero is None and which != 0:
        which, zero = 0, read_report(Store.rank_findings(folder, 0))
    if zero is None:
        return report
    cls = classify(compute(run))
    cats = [cls.primary, *cls.secondary]
    extra = [Finding(f.check, f.root_cause, f.confirmed, f.explanation, f.location,
                     {**f.evidence, "rank": which}) for f in zero.findings
             if f.evidence.get("category") in cats]
    live = {f.check for f in extra}
    kept = [f for f in report.findings if f.check not in live]
    seconds = {**{f"{k}@rank{which}": v for k, v in zero.probe_seconds.items()},
               **report.probe_seconds}
    shared = {name: getattr(zero, name) for name in SHARED
              if getattr(report, name) is None and getattr(zero, name) is not None}
    return replace(report, findings=tuple(rank([*kept, *extra], cats)),
                   probe_seconds=seconds, **shared)


if __name__ == "__main__":
    sys.exit(main())
