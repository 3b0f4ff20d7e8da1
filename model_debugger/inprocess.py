"""Run an artifact inside this process (a notebook kernel): Reproduce, Isolate and Verify on code.

The artifact is code executed in a live namespace. Before the first Reproduce, :class:`Snapshot`
records the state the code starts from: which names were bound to what, the weights and optimizer
state of every model/optimizer in the namespace, and copies of its arrays and tensors. Verify
restores that state before each run (and resets the seeds), so the fixed code starts exactly where
the broken one did, even when the broken one ruined a model defined earlier.
"""

from __future__ import annotations

import copy
import os
import random
import sys
import traceback

from ._validate import check_budget, check_count, check_probe_ids, check_seed, check_seeds
from .records import Run
from .redact import redact_code, write_private
from .session import DebugSession

MAX_COPY_BYTES = 1 << 30  # arrays/tensors copied for restore, in total
HIST_EVERY = 20


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and any loaded framework."""
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(seed)
    if "keras" in sys.modules and hasattr(sys.modules["keras"], "utils"):
        try:
            sys.modules["keras"].utils.set_random_seed(seed)
        except Exception:  # noqa: BLE001 - an old or partial keras: the others are seeded
            pass


def _kind(obj) -> str | None:
    mod = type(obj).__module__ or ""
    if mod.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is None:
            return None
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
    torch = sys.modules.get("torch")
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
             filename: str | None = None, hist_every: int = HIST_EVERY
             ) -> tuple[Run, BaseException | None]:
    """Execute ``code`` in ``namespace`` under capture; the record streams to ``record``.

    ``hist_every`` is denser than a script's default: notebook runs are short, and the
    gradient panel's step slider needs more than one histogram.

    Returns
    -------
    tuple
        The captured Run and the exception that ended the code (None when it finished). The
        exception is not raised: the record holds it, and the caller decides how to show it.
    """
    from . import capture

    if seed is not None:
        seed_everything(seed)
    filename = filename or os.path.join(os.path.dirname(record), "cell.py")
    write_private(filename, code)  # what tracebacks show; the code itself runs from memory
    error = None
    rec = capture(record, hist_every=hist_every)
    try:
        with rec:
            exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the user's own cell
    except (Exception, KeyboardInterrupt) as exc:  # the record holds it
        error = exc
        traceback.clear_frames(exc.__traceback__)
    run = Run.load(record) if os.path.exists(record) else Run([])
    run.keeper = rec.keeper  # live objects for Isolate
    return run, error


def runner_for(session: DebugSession, namespace: dict, snapshot: Snapshot, original: str,
               fixed: str, made: set[str]):
    """A Verify runner: ``runner(which, seed)`` restores the snapshot, then runs the code.

    ``made`` collects the names the runs create (removed again before the next run).
    """
    n = sum(1 for e in session.events if e["kind"] == "verify") + 1
    folder = os.path.join(session.directory, "verify", str(n))
    os.makedirs(folder, exist_ok=True)
    code = {"before": original, "after": fixed}

    def runner(which: str, seed: int) -> Run:
        snapshot.restore(made)
        before = set(namespace)
        run, _ = run_code(code[which], namespace, os.path.join(folder, f"{which}-{seed}.jsonl"),
                          seed=seed, filename=os.path.join(folder, f"{which}.py"))
        made.update(set(namespace) - before)
        return run

    return runner


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
        self.snapshot: Snapshot | None = None
        self.code: str | None = None
        self.last_run: Run | None = None
        self.made: set[str] = set()  # names the captured code created
        self.code_file: str | None = None  # the file the probed run's code was compiled as

    def reproduce(self, code: str, runs: int = 1, seed: int | None = None,
                  prelude: str = "") -> tuple[dict, BaseException | None]:
        """Run ``code`` ``runs`` times from the same starting state; record Reproduce/Classify.

        ``prelude`` is the earlier code it depends on: it is kept in the artifact script
        (``artifact.py``) so the reproduction can be rerun outside this kernel, but not rerun here.

        Returns
        -------
        tuple
            The Reproduce verdict and the exception of the first run (None when it finished).
        """
        from .classify import classify
        from .diagnose import _classified, _label, _result_of, _verdict
        from .signals import compute

        runs = check_count(runs, "runs")
        seed = check_seed(seed, "seed", runs)
        s = self.session
        self.snapshot = Snapshot(self.namespace)
        self.made = set()
        self.code = code
        write_private(os.path.join(s.directory, "artifact.py"),
                      (prelude.rstrip() + "\n\n" if prelude.strip() else "") + code)
        write_private(os.path.join(s.directory, "cell.py"), code)
        s._append("artifact", type="cell", code=code, prelude=prelude, seed=seed, args=[],
                 copy="cell.py", restores=self.snapshot.described)
        results, tried, per_run, first_error = [], [], [], None
        for i in range(max(1, runs)):
            if i:
                self.snapshot.restore(self.made)
            run_seed = None if seed is None else seed + i
            record = os.path.join(s.run_dir(i), "record.jsonl")
            names = set(self.namespace)
            run, err = run_code(code, self.namespace, record, seed=run_seed,
                                filename=os.path.join(s.run_dir(i), "cell.py"))
            self.made.update(set(self.namespace) - names)
            first_error = first_error if i else err
            if i == 0:
                self.last_run = run
                self.code_file = os.path.join(s.run_dir(i), "cell.py")
            sig = compute(run)
            cls = classify(sig)
            res = _result_of(run, cls.primary)
            res.update(record=os.path.relpath(record, s.directory), exit_code=0 if err is None
                       else 1, timed_out=False, complete=run.ended)
            results.append(res)
            per_run.append((cls, sig))
            tried.append(f"run {i + 1}: seed={run_seed}, {len(run.steps)} steps -> {_label(res)}")
        verdict = _verdict(results, tried)
        s.record_reproduce(verdict)
        index = _classified(results, verdict["problem"])
        if index is not None:  # the same rule as the CLI: no training step, no classification
            cls, sig = per_run[index]
            s.record_classification(cls, sig)
        return verdict, first_error

    def isolate(self, ids: list[str] | None = None, budget: float = 30.0):
        """Run probes on the live objects of the first reproduction run; record the findings."""
        from .isolate import build_context, isolate

        budget, ids = check_budget(budget, "budget"), check_probe_ids(ids, "ids")
        if self.last_run is None:
            raise ValueError("nothing reproduced in this kernel yet: run %%reproduce first")
        self.session._require("isolate")
        self._capture_current()
        sources = {self.code_file or os.path.join(self.session.run_dir(0), "cell.py"):
                   self.code or ""}
        ctx = build_context(self.last_run, getattr(self.last_run, "keeper", None), sources,
                            budget)
        findings = isolate(ctx, ids)
        self.session.record_findings(findings, probe_seconds=ctx.extras.get("probe_seconds", {}),
                                     live=True, noise=ctx.extras.get("seed_noise"),
                                     lr_range=ctx.extras.get("lr_range"))
        return findings

    def _capture_current(self) -> None:
        """After a kept fix, Isolate probes the fixed code: run it once from the snapshot."""
        with open(self.session.artifact_copy, encoding="utf-8") as fh:
            current = fh.read()
        if current in (self.code, redact_code(self.code or "")) or self.snapshot is None:
            return
        n = sum(1 for e in self.session.events if e["kind"] == "isolate") + 1
        folder = os.path.join(self.session.directory, "isolate", str(n))
        os.makedirs(folder, exist_ok=True)
        now = Snapshot(self.namespace)
        self.snapshot.restore(self.made)
        names = set(self.namespace)
        art = next(e for e in self.session.events if e["kind"] == "artifact")
        run, _ = run_code(current, self.namespace, os.path.join(folder, "record.jsonl"),
                          seed=art.get("seed"), filename=os.path.join(folder, "cell.py"))
        made = set(self.namespace) - names
        self.last_run, self.code = run, current
        self.code_file = os.path.join(folder, "cell.py")
        now.restore(made)

    def verify(self, seeds: list[int]) -> dict:
        """Rerun the current code and the approved fix from the snapshot, over ``seeds``."""
        from .verify import verify

        seeds = check_seeds(seeds)
        fix = self.session.pending_fix
        if fix is None or self.snapshot is None:
            from .session import GateError

            raise GateError(f"verify refused: {self.session.gates()['verify']}"
                            if fix is None else "verify refused: nothing reproduced in this "
                            "kernel (the starting state is unknown)")
        with open(self.session.artifact_copy, encoding="utf-8") as fh:
            original = fh.read()
        with open(os.path.join(self.session.directory, fix["copy"]), encoding="utf-8") as fh:
            fixed = fh.read()
        now = Snapshot(self.namespace)  # the kernel as the user left it, put back afterwards
        made: set[str] = set()
        try:
            return verify(self.session, runner_for(self.session, self.namespace, self.snapshot,
                                                   original, fixed, made), seeds)
        finally:
            now.restore(made)
