"""``padding_waste``: every batch padded to a fixed length far beyond its longest sequence.

A ``collate_fn`` or a tokenizer that pads each batch to the model's maximum length
(``padding="max_length"``, ``torch.full((n, MAX_LEN), PAD)``) instead of to the batch's longest
sequence makes every layer compute over positions that are only padding: a transformer's
attention grows with the square of the length. A model that masks its padding gives the same
outputs on the batch cut to its longest row, so the cut is pure saving.

Measured on the kept training batches: every one has the same width, and its longest row
fills at most :data:`FILL` of it. A fresh copy's training steps (forward and backward) are then
timed on the batches as the loop gave them and cut to their longest rows, :data:`ROUNDS` times
alternated, the fastest of each kept; the copy's outputs must agree on both (in eval mode: the
model masks its padding, so the cut changes nothing but the time). Confirmed (``data``: the
pipeline pads) when the cut trains :data:`GAIN` times faster and the run's steps took long
enough to matter; on a run that looked healthy it re-classifies it ``performance_issue``.
Located where the width is set: a tokenizer's ``padding="max_length"``, the collate function's
line that picks the width, else the loader.
"""

from __future__ import annotations

import inspect
import re
import time

import numpy as np

from ._heldout import source_line
from .base import Probe, ProbeContext, register
from .compute_settings import GAIN, MIN_RUN_SECONDS, ROUNDS, step_seconds

FILL = 0.5   # the longest row of every batch fills at most this share of its width
STEPS = 6    # timed training steps per reading (after one warm-up step)
_MAX_LENGTH = re.compile(r"""padding\s*=\s*["']max_length["']""")
_WIDTH = re.compile(r"\b(?:[A-Z][A-Z0-9_]*LEN[A-Z0-9_]*|max_len\w*|maxlen|seq_len\w*|"
                    r"block_size|context_length)\b")


@register
class PaddingWaste(Probe):
    """Batches padded far beyond their longest row, timed against the same batches cut."""

    id = "padding_waste"
    cost = 1
    categories = ("healthy", "performance_issue")  # the time, not another category's cause
    reveals = "performance_issue"
    symptom = "performance_issue"
    needs_live = True
    traces_origin = False  # the width's line is the code at fault, not where the ids were made
    frameworks = ("torch",)
    fix = ("Pad each batch to its own longest sequence (a collate_fn with pad_sequence, or "
           "padding='longest' / DataCollatorWithPadding for a tokenizer), not to the model's "
           "maximum length.")

    def run(self, ctx: ProbeContext):
        """A confirmed finding when the cut batches train clearly faster; else nothing."""
        run_seconds = step_seconds(ctx)
        tr = ctx.trainer
        if run_seconds < MIN_RUN_SECONDS or tr is None or not ctx.train_batches:
            return []
        cuts = [_cut(inputs) for inputs, _ in ctx.train_batches]
        if not cuts or any(c is None for c in cuts):
            return []
        widths = {w for w, _ in cuts}
        fill = max(longest / width for width, longest in cuts)
        if len(widths) != 1 or fill > FILL:
            return []
        width = widths.pop()
        batches = [(inputs, target, longest) for (inputs, target), (_, longest)
                   in zip(ctx.train_batches, cuts)][:3]
        same = _same_outputs(tr, batches)
        if not same:
            return []
        full, cut = _fastest(lambda: _seconds(tr, batches, False),
                             lambda: _seconds(tr, batches, True))
        gain = full / cut if cut > 0 else 0.0
        if gain < GAIN:
            return []
        return [self.finding(
            "data", True,
            f"Every training batch is padded to {width} positions while its longest sequence "
            f"has at most {max(c[1] for c in cuts)} ({fill:.0%} of the width): every layer "
            f"computes over padding. A fresh copy's training steps on the same batches cut to "
            f"their longest rows are {gain:.1f}x faster ({full * 1e3:.0f} ms vs "
            f"{cut * 1e3:.0f} ms for {STEPS * len(batches)} steps) with the same outputs (the "
            f"model masks its padding); the run's steps took {run_seconds:.1f} s.",
            _where(ctx, width), strength=0.8, undone=True, decisive=True, width=width, fill=fill,
            gain=gain, seconds_as_padded=full, seconds_cut=cut,
            run_step_seconds=run_seconds)]


