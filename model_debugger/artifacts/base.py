"""The Artifact protocol: what Reproduce, Isolate and Verify run, whatever the code lives in.

An artifact is the user's training code: a script (run in a child process,
:class:`~model_debugger.artifacts.script.ScriptArtifact`) or a notebook cell (run in the kernel's
namespace from a snapshot, :class:`~model_debugger.artifacts.cell.CellArtifact`). Every phase calls
:meth:`Artifact.run` with a :class:`Version` of the code (the reproduced code, the current one, or
the approved fix), a seed and where the record goes; it may ask for probes on the live objects
(:class:`ProbeRequest`), one :class:`Intervention` installed in the run, and a step budget.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..records import Classification, Intervention, Run


class PlannedStop(KeyboardInterrupt):
    """A run stopped on purpose (its time limit, its step budget): not a crash.

    A KeyboardInterrupt, so that the user's ``except Exception`` does not swallow it.
    """


class TimeLimit(PlannedStop):
    """The run was stopped at its time limit."""


class StepBudget(PlannedStop):
    """The run was stopped after its step budget (optimizer steps)."""




@dataclass(frozen=True)
class Version:
    """One version of the artifact's code.

    Attributes
    ----------
    label : str
        ``"reproduced"`` (Reproduce: the user's code as it is), ``"current"`` (the reproduced
        code, or the last kept fix) or ``"fixed"`` (the approved fix awaiting Verify).
    copy : str
        The session's copy of this code (absolute path; redacted).
    source : str or None
        The user's own file of this code (a script, or a fix file), run in place when it still
        holds the same code as the copy (its ``__file__`` and neighbours stay right).
    """

    label: str
    copy: str
    source: str | None = None


@dataclass(frozen=True)
class ProbeRequest:
    """Probes to run on the live objects right after a run, where those objects live.

    ``classification`` is the one the session recorded (None: the run's own, when Reproduce
    probes its first run before all runs are classified).
    """

    budget: float
    ids: tuple[str, ...] | None = None
    classification: Classification | None = None

    def to_json(self) -> dict:
        """The request as JSON (how a script's child process receives it)."""
        return {"budget": self.budget, "ids": list(self.ids) if self.ids is not None else None,
                "classification": self.classification.to_json() if self.classification
                else None}

    @classmethod
    def from_json(cls, data: dict) -> ProbeRequest:
        """The request from :meth:`to_json`'s output."""
        cls_json = data.get("classification")
        return cls(float(data["budget"]), tuple(data["ids"]) if data.get("ids") is not None
                   else None, Classification.from_json(cls_json) if cls_json else None)


@dataclass
class Captured:
    """What one run of an artifact left.

    Attributes
    ----------
    run : Run
        The record, as read back.
    record : str
        Where it was written.
    report : ProbeReport or None
        What the probes that ran on the live objects found (None: no probes ran there).
    error : BaseException or None
        The exception that ended a cell's code (a script's error is in the record).
    child : object or None
        How a script's child process ended (:class:`~model_debugger.runner.ChildResult`).
    keeper : object or None
        The live objects of a run in this process (a cell): model, batches, initial weights.
    sources : dict
        ``{file: code}`` of the code that ran (for lint and locations).
    """

    run: Run
    record: str
    report: Any = None
    error: BaseException | None = None
    child: Any = None
    keeper: Any = None
    sources: dict = field(default_factory=dict)


class Artifact(Protocol):
    """What the phases run. Two implementations: a script and a notebook cell."""

    kind: str

    def describe(self) -> tuple[dict, str, str]:
        """What the session records of this artifact.

        Returns
        -------
        tuple of (dict, str, str)
            The artifact event's fields (``type``, ``script``, ``args``, ...), the reproduced
            code (what Fix diffs against) and the stand-alone script kept as ``artifact.py``.
        """

    def run(self, version: Version, seed: int | None, record: str, *,
            probes: ProbeRequest | None = None, intervention: Intervention | None = None,
            max_steps: int | None = None, stdout=None) -> Captured:
        """Run ``version`` once with ``seed`` under capture, the record streaming to ``record``.

        Each run starts from the same initial state.
        """

    def reusable(self, version: Version) -> Captured | None:
        """A run of ``version`` whose live objects are still here to probe (None: run again)."""

    def holding(self) -> AbstractContextManager:
        """Around a batch of runs (Isolate, Verify): whatever the runs change is put back."""


class Unrunnable:
    """An artifact that cannot be run: a log (minimal reproducer), or a cell outside its kernel."""

    def __init__(self, kind: str, why: str) -> None:
        self.kind = kind
        self.why = why

    def describe(self) -> tuple[dict, str, str]:  # pragma: no cover - never reproduced
        """Never called: an unrunnable artifact is not reproduced."""
        raise NotImplementedError

    def run(self, *args, **kwargs) -> Captured:
        """Refuse: raises :class:`~model_debugger.session.GateError` with the reason."""
        from ..session import GateError

        raise GateError(self.why)

    def reusable(self, version: Version) -> Captured | None:
        """None: nothing ran here."""
        return None

    def holding(self) -> AbstractContextManager:
        """A context that does nothing: no run changes anything."""
        return nullcontext()


class LogArtifact(Unrunnable):
    """A minimal reproducer: a loss/metrics log, read (never run); probes read its record."""

    def __init__(self, run: Run, path: str) -> None:
        super().__init__("log", "the session was reproduced from a log; there is no script to "
                                "rerun")
        self.captured = Captured(run, path)

    def reusable(self, version: Version) -> Captured | None:
        """The log's record, for the probes that read a record alone."""
        return self.captured
