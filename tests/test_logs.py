"""Minimal reproducers: loss/metric logs (CSV, JSON lines, JSON, TensorBoard) and the CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from model_debugger import classify as C
from model_debugger.diagnose import diagnose_log
from model_debugger.logs import is_log_file, load_log
from model_debugger.session import DebugSession

OOM_TEXT = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rising(n: int = 40) -> np.ndarray:
    """A loss that climbs from 1 to 1e4."""
    return np.logspace(0, 4, n)


def _write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return str(path)


def _diagnose(path, root, error=None) -> DebugSession:
    s = diagnose_log(str(path), error, root=str(root / "sessions"))
    assert s.phase in ("isolate", "fix")  # Reproduce, Classify (and Isolate) recorded
    assert DebugSession.load(s.directory).report() == s.report()
    return s


def _cited(s: DebugSession) -> set[str]:
    return {e.signal for e in s.classification.evidence}


# -- loss explodes ---------------------------------------------------------------------------


def test_csv_loss_explosion_is_gradient_instability(tmp_path):
    loss = _rising()
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"],
                      [(i, f"{v:.6g}") for i, v in enumerate(loss)])
    run = load_log(path)
    assert len(run.steps) == len(loss)
    assert run.series("loss") == pytest.approx(loss, rel=1e-5)
    s = _diagnose(path, tmp_path)
    assert s.classification.primary == "gradient_instability"
    assert {"loss_initial", "loss_final"} <= _cited(s)
    rep = s.report()
    assert rep["reproduce"]["status"] == "reproduced"
    assert rep["reproduce"]["steps"] == len(loss)


def test_jsonl_loss_explosion_is_gradient_instability(tmp_path):
    rows = [{"step": i, "loss": float(v), "lr": 0.1} for i, v in enumerate(_rising())]
    path = _write_jsonl(tmp_path / "loss.jsonl", rows)
    s = _diagnose(path, tmp_path)
    assert s.classification.primary == "gradient_instability"
    assert {"loss_initial", "loss_final"} <= _cited(s)
    assert s.report()["reproduce"]["steps"] == len(rows)


def test_json_list_loss_explosion_is_gradient_instability(tmp_path):
    path = tmp_path / "history.json"
    path.write_text(json.dumps([{"iteration": i, "train_loss": float(v)}
                                for i, v in enumerate(_rising())]), encoding="utf-8")
    assert _diagnose(path, tmp_path).classification.primary == "gradient_instability"


def test_nan_in_log_is_gradient_instability(tmp_path):
    rows = [(i, "0.5") for i in range(20)] + [(20, "nan"), (21, "nan")]
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"], rows)
    s = _diagnose(path, tmp_path)
    assert s.classification.primary == "gradient_instability"
    assert "first_nonfinite_step" in _cited(s)


# -- overfitting -----------------------------------------------------------------------------


def _overfit_rows(epochs: int = 12, best: int = 4):
    train = 2.0 * 0.75 ** np.arange(epochs)
    val = np.concatenate([np.linspace(2.0, 1.0, best + 1),
                          1.0 + 3 * C.VAL_RISE * np.arange(1, epochs - best) / (epochs - best - 1)])
    return [(ep, f"{t:.6g}", f"{v:.6g}") for ep, (t, v) in enumerate(zip(train, val))]


def test_per_epoch_csv_with_rising_val_loss_is_overfitting(tmp_path):
    path = _write_csv(tmp_path / "history.csv", ["epoch", "train_loss", "val_loss"],
                      _overfit_rows())
    run = load_log(path)
    assert run.epochs == 12
    assert [name for name in run.metrics()] == ["val_loss"]
    s = _diagnose(path, tmp_path)
    assert s.classification.primary == "overfitting"
    assert {"val_loss_min", "val_loss_final", "val_loss_rise"} <= _cited(s)


def test_per_epoch_csv_with_falling_val_loss_is_healthy(tmp_path):
    rows = [(ep, f"{2 * 0.75 ** ep:.6g}", f"{2.2 * 0.8 ** ep:.6g}") for ep in range(12)]
    path = _write_csv(tmp_path / "history.csv", ["epoch", "train_loss", "val_loss"], rows)
    s = _diagnose(path, tmp_path)
    assert s.classification.primary == "healthy"
    assert s.report()["reproduce"]["status"] == "not_reproduced"


def test_jsonl_with_eval_rows_between_train_rows_reads_val_loss(tmp_path):
    """Trainer-style logs: train rows every step, an eval row with other keys each epoch."""
    rows = []
    train = 2.0 * 0.97 ** np.arange(120)
    val = [float(r[2]) for r in _overfit_rows()]
    for step, t in enumerate(train):
        rows.append({"step": step, "epoch": step // 10, "loss": float(t)})
        if step % 10 == 9:
            rows.append({"step": step, "epoch": step // 10, "val_loss": val[step // 10]})
    path = _write_jsonl(tmp_path / "trainer_log.jsonl", rows)
    run = load_log(path)
    assert len(run.steps) == 120
    assert "val_loss" in run.metrics(), "columns that first appear after row 0 are dropped"
    assert _diagnose(path, tmp_path).classification.primary == "overfitting"


# -- error text ------------------------------------------------------------------------------


def test_log_plus_oom_error_text_is_memory_issue(tmp_path):
    rows = [(i, f"{v:.6g}") for i, v in enumerate(np.linspace(2.0, 1.0, 30))]
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"], rows)
    s = _diagnose(path, tmp_path, error=OOM_TEXT)
    assert s.classification.primary == "memory_issue"
    assert "error" in _cited(s)
    err = load_log(path, OOM_TEXT).error
    assert err["kind"] == "oom"
    assert err["type"] == "RuntimeError"
    assert err["message"] == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert s.report()["reproduce"]["error"] == OOM_TEXT


def test_log_plus_other_error_text_is_not_memory_issue(tmp_path):
    rows = [(i, f"{v:.6g}") for i, v in enumerate(np.linspace(2.0, 1.0, 30))]
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"], rows)
    s = _diagnose(path, tmp_path, error="ValueError: Expected input batch_size (64) to match")
    assert s.classification.primary != "memory_issue"
    assert load_log(path, "ValueError: boom").error["kind"] == "exception"


# -- TensorBoard -----------------------------------------------------------------------------


def _tensorboard(log_dir, losses, val=None):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for step, v in enumerate(losses):
            writer.add_scalar("Loss/train", float(v), step)
        for epoch, v in enumerate(val or ()):
            writer.add_scalar("Loss/val", float(v), epoch)
    finally:
        writer.close()
    return log_dir


def test_tensorboard_event_file_is_read(tmp_path):
    loss = _rising(30)
    log_dir = _tensorboard(tmp_path / "tb", loss)
    files = [f for f in os.listdir(log_dir) if "tfevents" in f]
    assert len(files) == 1
    assert is_log_file(str(log_dir)) and is_log_file(str(log_dir / files[0]))
    for path in (log_dir, log_dir / files[0]):
        run = load_log(str(path))
        assert [s["i"] for s in run.steps] == list(range(30))
        assert run.series("loss") == pytest.approx(loss, rel=1e-5)
    s = _diagnose(log_dir / files[0], tmp_path)
    assert s.classification.primary == "gradient_instability"


def test_tensorboard_sparse_validation_tag_is_read(tmp_path):
    """Validation logged once per epoch at steps where no train loss exists yet is still read."""
    from torch.utils.tensorboard import SummaryWriter

    log_dir = tmp_path / "tb"
    writer = SummaryWriter(log_dir=str(log_dir))
    for step in range(50):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    for epoch, v in enumerate([1.0, 0.8, 0.9, 1.1, 1.3]):
        writer.add_scalar("val_loss", v, 10 * epoch + 9)
    writer.close()
    run = load_log(str(log_dir))
    assert len(run.steps) == 50
    assert [v for _, _, v in run.metrics().get("val_loss", [])] == \
        pytest.approx([1.0, 0.8, 0.9, 1.1, 1.3])


# -- unreadable logs -------------------------------------------------------------------------


def test_no_numeric_columns_raises_value_error(tmp_path):
    path = _write_csv(tmp_path / "notes.csv", ["name", "comment"],
                      [("run1", "diverged"), ("run2", "ok")])
    with pytest.raises(ValueError, match="no numeric columns") as info:
        load_log(path)
    assert "name" in str(info.value) and "comment" in str(info.value)


def test_malformed_jsonl_raises_value_error_with_line(tmp_path):
    path = tmp_path / "loss.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": \n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"loss\.jsonl:2: not a JSON object"):
        load_log(str(path))


def test_jsonl_with_non_object_rows_raises_value_error(tmp_path):
    path = tmp_path / "loss.jsonl"
    path.write_text("1.0\n0.9\n", encoding="utf-8")
    with pytest.raises(ValueError, match="one object"):
        load_log(str(path))


def test_empty_csv_raises_value_error(tmp_path):
    path = _write_csv(tmp_path / "empty.csv", ["step", "loss"], [])
    with pytest.raises(ValueError, match="no rows"):
        load_log(path)


def test_missing_log_raises_value_error(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_log(str(tmp_path / "missing.csv"))


@pytest.mark.parametrize("text", ["5", '"loss"', "null"])
def test_json_scalar_raises_value_error(tmp_path, text):
    path = tmp_path / "metrics.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError):
        load_log(str(path))


def test_unreadable_log_makes_no_session(tmp_path):
    path = _write_csv(tmp_path / "notes.csv", ["name"], [("x",)])
    with pytest.raises(ValueError):
        diagnose_log(path, root=str(tmp_path / "sessions"))
    assert not (tmp_path / "sessions").exists()


# -- CLI -------------------------------------------------------------------------------------


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "model_debugger.cli", *args], cwd=str(cwd),
                          capture_output=True, text=True, timeout=60, env=env)


def _strict_json(text: str):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


@pytest.mark.parametrize("options_first", [False, True], ids=["LOG-then-options",
                                                              "options-then-LOG"])
def test_cli_diagnose_log_json(tmp_path, options_first):
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"],
                      [(i, f"{v:.6g}") for i, v in enumerate(_rising())])
    root = tmp_path / "sessions"
    options = ["--json", "--root", str(root)]
    args = [*options, path] if options_first else [path, *options]
    proc = _cli("diagnose", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    report = _strict_json(lines[0])
    assert isinstance(report, dict)
    assert report["schema"] == "model_debugger.report/1"
    assert report["classification"]["primary"] == "gradient_instability"
    assert report["phase"] == "isolate"
    assert report["fix_allowed"] is False
    saved = [n for n in os.listdir(root) if not n.startswith(".")]  # .gitignore beside it
    assert len(saved) == 1
    assert DebugSession.load(str(root / saved[0])).classification.primary == \
        "gradient_instability"


def test_cli_diagnose_log_with_error_text(tmp_path):
    path = _write_csv(tmp_path / "loss.csv", ["step", "loss"],
                      [(i, f"{2 - i / 30:.6g}") for i in range(30)])
    proc = _cli("diagnose", "--json", "--error", OOM_TEXT, "--root", str(tmp_path / "s"), path,
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _strict_json(proc.stdout)["classification"]["primary"] == "memory_issue"


def test_cli_missing_file_fails_with_message(tmp_path):
    missing = tmp_path / "nope.csv"
    proc = _cli("diagnose", "--json", "--root", str(tmp_path / "s"), str(missing), cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "no such file" in proc.stderr and "nope.csv" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


def test_cli_unreadable_log_fails_with_message(tmp_path):
    path = _write_csv(tmp_path / "notes.csv", ["name"], [("x",)])
    proc = _cli("diagnose", "--json", "--root", str(tmp_path / "s"), path, cwd=tmp_path)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert "no numeric columns" in proc.stderr
    assert "Traceback" not in proc.stderr
