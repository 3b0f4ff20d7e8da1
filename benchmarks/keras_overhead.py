"""Overhead of ``model_debugger.capture()`` on Keras ``model.fit`` (TensorFlow backend, CPU).

The same ``fit`` runs bare and under ``capture()`` (default settings, record streamed to a file),
alternated in one process in rounds: bare, captured, captured, bare, ... so that load from other
processes on a shared machine hits both modes alike. Each round is one warm-up ``fit`` of one
epoch (it traces the train step: a capture retraces it with its probes, and the first fit after
a capture retraces it without them) and one timed ``fit`` of ``EPOCHS`` epochs whose wall time,
divided by its steps, is the round's seconds per step. Nothing but ``fit`` is timed, so the bare
mode has no callback of ours forcing a per-batch sync. Printed per model:

- the median seconds per step of each mode and their ratio;
- ``paired``: the median over pairs of rounds of (captured / bare) of adjacent rounds;
- ``one-off s``: the extra cost of the warm-up fit under capture (tracing with the probes).

    python benchmarks/keras_overhead.py            # 12 rounds per mode and model
    python benchmarks/keras_overhead.py --quick    # 4 rounds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_debugger  # noqa: E402

EPOCHS = 2


def mlp_setup():
    """784-512-256-10 MLP, batch 128, Adam, 32 steps per epoch."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128 * 32, 784)).astype("float32")
    return model, x, rng.integers(0, 10, len(x)), 128


def cnn_setup():
    """Two conv layers on 28x28x1 inputs, batch 64, SGD with momentum, 32 steps per epoch."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64 * 32, 28, 28, 1)).astype("float32")
    return model, x, rng.integers(0, 10, len(x)), 64


def one_round(model, x, y, batch: int, captured: bool, path: str) -> tuple[float, float]:
    """(warm-up seconds, timed seconds per step) of one round."""
    def fits():
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
        t1 = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=EPOCHS, verbose=0)
        t2 = time.perf_counter()
        return t1 - t0, (t2 - t1) / (EPOCHS * len(x) // batch)

    if not captured:
        return fits()
    with model_debugger.capture(path):
        return fits()


def bench(name: str, setup, rounds: int) -> dict:
    model, x, y, batch = setup()
    one_round(model, x, y, batch, False, "")  # load, first trace, allocator warm-up
    times = {False: [], True: []}
    warm = {False: [], True: []}
    order = [False, True, True, False] * ((rounds + 1) // 2)
    with tempfile.TemporaryDirectory() as tmp:
        for k, captured in enumerate(order[:2 * rounds]):
            w, s = one_round(model, x, y, batch, captured, os.path.join(tmp, f"r{k}.jsonl"))
            warm[captured].append(w)
            times[captured].append(s)
    pairs = [c / b for b, c in zip(times[False], times[True])]
    out = {"model": name, "bare_ms": 1000 * statistics.median(times[False]),
           "captured_ms": 1000 * statistics.median(times[True]),
           "paired": statistics.median(pairs),
           "one_off_s": statistics.median(warm[True]) - statistics.median(warm[False])}
    out["ratio"] = out["captured_ms"] / out["bare_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 rounds per mode")
    parser.add_argument("--rounds", type=int, default=12)
    ns = parser.parse_args()
    rounds = 4 if ns.quick else ns.rounds
    print(f"{'model':6} {'bare ms/step':>13} {'captured':>9} {'ratio':>6} {'paired':>7} "
          f"{'one-off s':>9}")
    for name, setup in (("mlp", mlp_setup), ("cnn", cnn_setup)):
        r = bench(name, setup, rounds)
        print(f"{r['model']:6} {r['bare_ms']:13.2f} {r['captured_ms']:9.2f} {r['ratio']:6.3f} "
              f"{r['paired']:7.3f} {r['one_off_s']:9.2f}")


if __name__ == "__main__":
    main()
