"""Minimal reproducers: turn a loss/metrics log (CSV, JSON lines, TensorBoard) into a Run.

When nothing can be run, a log of what happened plus the error text is enough to classify.
"""

from __future__ import annotations

import csv
import glob
import json
import math
import os
import re

from .capture.recorder import is_oom
from .records import Run, metric_role

_LOSS_NAMES = ("loss", "train_loss", "training_loss", "train/loss", "loss/train")
_STEP_NAMES = ("step", "global_step", "iteration", "iter", "batch")
INDEX_LIMIT = 2 ** 53  # step and epoch numbers: whole numbers 0 <= n < 2**53 (exact as floats)
MAX_DEPTH = 64  # JSON nesting a log may have (rows of scalars need 2 or 3)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[^\[\]{}]+")


def is_log_file(path: str) -> bool:
    """True for files this module can read (rather than a script to run)."""
    name = os.path.basename(path).lower()
    return (name.endswith((".csv", ".jsonl", ".ndjson", ".json")) or "tfevents" in name
            or (os.path.isdir(path) and bool(_event_files(path))))


def _event_files(path: str) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "**", "*tfevents*"), recursive=True))


def _num(v):
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    except OverflowError:  # an integer too large for a float
        return math.inf if v > 0 else -math.inf
    return x


def _index(row: dict, col: str | None, default: int, what: str, n: int, where: str) -> int:
    """The step/epoch of a row: a whole number ``0 <= n < 2**53``, else a clear ValueError."""
    if col is None or row.get(col) in (None, ""):
        return default
    x = _num(row[col])
    if x is None:
        return default  # not a number (a header repeated, a note): the row's position
    if not (math.isfinite(x) and 0 <= x < INDEX_LIMIT):
        raise ValueError(f"{where}row {n + 1}: the {what} column {col!r} holds {_short(row[col])}"
                         f"; it must be a whole number 0 <= {what} < 2**53")
    return int(x) or default


def _short(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rows_to_run(rows: list[dict], error: str | None, path: str | None = None) -> Run:
    where = f"{path}: " if path else ""
    if not rows:
        raise ValueError(f"{where}the log holds no rows")
    seen: dict = {}
    for row in rows:  # eval rows may add columns that train rows lack (linear: a dict)
        for c in row:
            if c is not None and c not in seen:
                seen[c] = None
    columns = [c for c in seen if isinstance(c, str)]
    lower = {c.lower(): c for c in columns}
    loss_col = next((lower[n] for n in _LOSS_NAMES if n in lower), None)
    if loss_col is None:
        loss_col = next((c for c in columns if metric_role(c) == ("train", "loss")), None)
    step_col = next((lower[n] for n in _STEP_NAMES if n in lower), None)
    epoch_col = lower.get("epoch")
    events: list[dict] = [{"t": "start", "source": "log"}]
    skip = {loss_col, step_col, epoch_col}
    metrics = [c for c in columns if c not in skip]
    for i, row in enumerate(rows):
        step = _index(row, step_col, i, "step", i, where)
        epoch = _index(row, epoch_col, 0, "epoch", i, where)
        if loss_col is not None and _num(row.get(loss_col)) is not None:
            v = _num(row[loss_col])
            events.append({"t": "step", "i": step, "ep": epoch,
                           "loss": v if math.isfinite(v) else str(v)})
        for col in metrics:
            v = _num(row.get(col))
            if v is not None:
                events.append({"t": "metric", "name": col, "value": v if math.isfinite(v)
                               else str(v), "source": "log", "step": step, "epoch": epoch})
    if loss_col is None and not any(e["t"] == "metric" for e in events):
        shown = ", ".join(map(repr, columns[:10])) + (", ..." if len(columns) > 10 else "")
        raise ValueError(f"{where}no numeric columns in the log (columns: {shown})")
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
        return _rows_to_run(_tensorboard_rows(path), error, path)
    try:
        with open(path, encoding="utf-8-sig", newline="" if name.endswith(".csv") else None) as fh:
            rows = _read_rows(fh, name, path)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected one object (row) per record")
    return _rows_to_run(rows, error, path)


def _read_rows(fh, name: str, path: str) -> list:
    if name.endswith(".csv"):
        reader = csv.DictReader(fh)
        try:
            return list(reader)
        except csv.Error as exc:  # e.g. a field over csv.field_size_limit() (128 KB)
            why = (f"a field is over {csv.field_size_limit() // 1024} KB"
                   if "field limit" in str(exc) else str(exc))
            raise ValueError(f"{path}:{reader.line_num}: not a CSV log ({why})") from None
    if name.endswith(".json"):
        data = _json(fh.read(), path, "document")
        rows = data if isinstance(data, list) else (
            data.get("rows") if isinstance(data, dict) else None)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a list of objects (rows), "
                             f"got {type(data).__name__}")
        return rows
    rows = []
    for n, line in enumerate(fh, 1):
        if line.strip():
            rows.append(_json(line, f"{path}:{n}", "object"))
    return rows


def _json(text: str, where: str, what: str):
    """Parse JSON, refusing nesting deeper than ``MAX_DEPTH`` before the parser recurses."""
    depth = 0
    brackets = _BRACKETS.sub("", _STRINGS.sub('""', text))  # brackets outside strings
    for ch in brackets:
        depth += 1 if ch in "[{" else -1
        if depth > MAX_DEPTH:
            raise ValueError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels; a log "
                             "holds rows of numbers")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        pos = f"line {exc.lineno} column {exc.colno}" if what == "document" else \
            f"column {exc.colno}"
        raise ValueError(f"{where}: not a JSON {what} ({exc.msg} at {pos})") from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer with too many digits
        raise ValueError(f"{where}: not a usable JSON log ({str(exc)[:120]})") from None