def _cut(inputs) -> tuple[int, int] | None:
    """``(width, longest row)`` of the padded token ids among a batch's inputs, or None."""
    from .unmasked_padding import padding  # (here: each probe module registers in name order)

    for x in inputs:
        found = padding(x) if getattr(x, "ndim", 0) == 2 else None
        if found is not None:
            return found["steps"], found["longest"]
    return None


def _trimmed(inputs, width: int, keep: int) -> tuple:
    """Every input with ``width`` positions on its second axis (ids, a mask) cut to ``keep``."""
    return tuple(x[:, :keep] if getattr(x, "ndim", 0) >= 2 and x.shape[1] == width else x
                 for x in inputs)


def _batches(batches, cut: bool):
    for inputs, target, longest in batches:
        width = _cut(inputs)[0]  # the padded ids' width (a mask beside them has it too)
        yield (_trimmed(inputs, width, longest) if cut else inputs), target


def _same_outputs(tr, batches) -> bool:
    """Whether a fresh copy in eval mode gives the same outputs on the batches cut and not."""
    import torch

    model = tr.fresh_model().eval()
    try:
        with torch.no_grad():
            for (full, _), (cut, _) in zip(_batches(batches, False), _batches(batches, True)):
                a, b = tr.predict(model, full), tr.predict(model, cut)
                if a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-4):
                    return False
    except Exception:  # noqa: BLE001 - a model that needs its fixed length: no cut to compare
        return False
    return True


def _seconds(tr, batches, cut: bool) -> float:
    """Seconds of :data:`STEPS` forward and backward passes of a fresh copy on each batch."""
    model = tr.fresh_model()
    given = list(_batches(batches, cut))
    tr.loss(model, *given[0]).backward()  # warm-up
    t0 = time.perf_counter()
    for inputs, target in given:
        for _ in range(STEPS):
            tr.on_time()  # (the probe budget is a hard limit)
            model.zero_grad(set_to_none=True)
            tr.loss(model, inputs, target).backward()
    return time.perf_counter() - t0


def _fastest(first, second) -> tuple[float, float]:
    """The lowest of :data:`ROUNDS` readings of two durations, taken alternately."""
    a, b = [], []
    for _ in range(ROUNDS):
        a.append(first())
        b.append(second())
    return min(a), min(b)


def _where(ctx: ProbeContext, width: int) -> dict | None:
    """A tokenizer's ``padding="max_length"``, the collate function's width, else the loader."""
    loader = ctx.ref("loader")
    hit = source_line(ctx, _MAX_LENGTH, near=loader)
    if hit is not None:
        return hit
    for fn in (getattr(ctx.train_loader, "collate_fn", None),
               getattr(type(ctx.train_dataset), "__getitem__", None)):
        found = _width_line(fn, width)
        if found is not None:
            return found
    return loader


def _width_line(fn, width: int) -> dict | None:
    """The first line of ``fn`` (the user's) naming a fixed length or ``width``, else its ``def``."""
    from ..capture.codeloc import is_user_file

    code = getattr(fn, "__code__", None)
    if code is None or not is_user_file(code.co_filename):
        return None
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return {"file": code.co_filename, "line": code.co_firstlineno}
    for i, text in enumerate(lines[1:], start + 1):
        if (_WIDTH.search(text) or re.search(rf"\b{width}\b", text)) and \
                not text.lstrip().startswith("#"):
            return {"file": code.co_filename, "line": i}
    return {"file": code.co_filename, "line": code.co_firstlineno}
