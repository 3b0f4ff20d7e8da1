"""``early_stopping_mode`` on real Keras fits: a loss watched with ``mode="max"``.

``EarlyStopping(monitor="val_loss", mode="max", restore_best_weights=True)`` keeps the epoch
with the highest validation loss. The finding must be decisive, located where the callback
was made, and Classify must read the run as ``convergence_to_wrong_solution``; the twin
(``mode="min"``) must give neither.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import model_debugger
from model_debugger.probes import run_probes
from model_debugger.probing import build_context
from model_debugger.records import Run

HERE = os.path.abspath(__file__)


def line_of(tag: str) -> int:
    with open(HERE, encoding="utf-8") as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{tag}>"))


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_loss_watched_with_mode_max_keeps_the_worst_epoch(mode):
    pytest.importorskip("tensorflow")
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 6)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] ** 2 - x[:, 2] > 0.3).astype("float32")
    with model_debugger.capture() as rec:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
                      metrics=["accuracy"])
        stop = keras.callbacks.EarlyStopping(monitor="val_loss", mode=mode,  # <callback>
                                             patience=3, restore_best_weights=True)
        model.fit(x[:900], y[:900], validation_data=(x[900:], y[900:]), epochs=2,
                  batch_size=32, verbose=0)  # an earlier fit: its epochs are not the last's
        history = model.fit(x[:900], y[:900], validation_data=(x[900:], y[900:]), epochs=12,
                            batch_size=32, callbacks=[stop], verbose=0).history
    ctx = build_context(Run(rec.events), rec.keeper, {HERE: open(HERE, encoding="utf-8").read()},
                        budget=60.0)
    findings = run_probes(ctx, ["early_stopping_mode"]).findings
    if mode == "min":
        assert findings == () and "restored_wrong_way" not in ctx.signals
        assert ctx.classification.primary != "convergence_to_wrong_solution"
        return
    [f] = findings
    assert (f.root_cause, f.confirmed, f.evidence["decisive"]) == ("hyperparameter", True, True)
    assert f.evidence["restored_value"] > 1.05 * f.evidence["best_value"]
    assert f.evidence["restored_value"] == pytest.approx(
        history["val_loss"][f.evidence["restored_epoch"]], rel=1e-4)
    assert f.evidence["best_value"] == pytest.approx(min(history["val_loss"]), rel=1e-4)
    assert f.location["line"] == line_of("callback"), f.location
    assert ctx.classification.primary == "convergence_to_wrong_solution"


@pytest.mark.parametrize("name,direction", [
    ("val_loss", "min"), ("loss", "min"), ("val_mae", "min"), ("val_accuracy", "max"),
    ("val_sparse_categorical_accuracy", "max"), ("val_auc", "max"), ("rmse_skill_score", None),
    ("val_custom", None)])
def test_the_direction_a_monitored_name_says(name, direction):
    from model_debugger.signals import natural_direction

    assert natural_direction(name) == direction
