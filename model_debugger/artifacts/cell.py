"""A notebook-cell artifact: code run in the kernel's namespace, each run from one snapshot.

Before the first run, :class:`Snapshot` records the state the code starts from: which names were
bound to what, the weights and optimizer state of every model/optimizer in the namespace, and
copies of its arrays and tensors. Every later run restores that state first (and the seeds), so
the fixed code starts exactly where the broken one did, even when the broken one ruined a model
defined earlier.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import traceback

from ..records import Run
from ..store import Store
from .base import Captured, Intervention, ProbeRequest, Version

MAX_COPY_BYTES = 1 << 30  # arrays/tensors copied for restore, in total
HIST_EVERY = 20


def _kind(obj) -> str | None:
    mod = type(obj).__module__ or ""
    torch = sys.modules.get("torch")
    if mod.startswith("torch") and torch is not None:
        if isinstance(obj, torch.nn.Module):
            return "torch_module"
        if isinstance(obj, torch.optim.Optimizer):
            return "torch_optimizer"
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            return "torch_scheduler"
        if isinstance(obj, torch.Tensor):
            return "tensor"
    if mod.startswith("numpy") and type(obj).__name__ == "ndarray":
        return "array"
    if mod.startswith(("keras", "tf_keras")) and hasattr(obj, "get_weights") \
            and hasattr(obj, "set_weights"):
        return "keras_model"
    if torch is not None and isinstance(obj, torch.nn.Module):
        return "torch_module"  # a user subclass defined in __main__
    if torch is not None and isinstance(obj, torch.optim.Optimizer):
        return "torch_optimizer"
    return None


class Snapshot:
    """The state of a namespace that code is about to run in, restorable in place.

    Parameters
    ----------
    namespace : dict
        The live namespace (a kernel's ``user_ns``).
    """

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.bindings = {k: v for k, v in namespace.items() if not k.startswith("_")}
        self.states: list[tuple[object, str, object]] = []
        budget = MAX_COPY_BYTES
        seen: set[int] = set()
        for value in self.bindings.values():
            kind = _kind(value)
            if kind is None or id(value) in seen:
                continue
            seen.add(id(value))
            if kind == "torch_module":
                state = {k: v.detach().clone() for k, v in value.state_dict().items()}
            elif kind in ("torch_optimizer", "torch_scheduler"):
                state = copy.deepcopy(value.state_dict())
            elif kind == "keras_model":
                state = [w.copy() for w in value.get_weights()]
            else:
                size = int(getattr(value, "nbytes", 0) or
                           value.element_size() * value.nelement())
                if size > budget:
                    continue
                budget -= size
                state = value.detach().clone() if kind == "tensor" else value.copy()
            self.states.append((value, kind, state))

    def restore(self, drop: set[str] | None = None) -> None:
        """Rebind every name to its object and restore the objects' contents.

        Parameters
        ----------
        drop : set of str, optional
            Names to remove when they did not exist at the snapshot (those the captured code
            made); None removes every name made since. Other later names (the user's own
            cells) are kept.
        """
        ns = self.namespace
        for k in [k for k in ns if not k.startswith("_") and k not in self.bindings
                  and (drop is None or k in drop)]:
            del ns[k]
        ns.update(self.bindings)
        torch = sys.modules.get("torch")
        for obj, kind, state in self.states:
            if kind == "torch_module":
                with torch.no_grad():
                    for k, v in obj.state_dict().items():
                        if k in state and state[k].shape == v.shape:  # skip parts made since
                            v.copy_(state[k])
                for p in obj.parameters():
                    p.grad = None
            elif kind in ("torch_optimizer", "torch_scheduler"):
                obj.load_state_dict(copy.deepcopy(state))
            elif kind == "keras_model":
                obj.set_weights(state)
            elif kind == "tensor":
                with torch.no_grad():
                    obj.copy_(state)
            else:
                obj[...] = state

    @property
    def described(self) -> list[str]:
        """What is restored, for the plan and the record."""
        names = {id(v): k for k, v in self.bindings.items()}
        return [f"{names.get(id(o), '?')} ({kind})" for o, kind, _ in self.states]


def run_code(code: str, namespace: dict, record: str, seed: int | None = None,
             filename: str | None = None, hist_every: int = HIST_EVERY,
             intervention: Intervention | None = None, max_steps: int | None = None
             ) -> tuple[Run, BaseException | None, object]:
    """Execute ``code`` in ``namespace`` under capture; the record streams to ``record``.

    ``hist_every`` is denser than a script's default: notebook runs are short, and the
    gradient panel's step slider needs more than one histogram.

    Returns
    -------
    tuple
        The captured Run, the exception that ended the code (None when it finished; not
        raised: the record holds it, and the caller decides how to show it), and the capture's
        keeper of live objects.
    """
    from .. import capture
    from ..interventions import installed
    from ..redact import write_private
    from .seeding import seed_everything

    if seed is not None:
        seed_everything(seed)
    filename = filename or Store.code_beside(record)
    write_private(filename, code)  # what tracebacks show; the code itself runs from memory
    error = None
    rec = capture(record, hist_every=hist_every)
    try:
        with rec, installed(intervention, max_steps):
            exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the user's own cell
    except (Exception, KeyboardInterrupt) as exc:  # the record holds it
        error = exc
        traceback.clear_frames(exc.__traceback__)
    run = Run.load(record) if os.path.exists(record) else Run([])
    return run, error, rec.keeper


class CellArtifact:
    """Code that runs in this process (a kernel's namespace), every run from one snapshot.

    Parameters
    ----------
    namespace : dict
        Where the code runs (a kernel's ``user_ns``).
    code : str
        The reproduced cell.
    prelude : str
        The earlier cells it depends on: kept in the session's ``artifact.py`` so the
        reproduction can be rerun outside this kernel, but not rerun here.
    """

    kind = "cell"

    def __init__(self, namespace: dict, code: str, prelude: str = "") -> None:
        self.namespace = namespace
        self.code = code
        self.prelude = prelude
        self.snapshot: Snapshot | None = None
        self.made: set[str] = set()  # names the captured code created
        self.live: Captured | None = None  # the last run whose live objects are kept
        self.live_code: str | None = None
        self.errors: list[BaseException | None] = []  # what ended each run (None: finished)

    def describe(self) -> tuple[dict, str, str]:
        """The artifact event's fields, the cell and the stand-alone script.

        The cell is what Fix diffs against; the script is the prelude followed by the cell.
        """
        if self.snapshot is None:
            self.snapshot = Snapshot(self.namespace)
        pre = self.prelude.rstrip() + "\n\n" if self.prelude.strip() else ""
        return ({"type": "cell", "code": self.code, "prelude": self.prelude, "args": [],
                 "restores": self.snapshot.described}, self.code, pre + self.code)

    def code_of(self, version: Version) -> str:
        """The code of a version: the reproduced cell, or the session's copy of a later one."""
        if version.label == "reproduced":
            return self.code
        with open(version.copy, encoding="utf-8") as fh:
            text = fh.read()
        if version.label == "current" and text in (self.code, _redacted(self.code)):
            return self.code  # the reproduced cell, as it ran (the copy is redacted)
        return text

    def run(self, version: Version, seed: int | None, record: str, *,
            probes: ProbeRequest | None = None, intervention: Intervention | None = None,
            max_steps: int | None = None, stdout=None, max_seconds: float | None = None
            ) -> Captured:
        """Run the version's code once from the snapshot (the first run takes the snapshot)."""
        from ..interventions import check

        if intervention is not None:
            check(intervention)  # an unknown one is the caller's error, not the run's
        if self.snapshot is None:
            self.snapshot = Snapshot(self.namespace)
        else:
            self.snapshot.restore(self.made)
        code = self.code_of(version)
        names = set(self.namespace)
        filename = Store.code_beside(record)
        run, error, keeper = run_code(code, self.namespace, record, seed=seed, filename=filename,
                                      intervention=intervention, max_steps=max_steps)
        self.made.update(set(self.namespace) - names)
        self.errors.append(error)
        captured = Captured(run, record, error=error, keeper=keeper, sources={filename: code})
        if probes is not None:
            from ..phases.isolate import probe_run

            captured.report = probe_run(run, keeper, captured.sources, probes)
        return captured

    def keep(self, captured: Captured, version: Version) -> None:
        """Keep ``captured``'s live objects for a later Isolate of ``version``."""
        self.live, self.live_code = captured, self.code_of(version)

    def reusable(self, version: Version) -> Captured | None:
        """The kept run, when it ran this version's code."""
        if self.live is None or self.live.keeper is None:
            return None
        return self.live if self.code_of(version) == self.live_code else None

    @contextlib.contextmanager
    def holding(self):
        """Put the kernel back as the user left it after a batch of runs."""
        now = Snapshot(self.namespace)
        before = set(self.made)
        try:
            yield self
        finally:
            now.restore(self.made - before)


def _redacted(code: str) -> str:
    from ..redact import redact_code

    return redact_code(code)
