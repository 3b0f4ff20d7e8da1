"""Run a training script in a child process that streams its record to a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

STOP_SECONDS = 3.0  # after Ctrl-C, how long the child may take to close its record


@dataclass(frozen=True)
class ChildResult:
    """How the child process ended.

    ``returncode`` is negative (``-signal``) when a signal ended it; ``interrupted`` is True
    when this process was interrupted (Ctrl-C) and stopped the child.
    """

    returncode: int
    seconds: float
    timed_out: bool
    interrupted: bool = False


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C while a child ran: the child was stopped; ``result`` says how it ended."""

    def __init__(self, result: ChildResult) -> None:
        super().__init__("interrupted")
        self.result = result


def _stop(proc: subprocess.Popen) -> None:
    """Ask the child to close its record (SIGINT), then kill it after ``STOP_SECONDS``.

    A Ctrl-C at a terminal reaches the child too (one process group): it gets a moment to
    close its record before it is asked again.
    """
    try:
        try:
            proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=STOP_SECONDS)
    except BaseException:  # noqa: BLE001 - it did not stop in time, or Ctrl-C again
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def run_script(script: str, args: list[str], record: str, seed: int | None = None,
               max_seconds: float | None = None, stdout=None,
               isolate_seconds: float = 0.0, syspath: str | None = None,
               cwd: str | None = None, probes: str | None = None, intervention=None,
               max_steps: int | None = None, launch: dict | None = None) -> ChildResult:
    """Run ``script`` as ``__main__`` under capture; its record streams to ``record``.

    Parameters
    ----------
    script, args
        The training script and its arguments.
    record : str
        Path of the JSON-lines record the child writes as it goes.
    seed : int, optional
        Seeds Python, NumPy and torch in the child before the script runs.
    max_seconds : float, optional
        Stop the script after this long: SIGTERM (the record is closed as interrupted), then
        SIGKILL five seconds later (the record keeps every step written so far).
    stdout : file, optional
        Where the script's output goes (default: this process's stderr, keeping stdout clean).
    isolate_seconds : float
        When > 0, the child runs Isolate probes on the live objects after the script, for up to
        this long (``findings.json`` beside the record). The time limit covers the script only.
    syspath : str, optional
        The folder the script's imports resolve from (default: the script's own folder); used
        when a session's copy of a script runs in place of the original.
    cwd : str, optional
        The working directory of the child (default: this process's).
    probes : str, optional
        A probe request (JSON file, :class:`~model_debugger.artifacts.base.ProbeRequest`):
        which probes the child runs after the script, under which classification.
    intervention : Intervention, optional
        One change the child installs in the run (:mod:`model_debugger.interventions`).
    max_steps : int, optional
        The child stops the script after this many optimizer steps.
    launch : dict, optional
        A multi-process job: ``nproc_per_node`` (and ``nnodes``, ``node_rank``, ``master_addr``,
        ``master_port``) runs the script through ``torch.distributed.run``;
        ``collective_timeout`` bounds every process group's collectives (seconds).
    """
    cmd = [sys.executable, "-m", "model_debugger._child", "--record", record]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    if isolate_seconds > 0:
        cmd += ["--isolate", str(isolate_seconds)]
    if max_seconds is not None:
        cmd += ["--max-seconds", str(max_seconds)]
    if syspath:
        cmd += ["--syspath", syspath]
    if probes:
        cmd += ["--probes", probes]
    if intervention is not None:
        import json

        cmd += ["--intervention", json.dumps(intervention.to_json())]
    if max_steps is not None:
        cmd += ["--max-steps", str(int(max_steps))]
    if launch:
        import json

        cmd += ["--launch", json.dumps(launch)]
    cmd += [script, *args]
    if os.path.lexists(record):  # each run writes a fresh record: no stale one is read as this
        os.unlink(record)
    _clear_ranks(record)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    out = stdout or sys.stderr
    try:
        out.fileno()
    except (AttributeError, OSError, ValueError):  # a stream with no file (a test's capture)
        out = None  # the child writes to this process's own stderr
    proc = subprocess.Popen(cmd, stdout=out if out is not None else sys.__stderr__,
                            stderr=out if out is not None else sys.__stderr__,
                            env=env, cwd=cwd if cwd and os.path.isdir(cwd) else None)
    timed_out = False
    # the child stops the script itself at max_seconds; this is the backstop
    limit = None if max_seconds is None else max_seconds + isolate_seconds + 10 + (
        LAUNCH_SECONDS if launch and launch.get("nproc_per_node") else 0.0)
    try:
        _wait_child(proc, record, limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    except KeyboardInterrupt:
        _stop(proc)
        raise RunInterrupted(ChildResult(proc.returncode, time.perf_counter() - t0, timed_out,
                                         interrupted=True)) from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return ChildResult(proc.returncode, time.perf_counter() - t0, timed_out)


def _clear_ranks(record: str) -> None:
    """Remove an earlier run's process records and rank reports beside ``record``.

    Never read as this run's.
    """
    from .store import Store

    folder = Store.ranks_beside(record)
    if os.path.islink(folder):  # not ours to empty: never follow it
        return
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if name.endswith(".jsonl") or name.startswith(("findings", "probed")):  # records,
            # the ranks' reports, which rank probes
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


LAUNCH_SECONDS = 130.0  # a launched job: its ranks' start-up, their wait for rank 0's decision
# on which rank probes (_rank_probes), and the launcher's stop (_child)
SETUP_SECONDS = 120.0  # the most the child's own set-up may take before the script starts


def _wait_child(proc: subprocess.Popen, record: str, limit: float | None) -> None:
    """Wait for the child; ``limit`` counts from when its script starts (the record appears).

    The child's start-up (the interpreter, our imports) may take a while on a busy machine and
    is not the script's time; up to ``SETUP_SECONDS`` of it is allowed before ``limit`` starts.
    Raises ``subprocess.TimeoutExpired`` past the limit.
    """
    if limit is None:
        proc.wait()
        return
    started = time.time()
    deadline = time.monotonic() + SETUP_SECONDS
    while time.monotonic() < deadline:
        try:
            if os.stat(record).st_mtime >= started - 1:  # this run's record, not an old one
                break
        except OSError:
            pass
        try:
            proc.wait(timeout=0.05)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait(timeout=limit)
