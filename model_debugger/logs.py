"""Minimal reproducers: turn a loss/metrics log (CSV, JSON lines, TensorBoard) into a Run.

When nothing can be run, a log of what happened plus the error text is enough to classify.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os

from .capture.recorder import is_oom
from .records import Run, metric_role

_LOSS_NAMES = ("loss", "train_loss", "training_loss", "train/loss", "loss/train")
_STEP_NAMES = ("step", "global_step", "iteration", "iter", "batch")


def is_log_file(path: str) -> bool:
    """True for files this module can read (rather than a script to run)."""
    name = os.path.basename(path).lower()
    return (name.endswith((".csv", ".jsonl", ".ndjson", ".json")) or "tfevents" in name
            or (os.path.isdir(path) and bool(_event_files(path))))


def _event_files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "**", "*tfevents*"), recursive=True))


def _num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def _rows_to_run(rows: list[dict], error: str | None) -> Run:
    if not rows:
        raise ValueError("the log holds no rows")
    columns: list[str] = []
    for row in rows:  # eval rows may add columns that train rows lack
        columns += [c for c in row if c is not None and c not in columns]
    lower = {c.lower(): c for c in columns}
    loss_col = next((lower[n] for n in _LOSS_NAMES if n in lower), None)
    if loss_col is None:
        loss_col = next((c for c in columns if metric_role(c) == ("train", "loss")), None)
    step_col = next((lower[n] for n in _STEP_NAMES if n in lower), None)
    epoch_col = lower.get("epoch")
    events: list[dict] = [{"t": "start", "source": "log"}]
    for i, row in enumerate(rows):
        step = int(_num(row.get(step_col)) or i) if step_col else i
        epoch = int(_num(row.get(epoch_col)) or 0) if epoch_col else 0
        if loss_col is not None and _num(row.get(loss_col)) is not None:
            v = _num(row[loss_col])
            events.append({"t": "step", "i": step, "ep": epoch,
                           "loss": v if math.isfinite(v) else str(v)})
        for col in columns:
            if col in (loss_col, step_col, epoch_col):
                continue
            v = _num(row.get(col))
            if v is not None:
                events.append({"t": "metric", "name": col, "value": v if math.isfinite(v)
                               else str(v), "source": "log", "step": step, "epoch": epoch})
    if loss_col is None and not any(e["t"] == "metric" for e in events):
        raise ValueError(f"no numeric columns in the log (columns: {columns})")
    return _with_error(events, error)


def _with_error(events: list[dict], error: str | None) -> Run:
    if error:
        kind = "oom" if is_oom(RuntimeError(error)) or "resourceexhausted" in error.lower() \
            else "exception"
        type_, _, message = error.strip().partition(":")
        events.append({"t": "error", "kind": kind, "type": type_.strip()[-80:],
                       "message": message.strip() or error.strip(), "location": None})
    events.append({"t": "end", "status": "log", "seconds": 0.0})
    return Run(events)


def _tensorboard_rows(path: str) -> list[dict]:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise ValueError("reading TensorBoard event files needs the 'tensorboard' package "
                         "(pip install tensorboard)") from exc
    files = _event_files(path) if os.path.isdir(path) else [path]
    by_step: dict[int, dict] = {}
    for file in files:
        for event in EventFileLoader(file).Load():
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    x = float(value.simple_value)
                elif value.HasField("tensor"):
                    x = float(tensor_util.make_ndarray(value.tensor).reshape(-1)[0])
                else:
                    continue
                by_step.setdefault(int(event.step), {"step": int(event.step)})[value.tag] = x
    return [by_step[k] for k in sorted(by_step)]


def load_log(path: str, error: str | None = None) -> Run:
    """Read a loss/metrics log as a Run.

    Parameters
    ----------
    path : str
        A CSV file (header row), JSON lines (one object per line), a JSON list of objects, or a
        TensorBoard event file / folder of them. The training loss column is ``loss`` /
        ``train_loss`` (or any train-side ``*loss`` name); other numeric columns are metrics.
    error : str, optional
        Error text from the failing run (an OOM message makes it a memory issue).

    Raises
    ------
    ValueError
        When the file cannot be read as a log.
    """
    if not os.path.exists(path):
        raise ValueError(f"no such file: {path}")
    name = os.path.basename(path).lower()
    if "tfevents" in name or os.path.isdir(path):
        return _rows_to_run(_tensorboard_rows(path), error)
    with open(path, encoding="utf-8") as fh:
        if name.endswith(".csv"):
            rows = list(csv.DictReader(fh))
        elif name.endswith(".json"):
            data = json.load(fh)
            rows = data if isinstance(data, list) else (
                data.get("rows") if isinstance(data, dict) else None)
            if not isinstance(rows, list):
                raise ValueError(f"{path}: expected a list of objects (rows), "
                                 f"got {type(data).__name__}")
        else:
            rows = []
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected one object (row) per record")
    return _rows_to_run(rows, error)
