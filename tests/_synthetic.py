"""Synthetic run records for rule tests.

Builds :class:`model_debugger.records.Run` objects from per-step arrays, in the JSON-lines event
format that ``capture/recorder.py`` and ``capture/torch_instrument.py`` emit (``start``, ``step``,
``metric``, ``targets``, ``nonfinite``, ``error``, ``end``). Every event goes through a
``json.dumps``/``json.loads`` round trip, as it would through ``record.jsonl``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from model_debugger.records import Run

MB = 2**20


def _num(value):
    """JSON-safe float, as the recorder writes it: NaN and infinities become strings."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else str(value)


def decay(n: int, start: float = 1.0, end: float = 0.3) -> np.ndarray:
    """A healthy, geometrically falling loss curve."""
    return start * (end / start) ** (np.arange(n) / max(n - 1, 1))


def two_level(n: int, before: float, after: float) -> np.ndarray:
    """First half at ``before``, second half at ``after``: head/tail medians are exact."""
    out = np.full(n, float(before))
    out[n // 2:] = after
    return out


def steps_events(
    loss: Sequence | None = None,
    *,
    n: int | None = None,
    ep: Sequence[int] | None = None,
    gn: Sequence | None = None,
    mgn: Sequence[dict] | None = None,
    dt: Sequence | None = None,
    dw: Sequence | None = None,
    rss: Sequence | None = None,
    cuda: Sequence | None = None,
    gpu_util: Sequence | None = None,
    ur: Sequence | None = None,
) -> list[dict]:
    """``step`` events; every argument is a per-step sequence (or None to leave it out)."""
    if n is None:
        n = len(next(a for a in (loss, gn, mgn, dt, dw, rss) if a is not None))
    out = []
    for i in range(n):
        step: dict = {"i": i, "ep": int(ep[i]) if ep is not None else 0,
                      "loss": _num(loss[i]) if loss is not None else None,
                      "gn": _num(gn[i]) if gn is not None else None,
                      "dt": float(dt[i]) if dt is not None else None,
                      "dw": float(dw[i]) if dw is not None else None}
        if rss is not None and np.isfinite(rss[i]):
            step["rss"] = int(rss[i])  # NaN: not read (PyTorch reads it when norms are measured)
        if mgn is not None:
            step["mgn"] = {k: _num(v) for k, v in mgn[i].items()}
        if cuda is not None:
            step["cuda"] = int(cuda[i])
        if gpu_util is not None and np.isfinite(gpu_util[i]):
            step["gpu_util"] = float(gpu_util[i])  # read every few steps only
        if ur is not None and np.isfinite(ur[i]):
            step["ur"] = float(ur[i])  # measured every update_every steps only
        out.append({"t": "step", **step})
    return out


def metric(name: str, values: Sequence, source: str = "log") -> list[dict]:
    """One ``metric`` event per epoch (epoch ``k`` gets ``values[k]``)."""
    return [{"t": "metric", "name": name, "value": _num(v), "source": source, "step": k,
             "epoch": k} for k, v in enumerate(values)]


def targets_counts(counts: Sequence[int], loss: str = "cross_entropy") -> dict:
    return {"t": "targets", "loss": loss, "n": int(sum(counts)), "counts": [int(c) for c in counts]}


def targets_moments(mean: float, var: float, loss: str = "mse_loss", n: int = 100) -> dict:
    return {"t": "targets", "loss": loss, "n": n, "mean": mean, "var": var}


def nonfinite(step: int, what: str = "grad", module: str | None = "layers.2") -> dict:
    return {"t": "nonfinite", "step": step, "what": what, "value": "nan", "module": module}


def error(kind: str = "oom", type_: str = "OutOfMemoryError",
          message: str = "CUDA out of memory. Tried to allocate 2.00 GiB", step: int = 0) -> dict:
    return {"t": "error", "kind": kind, "type": type_, "message": message,
            "location": {"file": "train.py", "line": 42}, "step": step,
            "traceback": f"Traceback (most recent call last):\n{type_}: {message}\n"}


def make_run(*events, ended: bool = True) -> Run:
    """A Run from event dicts / lists of event dicts, framed by ``start`` and ``end``."""
    flat: list[dict] = [{"t": "start", "time": 0.0, "pid": 1, "argv": ["train.py"], "rss": 0}]
    for e in events:
        flat.extend(e if isinstance(e, list) else [e])
    if ended:
        n = sum(1 for e in flat if e["t"] == "step")
        flat.append({"t": "end", "status": "ok", "steps": n, "seconds": 1.0})
    return Run([json.loads(json.dumps(e)) for e in flat])


def healthy_steps(n: int = 100, **extra) -> list[dict]:
    """A run that trains normally: loss 1.0 -> 0.3, steady small gradients."""
    extra.setdefault("gn", np.ones(n))
    return steps_events(decay(n), **extra)


class CannedArtifact:
    """An Artifact whose runs replay canned records (``runs[label]``: a Run, or a function of
    the seed returning one): the phases run against it exactly as against a script or a cell,
    with no training. ``label`` is the Version's (``reproduced``, ``current``, ``fixed``), or
    ``label+intervention`` for a run with that intervention (default: the label's run)."""

    kind = "script"

    def __init__(self, runs: dict, code: str = "x = 1\n") -> None:
        self.runs = runs
        self.code = code
        self.calls: list[tuple[str, int | None]] = []

    def describe(self):
        return {"type": "script", "script": "/nonexistent/train.py", "args": []}, \
            self.code, self.code

    def run(self, version, seed, record, *, probes=None, intervention=None, max_steps=None,
            stdout=None, max_seconds=None):
        from model_debugger.artifacts import Captured

        key = version.label if intervention is None else f"{version.label}+{intervention.id}"
        self.calls.append((key, seed))
        made = self.runs.get(key, self.runs[version.label])
        run = made(seed) if callable(made) else made
        with open(record, "w", encoding="utf-8") as fh:
            for e in run.events:
                fh.write(json.dumps(e) + "\n")
        return Captured(Run.load(record), record)

    def reusable(self, version):
        return None

    def holding(self):
        import contextlib

        return contextlib.nullcontext()
