"""A script artifact: each run is a child process that runs the script as ``__main__``."""

from __future__ import annotations

import json
import os
from contextlib import AbstractContextManager, nullcontext

from ..ranks import load_job, nodes_wait
from ..records import Run
from ..redact import read_source
from .base import Captured, Intervention, ProbeRequest, Version

REQUEST = "probes.json"  # beside the record: what the child is asked to probe


class ScriptArtifact:
    """A training script and how it is run.

    Parameters
    ----------
    script : str
        The script (made absolute).
    args : sequence of str
        Its command-line arguments.
    max_seconds : float, optional
        Each run is stopped after this long (the record so far is kept).
    cwd : str, optional
        The working directory of the runs (default: this process's).
    launch : dict, optional
        A multi-process job (see :func:`model_debugger.runner.run_script`): through
        ``torch.distributed.run`` with ``nproc_per_node`` (and the nodes' options), and/or
        a ``collective_timeout`` in seconds. Processes the script starts itself are captured
        without it.
    """

    kind = "script"

    def __init__(self, script: str, args=(), max_seconds: float | None = None,
                 cwd: str | None = None, launch: dict | None = None) -> None:
        self.script = os.path.abspath(script)
        self.args = list(args)
        self.max_seconds = max_seconds
        self.cwd = cwd or os.getcwd()
        self.launch = dict(launch) if launch else None

    @classmethod
    def from_info(cls, info) -> ScriptArtifact:
        """The artifact a saved session recorded (:class:`~model_debugger.records.ArtifactInfo`)."""
        launch = info.extra.get("launch")
        return cls(info.script, info.args, info.max_seconds, info.cwd,
                   launch if isinstance(launch, dict) else None)

    def describe(self) -> tuple[dict, str, str]:
        """The artifact event's fields, the code (what Fix diffs against) and the script."""
        source = read_source(self.script)
        fields = {"type": "script", "script": self.script, "args": list(self.args),
                  "max_seconds": self.max_seconds, "cwd": self.cwd}
        if self.launch:
            fields["launch"] = dict(self.launch)
        return fields, source, source

    def _path_of(self, version: Version) -> str:
        """The file to run: the user's own while it holds the version's code, else the copy."""
        if version.label == "reproduced":
            return self.script
        if version.source and _same(version.source, version.copy):
            return version.source
        return version.copy

    def run(self, version: Version, seed: int | None, record: str, *,
            probes: ProbeRequest | None = None, intervention: Intervention | None = None,
            max_steps: int | None = None, stdout=None,
            max_seconds: float | None = None) -> Captured:
        """Run the script once in a child (see :func:`model_debugger.runner.run_script`).

        Probes requested run in the child on its live objects after the script; their findings
        come back through ``findings.json`` beside the record. A Ctrl-C stops the child and
        raises :class:`~model_debugger.runner.RunInterrupted` (its record is kept).
        """
        from ..interventions import check
        from ..runner import run_script
        from ..store import Store

        if intervention is not None:
            check(intervention)  # an unknown one is the caller's error, not the run's

        request = None
        if probes is not None:
            request = os.path.join(os.path.dirname(record), REQUEST)
            with open(request, "w", encoding="utf-8") as fh:
                json.dump(probes.to_json(), fh)
        found = Store.findings_beside(record)
        if os.path.lexists(found):
            os.unlink(found)  # never read an older run's findings as this one's
        child = run_script(self._path_of(version), self.args, record, seed=seed,
                           max_seconds=max_seconds if max_seconds is not None
                           else self.max_seconds, stdout=stdout,
                           isolate_seconds=probes.budget if probes is not None else 0.0,
                           syspath=os.path.dirname(self.script), cwd=self.cwd,
                           probes=request, intervention=intervention, max_steps=max_steps,
                           launch=self.launch)
        run = load_job(record, wait=nodes_wait(self.launch))
        from ..probing import read_report

        return Captured(run, record, read_report(found), child=child,
                        sources=_sources(run, [self._path_of(version)]))

    def reusable(self, version: Version) -> Captured | None:
        """None: a child's live objects are gone when it ends."""
        return None

    def holding(self) -> AbstractContextManager:
        """A context that does nothing: each run is its own child process."""
        return nullcontext()


def _sources(run: Run, extra: list[str]) -> dict[str, str]:
    from ..probing import user_sources

    return user_sources(run, extra)


def _same(path: str, copy: str) -> bool:
    try:
        with open(path, encoding="utf-8") as a, open(copy, encoding="utf-8") as b:
            return a.read() == b.read()
    except (OSError, UnicodeDecodeError):
        return False
