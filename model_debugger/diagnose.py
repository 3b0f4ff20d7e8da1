"""Entry points for scripts and logs (what the CLI calls): a session, an artifact, the phases.

Each function only builds the session and the artifact and calls :mod:`model_debugger.phases`;
the method itself is written there, once.
"""

from __future__ import annotations

import os

from ._validate import check_run_args
from .artifacts import LogArtifact, ScriptArtifact, artifact_for
from .logs import load_log
from .phases import Interrupted, isolate, reproduce, verify
from .session import DebugSession
from .store import ROOT

DEFAULT_SEED = 0  # a script diagnosed without --seed: one fixed draw, the same on every diagnosis

__all__ = ["DEFAULT_SEED", "Interrupted", "diagnose_log", "diagnose_script", "isolate_session",
           "verify_script"]


def diagnose_script(script: str, args: list[str] | None = None, runs: int = 1,
                    seed: int | None = None, max_seconds: float | None = None,
                    root: str = ROOT, stdout=None, probe_seconds: float = 30.0,
                    intervene_seconds: float | None = None,
                    launch: dict | None = None) -> DebugSession:
    """Reproduce ``script`` ``runs`` times under capture, classify, isolate; save a session.

    Parameters
    ----------
    script : str
        The training script (run as ``__main__`` in a child process).
    args : list of str, optional
        Its command-line arguments.
    runs : int
        How many times to run it; run ``i`` uses seed ``seed + i`` when a seed is given.
    seed : int, optional
        Seed for Python, NumPy and the frameworks in the child. None: :data:`DEFAULT_SEED`,
        so that two diagnoses of an unseeded script see the same randomness and reach the
        same verdict, and the recorded command shows the problem again (a script that seeds
        itself keeps its own seeds: they are set after these).
    max_seconds : float, optional
        Stop each run after this long; what was recorded so far is classified.
    root : str
        Where sessions are saved.
    stdout : file, optional
        Where the script's own output goes (default: stderr).
    probe_seconds : float
        Budget for Isolate probes (0 skips Isolate).
    intervene_seconds : float or None
        Budget for confirming findings by intervention (re-runs with the suspected cause
        undone; 0: off). None: 60 s for a single-process run, off for a multi-rank job.
    launch : dict, optional
        A job through ``torch.distributed.run`` (``nproc_per_node``, ...) and/or a
        ``collective_timeout`` (see :class:`~model_debugger.artifacts.ScriptArtifact`).

    Returns
    -------
    DebugSession
        With Reproduce, Classify and (unless skipped) Isolate recorded.

    Raises
    ------
    Interrupted
        On Ctrl-C, after the partial session was saved.
    """
    runs, seed, max_seconds, probe_seconds = check_run_args(
        script, runs, DEFAULT_SEED if seed is None else seed, max_seconds, probe_seconds)
    script = os.path.abspath(script)
    session = DebugSession.create(root, title=os.path.basename(script))
    artifact = ScriptArtifact(script, args or [], max_seconds, launch=launch)
    reproduce(session, artifact, runs=runs, seed=seed, probe_budget=probe_seconds, stdout=stdout,
              intervene_seconds=intervene_seconds)
    return session


def isolate_session(session: DebugSession, probe_seconds: float = 30.0,
                    stdout=None, intervene_seconds: float | None = None) -> DebugSession:
    """Isolate again on the session's current code (after a partially resolved fix)."""
    isolate(session, artifact_for(session), budget=probe_seconds, stdout=stdout,
            intervene_seconds=intervene_seconds)
    return session


def verify_script(session: DebugSession, seeds: list[int] | None = None,
                  max_seconds: float | None = None, stdout=None) -> dict:
    """Verify a pending fix of a script session: child runs of the current and the fixed code."""
    return verify(session, artifact_for(session), seeds=seeds, max_seconds=max_seconds,
                  stdout=stdout).to_json()


def diagnose_log(path: str, error: str | None = None, root: str = ROOT) -> DebugSession:
    """Classify from a minimal reproducer (a loss/metrics log plus optional error text)."""
    from ._repro import copy_log
    from .phases.reproduce import read_log
    from .records import ArtifactInfo

    run = load_log(path, error)
    session = DebugSession.create(root, title=os.path.basename(path))
    session.record_artifact(ArtifactInfo("log", copy=copy_log(path, session.directory)),
                            path=os.path.abspath(path), error=error)
    read_log(session, run, path)
    if session.state.classification is not None:
        isolate(session, LogArtifact(run, path), budget=10.0)
    return session
