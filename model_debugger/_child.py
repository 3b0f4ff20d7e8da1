"""Child process entry: run a script as ``__main__`` under capture, streaming its record.

``python -m model_debugger._child --record PATH [--seed S] -- SCRIPT [ARGS...]``
"""

from __future__ import annotations

import argparse
import os
import random
import runpy
import signal
import sys

from ._validate import arg, check_budget, check_seconds, check_seed


class TimeLimit(KeyboardInterrupt):
    """The script was stopped at its time limit (a planned stop, not a crash)."""


def _interrupt(signum, frame):
    raise TimeLimit(f"stopped by signal {signum} (time limit)")


def _seed_keras(keras, seed: int) -> None:
    try:
        keras.utils.set_random_seed(seed)  # Python, NumPy and the backend (TensorFlow)
    except Exception as exc:  # noqa: BLE001 - seeding must never break the user's import
        print(f"model_debugger: could not seed keras: {exc}", file=sys.stderr)


def _seed_everything(seed: int) -> None:
    from .capture.imports import when_imported

    random.seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    when_imported("numpy", lambda np: np.random.seed(seed))
    when_imported("torch", lambda torch: torch.manual_seed(seed))
    when_imported("keras", lambda keras: _seed_keras(keras, seed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="model_debugger._child")
    parser.add_argument("--record", required=True)
    parser.add_argument("--seed", type=arg(check_seed, "--seed"))
    parser.add_argument("--max-seconds", type=arg(check_seconds, "--max-seconds"))
    parser.add_argument("--isolate", type=arg(check_budget, "--isolate"), default=0.0,
                        help="after the script, run Isolate probes for up to this many seconds")
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
        _seed_everything(ns.seed)

    from . import capture

    code = 0
    rec = capture(ns.record)
    if ns.max_seconds:
        signal.signal(signal.SIGALRM, _interrupt)
    try:
        with rec:
            try:
                if ns.max_seconds:  # the limit counts the script, not our set-up
                    signal.setitimer(signal.ITIMER_REAL, ns.max_seconds)
                runpy.run_path(script, run_name="__main__")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt as exc:
        code = 130
        if not isinstance(exc, TimeLimit):  # Ctrl-C: the user stopped it, no probes after
            ns.isolate = 0
    except BaseException as exc:  # noqa: BLE001 - the record holds the error; report it, fail
        import traceback

        traceback.print_exc()
        code = 1
        if isinstance(exc, SyntaxError) and rec.error is not None and exc.filename:
            rec.error["location"] = {"file": exc.filename, "line": exc.lineno}
            rec.emit("error_location", **rec.error["location"])
    if ns.isolate > 0:
        _isolate(rec, ns.record, ns.isolate, script)
    return code


def _isolate(rec, record: str, budget: float, script: str) -> None:
    """Run Isolate on the live objects the capture kept; findings go next to the record."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        from .isolate import build_context, isolate, user_sources, write_findings
        from .records import Run

        run = Run.load(record)  # the stream holds every step; rec.events does not
        ctx = build_context(run, rec.keeper, user_sources(run, [script]), budget)
        findings = isolate(ctx)
        write_findings(os.path.join(os.path.dirname(record), "findings.json"), findings,
                       ctx.extras)
    except Exception:  # noqa: BLE001 - Isolate failing must not hide the reproduction
        import traceback

        print("model_debugger: Isolate failed in the child:", file=sys.stderr)
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
