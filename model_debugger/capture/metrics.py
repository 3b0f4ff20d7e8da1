"""Metric sources that need no change to the user's code.

- numbers printed on stdout as ``name=value``, ``name: value`` or ``'name': 'value'`` (a printed
  dict, such as Hugging Face's Trainer logs), or as ``name value`` when the
  name ends in a metric word (``val accuracy 0.95``, ``test acc 0.93``, ``loss 0.41``; ``epoch 3``
  sets the epoch);
- ``torch.utils.tensorboard.SummaryWriter.add_scalar`` / ``add_scalars``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|NaN|Inf)"
_PAIR = re.compile(r"(?<![\w.])([A-Za-z_][\w./-]*?)\s*(?:=|:)\s*(" + _NUM + r")(?![\w.:])")
# a printed dict: ``{'loss': '0.6942', 'grad_norm': 0.29}`` (Hugging Face's Trainer logs)
_QUOTED = re.compile(r"""(['"])([A-Za-z_][\w./-]*)\1\s*:\s*(['"]?)(""" + _NUM + r""")\3(?![\w.])""")
_EPOCH = re.compile(r"\bepoch\s*[\[:=#]?\s*(\d+)", re.IGNORECASE)
_CONTEXT = {"epoch", "step", "iter", "iteration", "batch", "it", "global_step"}
# ``name value`` with a space: the name's last word must be one of these (a printed count like
# ``files 3`` is not a metric), optionally after split words (``val accuracy``, ``mean train loss``)
_METRIC_WORDS = {"loss", "acc", "accuracy", "f1", "auc", "mse", "rmse", "mae", "error", "err",
                 "ppl", "perplexity", "precision", "recall", "lr", "r2", "iou", "dice", "top1",
                 "top5", "score", "nll", "bce"}
_QUALIFIERS = {"train", "training", "val", "valid", "validation", "test", "eval", "dev", "mean",
               "avg", "average", "running", "batch", "epoch", "macro", "micro", "weighted"}
_SPACED_HINT = re.compile(r"(?i)(?:" + "|".join(sorted(_METRIC_WORDS)) + r")[ \t]+[-+.\d]")
_TOKEN = re.compile(r"(?P<num>(?<![\w.])(?:" + _NUM + r")(?![\w.:]))|(?P<word>[A-Za-z_][\w./-]*)|\S")


def parse_metric_line(line: str) -> tuple[int | None, dict[str, float]]:
    """Parse one printed line into ``(epoch, {name: value})``.

    Parameters
    ----------
    line : str
        e.g. ``"epoch 3: train_loss=0.41 val_loss=0.52 val_acc=0.81"``.

    Returns
    -------
    tuple
        The epoch named on the line (or None) and the metrics found; counters such as ``step`` or
        ``epoch`` are not metrics.
    """
    epoch = None
    m = _EPOCH.search(line)
    if m:
        epoch = int(m.group(1))
    found: dict[str, float] = {}
    for name, value in _PAIR.findall(line):
        key = name.strip("./-").lower()
        if not key:
            continue
        if key in _CONTEXT:
            if key == "epoch" and epoch is None:
                epoch = int(float(value)) if math.isfinite(float(value)) else None
            continue
        found[key] = float(value)
    for _, name, _, value in _QUOTED.findall(line):
        key = name.lower()
        if key in _CONTEXT or key.endswith(("_runtime", "_per_second")) or key == "total_flos":
            continue  # counters and timings of a trainer's log dict
        found.setdefault(key, float(value))
    for key, value in _spaced_pairs(line):
        found.setdefault(key, value)
    return epoch, found


def _spaced_pairs(line: str) -> list[tuple[str, float]]:
    """``name value`` pairs separated by blanks only, whose name ends in a metric word.

    Split words directly before the name join it with ``_``: ``val accuracy 0.95`` is
    ``val_accuracy``.
    """
    tokens = list(_TOKEN.finditer(line))
    out = []
    for i, tok in enumerate(tokens):
        if tok.group("num") is None or i == 0:
            continue
        words = []
        j = i - 1
        while j >= 0 and tokens[j].group("word") is not None and \
                not line[tokens[j].end():tokens[j + 1].start()].strip() and \
                tokens[j].end() < tokens[j + 1].start():
            word = tokens[j].group("word").strip("./-").lower()
            if not words:
                if word.split("_")[-1] not in _METRIC_WORDS:
                    break
            elif word not in _QUALIFIERS:
                break
            words.insert(0, word)
            j -= 1
        before = tokens[j] if j >= 0 else None
        if words and before is not None and before.group("word") is not None and \
                not line[before.end():tokens[j + 1].start()].strip():
            continue  # "best val loss 0.3", "ema loss 0.2": another quantity than the metric
        if words:
            out.append(("_".join(words), float(tok.group("num"))))
    return out


class StdoutTee:
    """A text stream that forwards writes and parses complete lines for metrics.

    Installed as ``sys.stdout`` through :func:`~.patches.install` (:meth:`over` re-points it
    when another capture's tee comes or goes). After :meth:`finish` it only forwards: a module
    that did ``from sys import stdout`` during the capture keeps a harmless stream, not the
    Recorder.
    """

    def __init__(self, inner, on_line: Callable[[str], None]) -> None:
        self._inner = inner
        self._on_line = on_line
        self._buf = ""

    def over(self, inner) -> StdoutTee:
        """Forward to ``inner`` from now on; return this tee (a :mod:`.patches` factory)."""
        self._inner = inner
        return self

    def write(self, text: str) -> int:
        """Forward ``text``; until :meth:`finish`, parse its complete lines for metrics."""
        n = self._inner.write(text)
        if self._on_line is None:  # finished: forward only
            return n if n is not None else len(text)
        self._buf += text
        if "\n" in self._buf:
            *lines, self._buf = self._buf.split("\n")
            for line in lines:
                if "=" in line or ":" in line or _SPACED_HINT.search(line):
                    self._on_line(line)
        return n if n is not None else len(text)

    def flush(self) -> None:
        """Flush the stream written to."""
        self._inner.flush()

    def finish(self) -> None:
        """Parse a last line that had no newline; forward only from now on."""
        on_line, self._on_line = self._on_line, None
        if self._buf and on_line is not None:
            self._buf, buf = "", self._buf
            on_line(buf)
        self._buf = ""

    def __getattr__(self, name):
        return getattr(self._inner, name)


def patch_summary_writer(module, emit: Callable[[str, float, int | None], None]) -> Callable:
    """Wrap ``SummaryWriter.add_scalar(s)`` in ``module``; return the function that undoes it."""
    from .patches import Link, install

    cls = module.SummaryWriter
    link = Link(emit)

    def wrap_scalar(orig_scalar):
        def add_scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
            fn = link()
            try:
                if fn is not None:
                    fn(str(tag), float(scalar_value), global_step)
            except (TypeError, ValueError, RuntimeError):
                pass
            return orig_scalar(self, tag, scalar_value, global_step, *args, **kwargs)
        return add_scalar

    def wrap_scalars(orig_scalars):
        def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, *args, **kwargs):
            fn = link()
            for sub, value in dict(tag_scalar_dict).items() if fn is not None else ():
                try:
                    fn(f"{main_tag}/{sub}", float(value), global_step)
                except (TypeError, ValueError, RuntimeError):
                    pass
            return orig_scalars(self, main_tag, tag_scalar_dict, global_step, *args, **kwargs)
        return add_scalars

    removers = [install(cls, "add_scalar", wrap_scalar), install(cls, "add_scalars", wrap_scalars)]

    def undo() -> None:
        link.cut()
        for remove in removers:
            remove()

    return undo
