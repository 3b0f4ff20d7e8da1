"""Probing: from a captured run (and its live objects) to a probe context, and its report.

The bridge between capture and the probes, used where the live objects are (the script's child,
the kernel) by :func:`model_debugger.phases.isolate.probe_run`. With a keeper the context holds
live objects (the model, its initial weights, sample batches, a trainer); from a record alone (a
killed run, a log) only record-based probes and the lint run. The report of probes that ran in a
child travels beside its record (:func:`write_findings`, :func:`read_report`).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from .classify import classify
from .records import Classification, Run
from .signals import compute

if TYPE_CHECKING:  # the probes package (every probe) is imported when first needed
    from .probes import ProbeContext, ProbeReport

BUDGET_SECONDS = 30.0


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
                  budget: float = BUDGET_SECONDS,
                  classification: Classification | dict | None = None) -> ProbeContext:
    """A ProbeContext from a record and (optionally) the capture's Keeper.

    Parameters
    ----------
    run : Run
        The captured record.
    keeper : Keeper, KerasKeeper or None
        The live objects the capture kept (None: record-only probes and the lint).
    sources : dict, optional
        ``{path: text}`` of the user's code; by default the files the record refers to.
    budget : float
        Seconds the probes may take.
    classification : Classification or dict, optional
        The classification the session recorded: the probes follow it instead of a
        classification of this run (which may be a healthy seed of a problem seen in others).
    """
    from .probes import ProbeContext
    from .trainers import trainer_for

    sig = compute(run)
    if isinstance(classification, dict):
        classification = Classification.from_json(classification)
    ctx = ProbeContext(run=run, signals=sig,
                       classification=classification if classification is not None
                       else classify(sig),
                       source_files=sources if sources is not None else user_sources(run),
                       deadline=time.monotonic() + budget)
    seen = run.first("model") or run.first("optimizer")
    ctx.framework = seen.get("framework", "torch") if seen else "none"
    if keeper is not None and keeper.model is not None:
        keras = getattr(keeper, "framework", "torch") == "keras"
        ctx.framework = "keras" if keras else ctx.framework
        ctx.model = keeper.model
        ctx.initial_state = keeper.initial_state
        ctx.optimizer = keeper.optimizer
        ctx.loss = keeper.loss
        ctx.train_xy, ctx.val_xy = keeper.arrays()
        ctx.train_batches = keeper.train_batches
        ctx.val_batches = keeper.validation_batches() if hasattr(
            keeper, "validation_batches") else keeper.val_batches
        ctx.namespace, ctx.train_loader = keeper.namespace, keeper.train_loader
        ctx.train_dataset = getattr(keeper, "train_dataset", None)
        ctx.trainer = trainer_for(keeper)
    return ctx


def probe(ctx: ProbeContext, ids: list[str] | None = None) -> ProbeReport:
    """Run the probes for the context's categories (or ``ids``).

    Returns
    -------
    ProbeReport
        Ranked findings, probe timings and shared measurements. A healthy run that did not
        fail gets only the probes written for healthy runs (``"healthy"`` among their
        categories: what good-looking signals can hide, such as the target copied into the
        inputs), unless ``ids`` name probes to run anyway.
    """
    from .probes import PROBES, run_probes

    if ctx.classification.primary == "healthy" and ids is None and ctx.run.error is None:
        ids = [pid for pid, cls in PROBES.items() if "healthy" in cls.categories]
    return run_probes(ctx, ids)


def write_findings(path: str, report: ProbeReport) -> None:
    """Save every field of a :class:`~model_debugger.probes.ProbeReport` next to a record.

    Written atomically to ``path`` (a temporary file, then replaced).
    """
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(report.to_json(), fh, default=str)
    os.replace(tmp, path)


def read_report(path: str) -> ProbeReport | None:
    """The :class:`~model_debugger.probes.ProbeReport` written by :func:`write_findings`.

    None when there is none (or it cannot be read).
    """
    from .probes import ProbeReport
    from .records import RecordError

    try:
        with open(path, encoding="utf-8") as fh:
            return ProbeReport.from_json(json.load(fh))
    except (OSError, json.JSONDecodeError, RecordError, TypeError, AttributeError):
        return None

