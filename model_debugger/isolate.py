"""Isolate: build a probe context from a captured run and run the probes worth running.

In-process (the CLI child, a notebook) the context holds live objects from the capture's Keeper;
from a record alone (a killed run, a log) only record-based probes and the lint run.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from .classify import classify
from .records import Finding, Run
from .signals import compute

BUDGET_SECONDS = 30.0


def _arrays(batches) -> tuple | None:
    if not batches:
        return None
    try:
        xs = np.concatenate([b[0][0].float().reshape(len(b[1]), -1).cpu().numpy() for b in batches])
        ys = np.concatenate([b[1].cpu().numpy() for b in batches])
    except (ValueError, RuntimeError, AttributeError, TypeError):
        return None
    # epochs over a small dataset repeat rows; data probes want each sample once
    _, first = np.unique(xs, axis=0, return_index=True)
    first.sort()
    return xs[first], ys[first]


def user_sources(run: Run, extra: list[str] = ()) -> dict[str, str]:
    """Source text of the user's files named by the record's code references."""
    files = {e["file"] for e in run.of("ref")} | set(extra)
    out = {}
    for path in files:
        try:
            with open(path, encoding="utf-8") as fh:
                out[path] = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
    return out


def build_context(run: Run, keeper=None, sources: dict | None = None,
                  budget: float = BUDGET_SECONDS):
    """A ProbeContext from a record and (optionally) the capture's Keeper."""
    from .probes import ProbeContext

    sig = compute(run)
    ctx = ProbeContext(run=run, signals=sig, classification=classify(sig),
                       source_files=sources if sources is not None else user_sources(run),
                       deadline=time.monotonic() + budget)
    seen = run.first("model") or run.first("optimizer")
    ctx.framework = seen.get("framework", "torch") if seen else "none"
    keras = getattr(keeper, "framework", "torch") == "keras"
    if keeper is not None and keeper.model is not None:
        ctx.framework = "keras" if keras else ctx.framework
        ctx.model = keeper.model
        ctx.initial_state = keeper.initial_state
        ctx.optimizer = keeper.optimizer
        ctx.loss = keeper.loss
        ctx.train_xy, ctx.val_xy = keeper.arrays() if keras else (
            _arrays(keeper.train_batches), _arrays(keeper.val_batches))
        ctx.train_batches, ctx.val_batches = keeper.train_batches, keeper.val_batches
        ctx.extras["namespace"] = keeper.namespace
        ctx.extras["train_loader"] = keeper.train_loader
        if keras and keeper.optimizer and keeper.loss and keeper.train_batches:
            try:
                ctx.trainer = keeper.make_trainer()
            except Exception:  # noqa: BLE001 - a model Keras cannot clone: record-only probes
                ctx.trainer = None
        elif keeper.optimizer and keeper.loss and keeper.train_batches:
            from .probes.torch_adapter import TorchTrainer

            try:
                ctx.trainer = TorchTrainer(keeper.model, keeper.initial_state, keeper.optimizer,
                                           keeper.loss, keeper.train_batches, keeper.val_batches)
            except (AttributeError, TypeError, RuntimeError, ValueError):
                ctx.trainer = None
    return ctx


def isolate(ctx, ids: list[str] | None = None) -> list[Finding]:
    """Run the probes for the context's categories (or ``ids``); ranked findings."""
    from .probes import run_probes

    if ctx.classification.primary == "healthy" and ids is None and ctx.run.error is None:
        return []
    return run_probes(ctx, ids)


def write_findings(path: str, findings: list[Finding], extras: dict) -> None:
    """Save findings next to a record (atomically)."""
    tmp = path + ".tmp"
    safe = {k: v for k, v in extras.items() if k in ("probe_seconds", "lr_range", "seed_noise")}
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"findings": [f.to_json() for f in findings], "extras": safe}, fh,
                  default=str)
    os.replace(tmp, path)


def read_findings(path: str) -> tuple[list[Finding], dict] | None:
    """Findings written by :func:`write_findings`, or None when there are none."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None
    return [Finding.from_json(f) for f in data.get("findings", [])], data.get("extras", {})
