"""Code run in this process (a notebook kernel): the cell artifact bound to one session.

:class:`KernelArtifact` is what a kernel keeps between magics: the session and the
:class:`~model_debugger.artifacts.cell.CellArtifact` of its last ``%%reproduce``. Each method is
one call of a phase (:mod:`model_debugger.phases`); nothing of the method is written here.
"""

from __future__ import annotations

from ._validate import check_budget, check_count, check_probe_ids, check_seed, check_seeds
from .artifacts.cell import CellArtifact, Snapshot, run_code
from .artifacts.seeding import seed_everything
from .session import DebugSession, GateError

__all__ = ["KernelArtifact", "Snapshot", "run_code", "seed_everything"]


class KernelArtifact:
    """Reproduce, Isolate and Verify code that runs in this process, for one session.

    Parameters
    ----------
    session : DebugSession
        The investigation this code belongs to.
    namespace : dict
        Where the code runs (a kernel's ``user_ns``).
    """

    def __init__(self, session: DebugSession, namespace: dict) -> None:
        self.session = session
        self.namespace = namespace
        self.cell: CellArtifact | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        return self.cell.snapshot if self.cell is not None else None

    @property
    def last_run(self):
        """The run whose live objects Isolate probes (None before a reproduction)."""
        live = self.cell.live if self.cell is not None else None
        return live.run if live is not None else None

    def reproduce(self, code: str, runs: int = 1, seed: int | None = None,
                  prelude: str = "") -> tuple[dict, BaseException | None]:
        """Run ``code`` ``runs`` times from the same starting state; record Reproduce/Classify.

        Returns
        -------
        tuple
            The Reproduce verdict (JSON) and the exception of the first run (None when it
            finished).
        """
        from .phases import reproduce

        runs = check_count(runs, "runs")
        seed = check_seed(seed, "seed", runs)
        self.cell = CellArtifact(self.namespace, code, prelude)
        verdict = reproduce(self.session, self.cell, runs=runs, seed=seed)
        errors = self.cell.errors
        return verdict.to_json(), (errors[0] if errors else None)

    def isolate(self, ids: list[str] | None = None, budget: float = 30.0):
        """Run probes on the live objects of the reproduction; record the findings."""
        from .phases import isolate

        budget, ids = check_budget(budget, "budget"), check_probe_ids(ids, "ids")
        if self.cell is None:
            raise ValueError("nothing reproduced in this kernel yet: run %%reproduce first")
        return isolate(self.session, self.cell, ids, budget)

    def verify(self, seeds: list[int], progress=None) -> dict:
        """Rerun the current code and the approved fix from the snapshot, over ``seeds``."""
        from .phases import verify

        seeds = check_seeds(seeds)
        if self.session.state.pending is None:
            self.session.require("verify")
        if self.cell is None:
            raise GateError("verify refused: nothing reproduced in this kernel (the starting "
                            "state is unknown)")
        return verify(self.session, self.cell, seeds, progress=progress).to_json()
