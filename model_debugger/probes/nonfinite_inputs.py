"""Probe ``nonfinite_inputs``: NaN or inf in the training data itself.

A non-finite loss is blamed on the learning rate or on an unsafe operation only once the data
is ruled out. Two direct measurements, no threshold:

- the batch whose loss first went non-finite: the capture checked its model inputs and the
  loss's target (``nonfinite`` event, ``in_batch``);
- the sample of training rows kept for Isolate: the share of rows with a NaN or inf feature or
  target.

Either is a confirmed ``data`` finding (the value came in with the data), located where that half
of the data was made.
"""

from __future__ import annotations

import numpy as np

from ..provenance import data_origin
from ..records import Finding
from . import _numpy_stats as st
from .base import Probe, ProbeContext, register


@register
class NonfiniteInputs(Probe):
    """NaN or inf rows in the training inputs or targets."""

    id = "nonfinite_inputs"
    categories = ("gradient_instability", "loss_not_decreasing")
    needs_live = False
    fix = ("Find where the NaN/inf values enter the data (missing values, a division by zero, a "
           "log of 0 in preprocessing) and drop or impute those rows before training.")

    def applies(self, ctx: ProbeContext) -> bool:
        """When the record saw a non-finite batch or training rows were kept."""
        bad = ctx.run.first("nonfinite") or {}
        return super().applies(ctx) and (bool(bad.get("in_batch")) or ctx.train_xy is not None)

    def run(self, ctx: ProbeContext) -> list[Finding]:
        """One confirmed finding when the data holds non-finite values; inputs before targets."""
        bad = ctx.run.first("nonfinite") or {}
        batch = bad.get("in_batch") or {}
        share = {"inputs": 0.0, "targets": 0.0}
        rows = 0
        if ctx.train_xy is not None:
            x, y = ctx.train_xy
            x, y = st.as_matrix(x), np.asarray(y, dtype=np.float64).reshape(len(y), -1)
            rows = len(x)
            if rows:
                share["inputs"] = float((~np.isfinite(x)).any(1).mean())
                share["targets"] = float((~np.isfinite(y)).any(1).mean())
        role = "inputs" if batch.get("inputs") or share["inputs"] > 0 else \
            "targets" if batch.get("target") or share["targets"] > 0 else None
        if role is None:
            return []
        seen = []
        if batch:
            part = "inputs" if role == "inputs" else "target"
            on = f" on rank {bad['rank']}" if bad.get("rank") is not None else ""
            seen.append(f"the batch whose loss first went non-finite (step {bad.get('step')}"
                        f"{on}) "
                        f"had {batch.get(part)} of {batch.get('rows', '?')} rows with NaN/inf "
                        f"in its {part}")
        if share[role] > 0:
            seen.append(f"{share[role]:.1%} of {rows} kept training rows have NaN/inf "
                        f"{'features' if role == 'inputs' else 'targets'}")
        text = ("The training data holds non-finite values: " + "; ".join(seen) + ". One NaN "
                "in a batch makes its loss and every gradient NaN, and the update spreads it "
                "into the weights: the data, not the model or the learning rate, starts it.")
        location = _made_nonfinite(ctx) or data_origin(st.data_location(ctx), role)
        return [Finding(self.id, "data", True, text, location, {
            "role": role, "batch": batch or None, "share_of_rows": share[role],
            "rows_checked": rows, "step": bad.get("step"), "strength": 0.95, "decisive": True,
            **({"rank": bad["rank"]} if bad.get("rank") is not None else {})})]


_NUMPY_MADE = ("divide by zero", "invalid value", "overflow encountered")


def _made_nonfinite(ctx: ProbeContext) -> dict | None:
    """Where NumPy warned it made a NaN or inf before training began (a log of 0, 0/0), or None.

    The warning is raised at the very operation that made the non-finite values, which a
    trace from where the data was used stops short of (``ds.map(standardise)`` computes too).
    """
    for e in ctx.run.events:
        if e.get("t") == "step":
            return None  # training began: a warning now is about a value the model made
        if e.get("t") == "warning" and e.get("category") == "RuntimeWarning" and \
                any(m in str(e.get("message", "")) for m in _NUMPY_MADE) and \
                " cast" not in str(e.get("message", "")) and \
                e.get("file") in ctx.source_files and isinstance(e.get("line"), int):
            return {"file": e["file"], "line": e["line"]}  # (a cast consumes a NaN, never
            # makes one)
    return None
