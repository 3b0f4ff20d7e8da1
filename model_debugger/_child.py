"""Child process entry: run a script as ``__main__`` under capture, streaming its record.

``python -m model_debugger._child --record PATH [--seed S] [--max-seconds T] [--isolate B
[--probes REQUEST.json]] [--intervention JSON] [--max-steps N] -- SCRIPT [ARGS...]``
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
    parser.add_argument("--record", required=True)
    parser.add_argument("--seed", type=arg(check_seed, "--seed"))
    parser.add_argument("--max-seconds", type=arg(check_seconds, "--max-seconds"))
    parser.add_argument("--isolate", type=arg(check_budget, "--isolate"), default=0.0,
                        help="after the script, run Isolate probes for up to this many seconds")
    parser.add_argument("--probes", help="the probe request (JSON file): ids, classification")
    parser.add_argument("--intervention", help="one intervention to install (JSON)")
    parser.add_argument("--max-steps", type=arg(_check_steps, "--max-steps"),
                        help="stop after this many optimizer steps")
    parser.add_argument("--syspath", help="import path of the script (default: its folder)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
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
    from .interventions import installed

    code = 0
    rec = capture(ns.record)
    if ns.max_seconds:
        signal.signal(signal.SIGALRM, _interrupt)
    try:
        with rec, installed(intervention, ns.max_steps):
            try:
                if ns.max_seconds:  # the limit counts the script, not our set-up
                    signal.setitimer(signal.ITIMER_REAL, ns.max_seconds)
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


def _probe(rec, ns, script: str) -> None:
    """Run the requested probes on the live objects the capture kept.

    The findings go next to the record (``findings.json``).
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import json

        from .artifacts.base import ProbeRequest
        from .phases.isolate import probe_run
        from .probing import user_sources, write_findings
        from .records import Run
        from .store import Store

        request = ProbeRequest(ns.isolate)
        if ns.probes:
            with open(ns.probes, encoding="utf-8") as fh:
                request = ProbeRequest.from_json({**json.load(fh), "budget": ns.isolate})
        run = Run.load(ns.record)  # the stream holds every step; rec.events does not
        report = probe_run(run, rec.keeper, user_sources(run, [script]), request)
        write_findings(Store.findings_beside(ns.record), report)
    except Exception:  # noqa: BLE001 - Isolate failing must not hide the reproduction
        import traceback

        print("model_debugger: Isolate failed in the child:", file=sys.stderr)
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
